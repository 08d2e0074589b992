"""Reading a magic's line: its arguments, and the library's checks as IPython's one-line
UsageError (no traceback), as IPython shows user mistakes."""

from __future__ import annotations

import functools
import shlex
from collections.abc import Iterator
from contextlib import contextmanager

from IPython.core.error import UsageError
from IPython.utils.process import arg_split

from tpu_nb.runtime.errors import TpuNbError, check_given, check_seconds, check_whole_number


def parse(magic, line: str, *, code: bool = False):
    """Parse a magic's line; None after printing the help for -h/--help.

    Options-only magics split the line as a shell does, so quotes are removed and a quoted
    path may hold spaces; magics taking Python code (code=True) keep the quotes, which belong
    to the code. Every mistake is a one-line UsageError.
    """
    name = "%" + magic.__name__
    try:
        argv = shlex.split(line) if not code else arg_split(line, posix=False, strict=True)
    except ValueError as exc:  # shlex: "No closing quotation"
        raise UsageError(
            f"{name}: cannot split {line.strip()!r} into arguments ({exc}). "
            f"Fix: close the quote (a path with spaces goes in matching quotes: "
            f"'my dir')."
        ) from None
    try:
        args = magic.parser.parse_args(argv)
    except UsageError as exc:  # argparse's message, e.g. unknown argument
        text = str(exc).rstrip(".")
        raise UsageError(
            f"{name}: {text}" if "Fix:" in text else f"{name}: {text}. Fix: see {name} --help."
        ) from None
    except SystemExit:  # argparse's exit on a bad value
        raise UsageError(
            f"{name}: could not parse arguments {line!r}. Fix: see {name} --help."
        ) from None
    if getattr(args, "help", False):
        print(magic.parser.format_help())
        return None
    return args


def _checked(check, option: str, low: float, high: float, example: float):
    """An argparse type: an option's text checked by the library's validator; its message
    raised as UsageError, which argparse lets through (it catches only its own kinds), so it
    reads as the library's."""
    fix = f"e.g. {option} {example:g}"

    def parse(text: str):
        with user_mistake():
            return check_given(text, option, check, low=low, high=high, fix=fix)

    return parse


# A whole number from low to high (a huge number would otherwise reach torch_xla's C++ and
# fail there), and finite seconds from low to high (NaN and inf are refused).
whole = functools.partial(_checked, check_whole_number)
seconds = functools.partial(_checked, check_seconds)


@contextmanager
def user_mistake(magic: str = "") -> Iterator[None]:
    """A TpuNbError from setting up a magic (not from the user's code) is a one-line
    UsageError, prefixed with the magic's name when given."""
    try:
        yield
    except TpuNbError as exc:
        raise UsageError(f"{magic}: {exc}" if magic else str(exc)) from None


def evaluate_tensors(shell, source: str):
    """%xla_graph EXPR: the expression's value, which must hold an XLA tensor (a value without
    any is a mistake, not 'nothing pending')."""
    import torch

    from tpu_nb.runtime.graph import walk_limited

    try:
        value = shell.ev(source)
    except Exception as exc:
        detail = " ".join(str(exc).split())
        raise UsageError(
            f"could not evaluate {source!r}: {type(exc).__name__}: {detail}. Fix: give an "
            "expression of this kernel, e.g. %xla_graph loss"
        ) from None
    if isinstance(value, torch.Tensor) and value.device.type != "xla":
        raise UsageError(
            f"{source} is a tensor on {value.device}, which has no pending graph "
            f"(only XLA tensors are lazy). Fix: %xla_graph a tensor on the XLA "
            f"device, e.g. one made with .to(tpu_nb.device())."
        )
    if next(walk_limited(value, torch, depth=4, seen=set(), budget=[100_000]), None) is None:
        kind = type(value).__name__
        shown = " ".join(repr(value).split())[:40]  # one line, whatever the repr
        raise UsageError(
            f"{source} is of type {kind} ({shown}), not an XLA tensor nor "
            f"anything holding one. Fix: %xla_graph loss (tensors, a module or a "
            f"list of them), or %xla_graph alone for every tensor with pending "
            f"work."
        )
    return value
