"""How tpu_nb writes quantities: one format for times and one for places, everywhere (reports,
dashboard, graphs, errors).

    format_seconds(0.000054) -> "54.0 µs";  0.4266 -> "427 ms";  1.1 -> "1.10 s"
    format_seconds(3.2e-12) -> "3.20 ps" (a toy step's roofline time on a TPU)
    format_place("In [3]", 7) -> "In [3], line 7";  format_place("train.py", 7) -> "train.py:7"

and the one percentile the step figures (median, p90) are computed with.

Three significant digits, the unit chosen so the number is between 1 and 1000 (seconds grow
past that). tools/nbval-sanitize.cfg masks exactly this shape: a number, a space, the unit.
"""

from __future__ import annotations

# Down to picoseconds: a toy step's roofline time on a TPU is well under a nanosecond, and
# "0.000 µs" would read as free.
_UNITS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns"), (1e-12, "ps"))


def format_seconds(seconds: float | None) -> str:
    """A duration in s, ms, µs, ns or ps with three significant digits; "-" when unknown."""
    if seconds is None:
        return "-"
    if seconds <= 0:
        return "0 s"
    if seconds >= 100:
        return f"{seconds:.0f} s"
    for scale, unit in _UNITS:
        value = seconds / scale
        if value >= 1 or unit == "ps":
            text = _three_digits(value)
            if text == "1000" and unit != "s":  # 999.7 ms rounds up to the next unit
                return "1.00 " + _UNITS[_UNITS.index((scale, unit)) - 1][1]
            return f"{text} {unit}"
    return f"{seconds:.3g} s"


def _three_digits(value: float) -> str:
    for bound, decimals in ((99.95, 0), (9.995, 1), (0.9995, 2)):
        if value >= bound:
            return f"{value:.{decimals}f}"
    return f"{value:.3f}"


def format_place(where: str, line: int) -> str:
    """A line of a file named for people (`sources.short_path`): a notebook cell reads as
    "In [3], line 7", as IPython's tracebacks say it; any other file as "train.py:7"."""
    return f"{where}, line {line}" if where.startswith("In [") else f"{where}:{line}"


def percentile(sorted_values, q: float) -> float:
    """The q-quantile (0..1) of already sorted values, interpolated between neighbours."""
    if not sorted_values:
        raise ValueError("no values")
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)
