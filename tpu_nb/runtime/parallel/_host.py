"""One host of a pod launch: the Ray actor that runs the cell (or function) on its host.

The launch (`_hosts.py`) starts one per host; this module runs in that host's Ray worker
process, which is new and serves only this launch. `prepare()` gives the process its own run
directory (the compile log, torch's temp files), sets up the XLA runtime for the host and
imports torch_xla; `start()` runs the work in a thread of its own under tpu_nb's tracking and
returns at once; `poll()` hands back what the work printed since the last poll, its progress
(syncs, the cell line it is at) and, at the end, its result. Every method returns quickly, so
the launch can poll, stop and clean up a host whatever its work is doing. Ray is not imported
here: the launch wraps the class with `ray.remote`.
"""

from __future__ import annotations

import io
import linecache
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Any

from tpu_nb.runtime.backend import current as backend
from tpu_nb.runtime.environment import _private_files as private_files
from tpu_nb.runtime.frame import StackWalkError, walk_stack
from tpu_nb.runtime.parallel._results import SyncTimes, user_traceback

RUN_PREFIX = "tpu_nb-host-"
SAME_INSTALL = (
    "install the same tpu_nb, torch and torch_xla on every host of the slice "
    '(pip install "tpu_nb[pod]")'
)


class _Capture(io.TextIOBase):
    """sys.stdout/sys.stderr of the host process while the work runs: kept until polled."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.parts: list[str] = []

    def write(self, text: str) -> int:
        with self.lock:
            self.parts.append(text)
        return len(text)

    def take(self) -> str:
        with self.lock:
            text, self.parts = "".join(self.parts), []
        return text


class HostWorker:
    """The actor of one host (see the module docstring)."""

    def __init__(self) -> None:
        self.rundir = ""
        self.host = self.hosts = 0
        self.thread: threading.Thread | None = None
        self.capture = _Capture()
        self.result: dict | None = None
        self.sync_times: SyncTimes | None = None
        self.filename = ""
        # Its own reader of the compile log (the tracked run has another): what compiled
        # while the work runs, for the launch to compare hosts before the run ends.
        self.live_log: Any = None  # a metrics.CompileLog
        self.live_offset = 0

    def prepare(self, host: int, hosts: int, device: str) -> dict:
        """{} when ready; `error` and `fix` when the host cannot start (the launch stops)."""
        private_files.sweep_dead_runs(RUN_PREFIX)
        self.host, self.hosts = host, hosts
        self.rundir = tempfile.mkdtemp(prefix=f"{RUN_PREFIX}{os.getpid()}-")
        # Temp files of torch and torch_xla go into the run directory, removed with it.
        os.environ["TMPDIR"] = tempfile.tempdir = self.rundir
        os.environ["TPU_NB_HOST_INDEX"], os.environ["TPU_NB_HOST_COUNT"] = str(host), str(hosts)
        from tpu_nb.runtime.environment import setup

        chosen = "unknown"
        try:
            env = setup(device, debug_file=os.path.join(self.rundir, "compile-analysis.log"))
            chosen = env.pjrt_device or ""
            # Starting the device here, not in the work's thread: a device that cannot start
            # (no libtpu, a broken install) is one clear error before any host runs the work.
            backend().devices.device()
        except Exception as exc:
            return _start_failure(exc, device, chosen)
        return {}

    def start(self, work, started_at: float) -> None:
        """Run `work` (fn, args, source, filename) in a thread; poll() reports on it."""
        from tpu_nb.runtime.metrics import CompileLog, compile_log

        log = compile_log()
        if log is not None:
            self.live_log = CompileLog.following(log)
            self.live_offset = self.live_log.size()
        self.filename = work[3]
        self.thread = threading.Thread(
            target=self._run, args=(work, started_at), name="tpu_nb-host", daemon=True
        )
        self.thread.start()

    def poll(self) -> dict:
        """Once the work is done, its run directory is removed."""
        done = self.thread is not None and not self.thread.is_alive()
        report = {
            "output": self.capture.take(),
            "syncs": len(self.sync_times.times) if self.sync_times is not None else 0,
            "line": self._current_line(),
            "graphs": self._new_graphs(),
            "result": self.result if done else None,
        }
        if done:
            self.cleanup()
        return report

    def cleanup(self) -> None:
        """Remove the run directory (the launch calls it before stopping a host early)."""
        if self.rundir:
            shutil.rmtree(self.rundir, ignore_errors=True)

    def _new_graphs(self) -> list[tuple[int, str]]:
        """(cell line, graph hash) of the graphs compiled since the last poll, from the
        compile log's frames (the outermost frame in the cell); line 0 when none is."""
        log = self.live_log
        if log is None:
            return []
        try:
            events = log.events_since(self.live_offset)
        except Exception:  # the log is a help here, never a failure of the run
            return []
        if events:
            self.live_offset = events[-1].offset + 1
        out = []
        for event in events:
            lines = [f.line for f in event.frames if f.file == self.filename]
            out.append((lines[-1] if lines else 0, event.graph_hash))
        return out

    # -- the work, in its thread ---------------------------------------------------------------

    def _current_line(self) -> int:
        """The line of the cell (or function) the work is running now; 0 when not in it."""
        thread = self.thread
        if thread is None or thread.ident is None or not self.filename:
            return 0
        filename = self.filename

        def outermost(frame) -> int:
            from tpu_nb.runtime.sources import outermost_frame

            cell = outermost_frame(frame, lambda f: f.f_code.co_filename == filename)
            return cell.f_lineno if cell is not None else 0  # the outermost frame of the cell

        try:
            return walk_stack(thread.ident, outermost, 0)
        except StackWalkError:
            return 0

    def _run(self, work, started_at: float) -> None:
        fn, args, source, filename = work
        result: dict = {"host": self.host, "pid": os.getpid()}
        result["started_seconds"] = time.time() - started_at
        stdout, stderr = sys.stdout, sys.stderr
        sys.stdout = sys.stderr = self.capture
        try:
            self._tracked(fn, args, source, filename, result)
        except BaseException as exc:  # tracking itself failed: still one result, never a
            # traceback printed from this thread and a launch missing the host's figures
            result.setdefault("error", f"{type(exc).__name__}: {exc}")
            result.setdefault("traceback", user_traceback(exc, __file__))
        finally:
            sys.stdout, sys.stderr = stdout, stderr
            self.result = result

    def _tracked(self, fn, args, source, filename, result: dict) -> None:
        from tpu_nb.runtime.parallel._cell import CellFunction
        from tpu_nb.runtime.tracking import track

        self.sync_times = syncs = SyncTimes(backend())
        cell = isinstance(fn, CellFunction)
        codes = fn.compiled() if cell else (fn.__code__,)
        if not cell and source:  # tracebacks show the function's lines on this host too
            linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        start = time.perf_counter()
        report = None
        try:
            with track(f"host {self.host}", code=codes) as report:
                if cell:
                    value = fn.run(codes, self.host, host=self.host, hosts=self.hosts)
                else:
                    value = fn(self.host, *args)
                syncs.counting = False
            result["value"] = _sendable(value, result)
        except BaseException as exc:  # the host's own error: reported, the launch stops all
            syncs.counting = False
            result["error"] = f"{type(exc).__name__}: {exc}"
            result["traceback"] = user_traceback(exc, __file__)
        result["wall_seconds"] = time.perf_counter() - start
        result["step_seconds"] = syncs.steps(start)
        result["syncs"] = len(syncs.times)
        if report is not None and report.complete:
            _report_facts(report, filename, result)


