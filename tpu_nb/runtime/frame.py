"""`Frame`: one Python frame (file, line, function), the foundation both the compile log and
`sources` describe code places with; and `walk_stack`, the one way to read another thread's
stack without keeping its tensors alive. A foundation: imports nothing of tpu_nb."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType
from typing import TypeVar

T = TypeVar("T")
M = TypeVar("M")


@dataclass(frozen=True)
class Frame:
    """One Python frame: where in the user's code (or a library) something happened."""

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.function} ({self.file}:{self.line})"


# -- another thread's stack ------------------------------------------------------------------
#
# A frame object holds its function's locals alive once the function has returned. A thread that
# walks another thread's stack (the host sampler, a pod host's progress line, the interrupt
# watcher) can lose the GIL mid-walk; if the walked thread then returns from a function and
# syncs, the tensors that function computed would still be alive — pending — and join the
# sync's graph as extra outputs: a different graph, one more compile, caused by tpu_nb. So every
# such walk holds `_walking`, drops every frame before it lets go, and a sync first waits for a
# walk in progress (`settle_walks`).

_walking = threading.Lock()


class StackWalkError(RuntimeError):
    """A walk of another thread's stack failed; the message only (no traceback: it would keep
    the walked frames alive)."""


def walk_stack(thread_id: int, visit: Callable[[FrameType], T], missing: M) -> T | M:
    """`visit(frame)` on the innermost frame of thread `thread_id` (`missing` when the thread
    has none). `visit` must return no frame; no frame is referenced once this returns."""
    failure = ""
    with _walking:
        frame = sys._current_frames().get(thread_id)
        try:
            return missing if frame is None else visit(frame)
        except Exception as exc:  # its traceback holds the frames: keep only the words
            failure = f"{type(exc).__name__}: {exc}"
        finally:
            del frame
    raise StackWalkError(failure)


def settle_walks() -> None:
    """Wait until no other thread holds a frame of a stack it walks (before a sync)."""
    if _walking.locked():  # ~0.03 us; taking the free lock costs ~0.17 us, at every sync
        with _walking:
            pass


# -- a frame's variables -----------------------------------------------------------------------

_SNAPSHOTS = sys.version_info < (3, 13)  # f_locals is a write-through view from 3.13 on
_CO_OPTIMIZED = 0x0001  # a function's frame: its variables live outside any dict


def frame_variables(frame: FrameType) -> dict:
    """The variables of `frame`: a module's (or class body's) namespace as it is, a function's
    as a copy. Before Python 3.13 reading a function frame's `f_locals` leaves a snapshot dict
    on the frame that holds every value it saw until the function returns or reads it again:
    a tensor the function has since rebound would stay alive (memory the same code without
    tpu_nb frees; a pending tensor joining the next sync's graph). The snapshot is emptied
    once copied; the function's own variables are untouched (a `locals()` dict the function
    keeps is refreshed by its next `locals()` call)."""
    values = frame.f_locals
    if values is frame.f_globals or not frame.f_code.co_flags & _CO_OPTIMIZED:
        return values
    copy = dict(values)
    # While a trace or profile function runs in a thread, CPython writes each frame's snapshot
    # back into its variables after every event: an emptied snapshot would delete them.
    if _SNAPSHOTS and not _tracing and sys.gettrace() is None and sys.getprofile() is None:
        values.clear()
    return copy


_tracing = 0  # threads with a profile function of tpu_nb's (any thread's frames may be read)


def tracing(delta: int) -> None:
    """Count a profile function of tpu_nb's in some thread in (+1) or out (-1): while any runs,
    `frame_variables` leaves the frames' snapshots as they are."""
    global _tracing
    _tracing += delta
