"""How tpu_nb writes quantities: one format for times everywhere (reports, dashboard, graphs).

    format_seconds(0.000054) -> "54.0 µs";  0.4266 -> "427 ms";  1.1 -> "1.10 s"

Three significant digits, the unit chosen so the number is between 1 and 1000 (seconds grow
past that). tools/nbval-sanitize.cfg masks exactly this shape: a number, a space, the unit.
"""

from __future__ import annotations

_UNITS = ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs"))


def format_seconds(seconds: float | None) -> str:
    """A duration in s, ms or µs with three significant digits; "-" when unknown."""
    if seconds is None:
        return "-"
    if seconds <= 0:
        return "0 s"
    if seconds >= 100:
        return f"{seconds:.0f} s"
    for scale, unit in _UNITS:
        value = seconds / scale
        if value >= 1 or unit == "µs":
            text = _three_digits(value)
            if text == "1000" and unit != "s":  # 999.7 ms rounds up to the next unit
                return "1.00 " + _UNITS[_UNITS.index((scale, unit)) - 1][1]
            return f"{text} {unit}"
    return f"{seconds:.3g} s"


def _three_digits(value: float) -> str:
    if value >= 99.95:
        return f"{value:.0f}"
    if value >= 9.995:
        return f"{value:.1f}"
    if value >= 0.9995:
        return f"{value:.2f}"
    return f"{value:.3f}"
