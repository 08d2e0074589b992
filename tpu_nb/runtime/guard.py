"""`max_graphs(n)`: fail as soon as a region traces more than n distinct graphs.

torch_xla's recompilation guard (the dynamic-shape detector behind
`torch_xla.compile(max_different_graphs=n)`) compares the traces of successive calls of one
session. Here each step between two syncs is one call, and steps are grouped by the line
that syncs them: at every sync the session is renewed under that line's name, so the steps of
a loop are compared with each other (set-up code before the loop is not), and a loop whose
batch shape changes fails at the line that traced the new graph. The guard's "Got/Expected"
message becomes a RecompilationError that says what differed.
"""

from __future__ import annotations

import itertools
import os
import re
import sys
from contextlib import contextmanager
from typing import Iterator

from tpu_nb.runtime._xla import xla
from tpu_nb.runtime.errors import TpuNbError

_MARK = "Maximum number of different graphs allowed per function exceeded"
_ids = itertools.count()


class RecompilationError(TpuNbError):
    """More distinct graphs than allowed were traced (raised by `max_graphs`)."""

    def __init__(self, limit: int, got: str, expected: list[str]):
        self.limit, self.got, self.expected = limit, _node(got), [_node(e) for e in expected]
        earlier = " or ".join(self.expected) or "something else"
        super().__init__(
            f"more than {limit} distinct graph{'s' if limit != 1 else ''} traced "
            f"(max_graphs={limit}): this step traced {self.got} where earlier steps traced "
            f"{earlier}. Fix: keep shapes and Python values in the step fixed (pad or bucket "
            "the batch), or allow more graphs.")


def _node(text: str) -> str:
    # "[] aten::mm, xla_shape=f32[3,8]{1,0}, dynamic_dims: ()" -> "aten::mm f32[3,8]"
    op = re.search(r"(\w+::\w+)", text)
    shape = re.search(r"xla_shape=(\w+\[[^\]]*\])", text)
    parts = [p.group(1) for p in (op, shape) if p]
    return " ".join(parts) if parts else (text.strip() or "a different op")


def as_recompilation_error(exc: BaseException, limit: int) -> RecompilationError | None:
    """The readable error for torch_xla's guard violation, or None for any other error."""
    text = str(exc)
    if _MARK not in text:
        return None
    got = re.search(r"Got:(.*)", text)
    tail = text.split("Expected", 1)[1] if "Expected" in text else ""
    expected = re.findall(r"^\s*-\s*(.*)$", tail, flags=re.M)
    if not expected and (single := re.match(r"\s*:(.*)", tail)):
        expected = [single.group(1)]
    return RecompilationError(limit, got.group(1) if got else "", expected)


def _sync_site() -> str:
    """file:line of the user code that called the sync now running (called in a closure)."""
    frame = sys._getframe(2)
    library = tuple(os.path.dirname(getattr(sys.modules.get(m), "__file__", "") or "") + os.sep
                    for m in ("torch_xla", "torch", "tpu_nb"))
    while frame is not None and frame.f_code.co_filename.startswith(library):
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame else "?"


@contextmanager
def max_graphs(limit: int) -> Iterator[None]:
    """Raise RecompilationError when the steps of the block trace more than `limit` graphs."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise TpuNbError(f"max_graphs needs a whole number of at least 1; got {limit!r}. "
                         "Fix: e.g. max_graphs(2) (a training loop's first step often traces "
                         "its own graph, so allow 2 or more).")
    torch_xla = xla()
    from torch_xla.core import xla_model

    xc = torch_xla._XLAC
    prefix = f"tpu_nb-{next(_ids)}"
    sessions = {f"{prefix}:start"}
    state = {"active": True}

    def renew():
        if state["active"]:
            session = f"{prefix}:{_sync_site()}"
            sessions.add(session)
            xc._dynamic_shape_detector_end_session()
            xc._dynamic_shape_detector_start_session(session)
            xla_model.add_step_closure(renew)

    torch_xla.sync()                     # work pending from before is not this block's
    saved = xc._dynamic_shape_detector_get_max_different_graphs()
    xc._dynamic_shape_detector_set_max_different_graphs(limit)
    xc._dynamic_shape_detector_start_session(f"{prefix}:start")
    xla_model.add_step_closure(renew)
    try:
        yield
    except RuntimeError as exc:
        readable = as_recompilation_error(exc, limit)
        if readable is None:
            raise
        raise readable.with_traceback(exc.__traceback__) from None
    finally:
        state["active"] = False
        xc._dynamic_shape_detector_end_session()
        for session in sessions:
            xc._dynamic_shape_detector_remove_session(session)
        xc._dynamic_shape_detector_set_max_different_graphs(saved)