def _start_failure(exc: BaseException, asked: str, chosen: str) -> dict:
    """Why this host could not start, and the fix, as data for the launch."""
    said = str(exc).strip().splitlines()
    error = f"{type(exc).__name__}: {said[0] if said else ''}".rstrip(": ")
    why = f"device {asked!r}" + (f" chose {chosen}" if chosen and asked == "auto" else "")
    fix = SAME_INSTALL
    if chosen == "TPU":
        fix = (
            "install the TPU runtime on every host (pip install 'torch_xla[tpu]'), or run "
            "the hosts on their CPUs: PJRT_DEVICE=CPU in their environment, or "
            "%tpu_setup --device cpu (tpu_nb.setup('cpu')) before the launch"
        )
    return {"error": f"{error} ({why})", "fix": fix}


def _sendable(value, result: dict):
    """`value` if it can travel back to the notebook, else None with the reason."""
    import cloudpickle

    try:
        cloudpickle.dumps(value)
    except Exception as exc:
        result["value_error"] = f"{type(exc).__name__}: {exc}"
        return None
    return value


def _report_facts(report, filename: str, result: dict) -> None:
    """What the launch compares across hosts, as plain data: counters, the verdict, and each
    compiled graph with its line and the pending graph captured before it."""
    from tpu_nb.runtime.parallel._pod import GraphRecord
    from tpu_nb.runtime.tracking import store

    result["metrics"] = report.metrics
    result["compile_analysis"] = report.compile_analysis
    anatomy = report.anatomy
    verdict = getattr(anatomy, "verdict", None)
    if verdict is not None:
        result["verdict"], result["verdict_kind"] = str(verdict), verdict.kind

    def line_of(event) -> int:
        frame = event.site.line if event.site is not None else event.user_frame
        return frame.line if frame is not None and frame.file == filename else 0

    result["graphs"] = tuple(
        GraphRecord(line_of(e), e.graph_hash, e.inputs, e.outputs, store.captured_graph(e))
        for e in report.compile_events
    )
