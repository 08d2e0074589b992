"""Say at once that an interrupt was received when torch_xla cannot stop yet.

Python runs a SIGINT handler only between bytecodes of the main thread. During a torch_xla
compile or execution the main thread is inside C++ (tens of seconds for a big graph), so the
KeyboardInterrupt comes only when that call returns, and the cell looks frozen meanwhile.

The C-level signal handler does run at once, and writes the signal number to the file
descriptor given to `signal.set_wakeup_fd`. While a cell runs, a watcher thread blocks on that
pipe; when an interrupt has not reached Python after a short grace period, it writes one line
to the cell's own output stream (captured when the cell started; the thread is started and
joined inside the cell, so the line can only land in that cell, while it runs).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from operator import attrgetter

from tpu_nb.runtime.backend import current as backend
from tpu_nb.runtime.frame import walk_stack

GRACE_SECONDS = 0.3  # an interrupt Python handles within this needs no message
XLA_BUSY = (
    "interrupt received: torch_xla finishes the current compile or execution first "
    "(it cannot be cut short); the cell stops right after"
)
NATIVE_BUSY = (
    "interrupt received: the cell stops when the running native call returns (a "
    "torch_xla compile or execution cannot be cut short)"
)


class InterruptNotice:
    """pre/post_run_cell hooks: armed only while a cell runs with torch_xla imported."""

    def __init__(self) -> None:
        self._watch: _Watch | None = None

    def pre_run_cell(self, info=None) -> None:
        if self._watch is not None or not backend().process.is_loaded():
            return
        previous = signal.getsignal(signal.SIGINT)
        # Signals go to the main thread only; SIG_IGN/DFL: leave them.
        if threading.current_thread() is threading.main_thread() and callable(previous):
            self._watch = _Watch(sys.stdout, previous)

    def post_run_cell(self, result=None) -> None:
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.stop()


class _Watch:
    """One cell's watcher: the wakeup pipe, the SIGINT handler that counts, the thread."""

    def __init__(self, stream, previous_handler):
        self.stream = stream
        self.previous_handler = previous_handler
        self.handled = 0  # interrupts that reached Python
        self.main = threading.main_thread().ident
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.write_fd, False)  # set_wakeup_fd requires it
        self.previous_fd = signal.set_wakeup_fd(self.write_fd, warn_on_full_buffer=False)
        signal.signal(signal.SIGINT, self._on_sigint)
        self.thread = threading.Thread(
            target=self._run, name="tpu_nb-interrupt-notice", daemon=True
        )
        self.thread.start()

    def _on_sigint(self, signum, frame):
        self.handled += 1
        return self.previous_handler(signum, frame)

    def _run(self) -> None:
        received, told = 0, False
        while True:
            data = os.read(self.read_fd, 64)
            if not data:  # write end closed: the cell ended
                return
            self._forward(data)
            received += data.count(bytes([signal.SIGINT]))
            if told or received == 0:
                continue
            time.sleep(GRACE_SECONDS)
            if self.handled < received:  # Python has not seen it: native code runs
                self._say(self._message())
                told = True

    def _forward(self, data: bytes) -> None:
        """The wakeup fd that was set before (an event loop's) still gets every byte."""
        if self.previous_fd >= 0:
            with contextlib.suppress(OSError):  # that loop closed its end: nothing to wake
                os.write(self.previous_fd, data)

    def _message(self) -> str:
        """XLA_BUSY when the main thread waits in a call made from the backend (torch_xla,
        torch) or tpu_nb's own wrappers (sync, a value read); otherwise the call is not known
        to be XLA's (a tensor method called straight from user code, or another library)."""
        top = walk_stack(self.main, attrgetter("f_code.co_filename"), "")
        packages = (*backend().packages, "tpu_nb")
        xla = any(f"{os.sep}{package}{os.sep}" in top for package in packages)
        return XLA_BUSY if xla else NATIVE_BUSY

    def _say(self, line: str) -> None:
        # a closed stream must not kill the watcher silently mid-cell
        with contextlib.suppress(Exception):
            self.stream.write(line + "\n")
            self.stream.flush()

    def stop(self) -> None:
        if signal.getsignal(signal.SIGINT) == self._on_sigint:
            signal.signal(signal.SIGINT, self.previous_handler)
        try:
            signal.set_wakeup_fd(self.previous_fd)
        except (ValueError, OSError):  # that fd was closed meanwhile
            signal.set_wakeup_fd(-1)
        os.close(self.write_fd)  # the thread reads EOF and ends
        self.thread.join(timeout=2)
        os.close(self.read_fd)
