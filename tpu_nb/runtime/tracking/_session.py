"""`on_tpu()`: what `%%on_tpu` does around a cell, for any code — a notebook cell or a script.

    with tpu_nb.on_tpu("epoch") as report:
        train_one_epoch()
    print(report)              # metrics, compile events, and findings placed on lines

It composes, in this order: `track()` (metrics, compile events, the recorded sites of syncs,
reads and CPU fallbacks), `default_device()` (the block's own factories and the modules it
builds on the XLA device), `max_graphs(n)` when asked, and IR source locations when asked.
On exit the report carries `findings`: what each line of the block did (see _attribution.py).
The `%%on_tpu` magic is this plus the live dashboard and the display.
"""

from __future__ import annotations

import linecache
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

from tpu_nb.runtime.sources import caller
from tpu_nb.runtime.tracking._report import RunReport
from tpu_nb.runtime.tracking._run import track


@dataclass(eq=False, repr=False, kw_only=True)
class on_tpu:
    """Run a block the way `%%on_tpu` runs a cell; yields its RunReport, complete on exit.

    name: the report's name. code: the block's own code objects (a cell's compiled code);
    default: the function that entered the block. source/filename: the block's source and
    the file it was compiled as, to place findings on its lines (default: the entering
    function's file, read with linecache). namespace: the dict the block's variables live
    in (a notebook's user namespace; default: the entering function's frame), to name work
    left pending. sync: False (default) leaves work the block did not run pending, as the
    same code without tpu_nb does, and reports what is left; True runs it at the end with a
    sync of tpu_nb's own (see `track`). max_graphs: fail at the step that makes a line
    compile more than this many graphs. locations: record each IR node's Python line (for
    the graph viewer; ~0.6 us per traced op). device: the default device (default:
    tpu_nb.device()). assigned_in: names where a variable was last assigned ("In [12]"),
    for work earlier cells left pending.
    """

    name: str | None = field(default=None, kw_only=False)
    code: tuple = ()
    source: str | None = None
    filename: str | None = None
    namespace: dict | None = None
    sync: bool = False
    max_graphs: int | None = None
    locations: bool = False
    device: Any = None
    assigned_in: Any = None

    def __post_init__(self) -> None:
        self.code = tuple(self.code)
        self._stack: ExitStack | None = None
        self._run: Any = None

    def __enter__(self) -> RunReport:
        from tpu_nb.runtime.environment._defaults import default_device
        from tpu_nb.runtime.environment._device import device as xla_device
        from tpu_nb.runtime.tracking._guard import max_graphs

        code = self.code or (caller().f_code,)
        if self.filename is None:
            self.filename = code[0].co_filename
        guard = (
            max_graphs(self.max_graphs) if self.max_graphs is not None else None
        )  # checked first
        dev = self.device if self.device is not None else xla_device()  # may set up the process
        source = self.source
        source = source if source is not None else "".join(linecache.getlines(self.filename))
        stack = ExitStack()
        try:
            where = self.namespace if self.namespace is not None else caller()
            self._run = track(
                self.name,
                sync=self.sync,
                code=code,
                namespace=where,
                assigned_in=self.assigned_in,
                source=source,
                filename=self.filename,
                allowed_graphs=self.max_graphs or 1,
            )
            report = stack.enter_context(self._run)
            stack.enter_context(default_device(dev, code=code))
            if guard is not None:
                stack.enter_context(guard)
            if self.locations:
                from tpu_nb.runtime.graph._capture import record_locations

                stack.enter_context(record_locations())
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        return report

    def holds(self, value) -> None:
        """The block's value (a cell's last expression, which IPython shows after the
        report): its pending work is named with the variables' as the block ends."""
        if self._run is not None:
            self._run.value = value

    def __exit__(self, exc_type, exc, tb) -> bool:
        __tracebackhide__ = True  # noqa: F841
        stack, self._stack = self._stack, None
        suppressed = stack.__exit__(exc_type, exc, tb) if stack is not None else False
        return bool(suppressed)
