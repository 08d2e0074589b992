"""tpu_nb's exceptions: one base type, so the layers above can show any of them as one line.

Every message says what is wrong and ends with the exact fix ("Fix: ..."). Catch `TpuNbError`
for all of them, or one of its three kinds:

    TpuNbError
    ├── TpuNbUsageError     the call itself is wrong: an argument, a value, an order of calls
    ├── EnvironmentProblem  this machine or install cannot do it: torch/torch_xla, the device
    └── RuntimeStateError   this process's state forbids it now: the XLA runtime already
                            started, a run already in progress or already stopped, launched
                            replicas that did not finish; often fixed by a restart

Every raise names its kind; the three only classify, so `except TpuNbError` catches them all.
What the user's own code did wrong at run time has its own types under TpuNbError
(RecompilationError, ReplicaError, ReplicaCrash, CollectiveRefused). Numbers the user passes
(counts, seconds) are checked by `check_whole_number` and `check_seconds` below, the one
validator behind every API argument and magic option.
"""


class TpuNbError(Exception):
    """A mistake the user can fix: the message says what is wrong and the exact fix."""


class TpuNbUsageError(TpuNbError):
    """The call is wrong: a bad argument or value, or calls in the wrong order."""


class EnvironmentProblem(TpuNbError):
    """The machine or the install cannot do it: missing or mismatched torch/torch_xla, no
    such device, a platform torch_xla 2.9 no longer supports."""


class RuntimeStateError(TpuNbError):
    """The process's current state forbids it: the XLA runtime has already started (settings
    are latched), or another run is in progress. Often fixed by restarting the kernel."""


# The same mistake reads the same everywhere: "<name> must be a whole number from 1 to 10,000;
# got 0. Fix: e.g. <name>=3." bool is refused (True is an int to Python, never meant as a
# count), and NaN by the comparisons (it compares false with every bound).


def check_whole_number(
    value,
    name: str,
    *,
    low: int = 1,
    high: int | None = None,
    fix: str,
    alternative: str | None = None,
    shown: str | None = None,
) -> int:
    """`value` if it is a whole number from `low` to `high` (no upper bound when None), else a
    TpuNbUsageError: "`name` must be [`alternative` or ]a whole number ...; got ... Fix: `fix`."
    `shown` is what to quote as the value given (a magic's option text), by default its repr."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < low
        or (high is not None and value > high)
    ):
        span = f"from {low} to {high:,}" if high is not None else f"of at least {low}"
        raise TpuNbUsageError(
            f"{name} must be {_either(alternative)}a whole number {span}; "
            f"got {shown if shown is not None else repr(value)}. Fix: {fix}."
        )
    return value


def check_seconds(
    value,
    name: str,
    *,
    low: float,
    high: float,
    fix: str,
    above_low: bool = False,
    alternative: str | None = None,
    shown: str | None = None,
) -> float:
    """`value` as float seconds if it is a finite number from `low` (or above it, when
    `above_low`) to `high`, else a TpuNbUsageError worded as check_whole_number's."""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    within = number and (low < value if above_low else low <= value) and value <= high
    if not within:  # NaN fails both comparisons
        span = f"above {low:g} and at most {high:g}" if above_low else f"from {low:g} to {high:g}"
        raise TpuNbUsageError(
            f"{name} must be {_either(alternative)}a number of seconds {span}; "
            f"got {shown if shown is not None else repr(value)}. Fix: {fix}."
        )
    return float(value)


def check_stream(stream, caller: str):
    """Where a launch sends its workers' lines: `stream` if it is a function, a function that
    drops them for None, else a TpuNbUsageError (before anything starts: a non-function
    would fail at the first line, with the workers already running)."""
    if stream is None:
        return _drop_line
    if not callable(stream):
        raise TpuNbUsageError(
            f"stream must be a function taking one line of output; got "
            f"{type(stream).__name__} {stream!r:.40}. Fix: {caller}(..., stream=print) "
            "(the default), or stream=None to not show the output"
        )
    return stream


def _drop_line(line: str) -> None:
    pass


def _either(alternative: str | None) -> str:
    return f"{alternative} or " if alternative else ""


WEEK = 7 * 24 * 3600  # the longest wait a timeout may ask for, in seconds


def check_given(value, name: str, check, **bounds):
    """`check(value, name, **bounds)` for a number given as a number or as a command line's
    text ("4", "0.5"): text is read as the number it spells, and a mistake quotes it as typed."""
    if not isinstance(value, str):
        return check(value, name, **bounds)
    try:
        number: int | float | str = int(value) if check is check_whole_number else float(value)
    except ValueError:
        number = value
    return check(number, name, shown=repr(value), **bounds)
