"""A cell body run the way %%time runs it, and cells named as IPython names them ("In [3]")."""

from __future__ import annotations

import ast
import os
import re
from types import FrameType

from tpu_nb.runtime.sources import caller, innermost_frame, numbered_traceback, short_path
from tpu_nb.runtime.units import format_place


def _running_cell_number(shell, files: dict[str, int]) -> int:
    """The execution number of the cell running this magic: the cell file of the nearest
    calling frame. (`shell.execution_count` is already the next cell's number on IPython >= 8
    while a cell runs, which made tracebacks say In [n+1].)"""

    def number(frame: FrameType) -> int | None:
        return cell_number(shell, files, frame.f_code.co_filename)

    cell = innermost_frame(caller(), lambda frame: number(frame) is not None)
    found = number(cell) if cell is not None else None
    return found if found is not None else shell.execution_count


def assigned_in(shell, before: int, name: str) -> str | None:
    """The latest cell before `before` that assigns `name` ("In [12]"), from the raw input
    history; magic and shell lines are read as blank lines."""
    from tpu_nb.runtime.tracking import assigned_lines

    raw = shell.history_manager.input_hist_raw
    for number in range(min(before, len(raw)) - 1, 0, -1):
        lines = [
            "" if ln.lstrip().startswith(("%", "!")) else ln for ln in raw[number].splitlines()
        ]
        if assigned_lines("\n".join(lines), name):
            return f"In [{number}]"
    return None


class CellCode:
    """A cell body compiled the way %%time runs it: statements, then the last expression.

    The body is registered with IPython's compiler under the cell's execution number, so
    tracebacks say "Cell In[n], line k" with k the line in the whole cell (the magic line is 1).
    """

    def __init__(self, shell, body: str, magic_lines: int = 1, *, files: dict[str, int]):
        self.source = "\n" * magic_lines + shell.transform_cell(body)
        self.number = _running_cell_number(shell, files)
        self.filename = shell.compile.cache(self.source, self.number, raw_code=self.source)
        files[self.filename] = self.number
        # Registered AST transformers run, as for any cell (IPython's own run_cell does this).
        tree = shell.transform_ast(ast.parse(self.source, filename=self.filename))
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        self.statements = shell.compile(tree, self.filename, "exec")
        self.expression = shell.compile(last, self.filename, "eval") if last else None
        # The cell's own code: what tpu_nb places findings on and gives the default device.
        self.codes = (self.statements, self.expression)

    def run(self, shell):
        __tracebackhide__ = True  # noqa: F841  (IPython hides this frame in tracebacks)
        try:
            exec(self.statements, shell.user_global_ns, shell.user_ns)
            if self.expression is not None:
                return eval(self.expression, shell.user_global_ns, shell.user_ns)
        except BaseException as exc:
            exc.with_traceback(numbered_traceback(exc.__traceback__))
            raise
        return None


def cell_number(shell, files: dict[str, int], path: str) -> int | None:
    """The execution number of the cell IPython compiled into the file `path`; None for any
    other file. `files`: the cell files IPython keeps no map of, noted by the watcher."""
    names = getattr(shell.compile, "_filename_map", {})  # IPython >= 8
    number = names.get(path)
    if number is None:  # IPython 7 under ipykernel 6: temp files, noted by the watcher
        number = files.get(path)
    if number is None and os.sep not in path:  # a bare name (IR debug's locations)
        known = [*names.items(), *files.items()]
        number = next((n for f, n in known if os.path.basename(f) == path), None)
    if number is None and (match := re.match(r"<ipython-input-(\d+)-", path)):
        number = int(match.group(1))  # IPython 7
    return number


def cell_name(shell, files: dict[str, int], path: str) -> str | None:
    """'In [3]' for the file IPython compiled cell 3 into (labels say the cell, not a
    temp file); None for any other file."""
    number = cell_number(shell, files, path)
    return f"In [{number}]" if number is not None else None


def last_change():
    """`%xla_graph --diff`: the later of the two latest graphs of the line that changed last,
    its diff (drawn as its changed nodes outlined inside their groups, its modules under
    --graph) and the line; (None, None, "") after saying why when no line changed."""
    from tpu_nb.runtime.tracking import store

    found = store.last_change()
    if found is None:
        print(
            "nothing to compare: no line has captured two different graphs in a tracked run "
            "(%%on_tpu) yet"
        )
        return None, None, ""
    (path, line), before, after = found
    return after, after.diff(before), format_place(short_path(path), line)
