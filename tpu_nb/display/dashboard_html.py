"""The dashboard's HTML and text, as pure functions of a `LiveState`, a status and a title:
none holds state, starts a thread or touches a widget (display/dashboard.py does), so tests
call them on a state directly."""

from __future__ import annotations

from html import escape

from tpu_nb.display import style
from tpu_nb.display.anatomy_view import panel_html as anatomy_panel_html
from tpu_nb.display.live_charts import CHART_SIZES, compiled_count, with_picture
from tpu_nb.runtime.live import LiveState
from tpu_nb.runtime.metrics import CompileEvent
from tpu_nb.runtime.sources import place_text
from tpu_nb.runtime.tracking import (
    HOST_READ_HINT,
    HOST_READ_NO_SYNC_HINT,
    fallback_hint,
    reads_repeat,
)
from tpu_nb.runtime.units import format_seconds

_SHOWN_EVENTS = 8  # compile events listed in the final panel (newest first)
_SHOWN_LIVE = 5  # ... and in the live one, whose height is reserved
# Panel heights reserved from the first paint (the live view must not jump as rows and lines
# arrive): the top row fits 5 compile rows, the bottom row a fallback with its hint.
_TOP_HEIGHT, _BOTTOM_HEIGHT = "178px", "96px"
_ANATOMY_HEIGHT = "236px"  # the step anatomy: bar, a two-line legend, timeline, two-line verdict
# Theme colours (CSS variables with light fallbacks; display/style.py sets them per theme).
_RED, _RED_BG, _GREY = style.RED, style.RED_BG, style.MUTED
_FONT = style.FONT
_PANEL = (
    f"{style.ROOT};border:1px solid {style.LINE};border-radius:4px;padding:4px 8px;"
    "margin:2px;overflow:hidden;flex:1 1 auto"
)


def _panel(title: str, body: str, *, alert: bool = False, height: str = "") -> str:
    css = (
        _PANEL
        + (f";border:2px solid {_RED};background:{_RED_BG}" if alert else "")
        + (f";min-height:{height}" if height else "")
    )
    # class tpunb: the theme's colour variables apply inside (display/style.py)
    return f"<div class='tpunb' style='{css}'><b>{escape(title)}</b><br>{body}</div>"


def _bytes(n: int | None) -> str:
    if n is None:
        return "?"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def header_html(
    state: LiveState | None,
    status: str,
    title: str,
    elapsed: float | None = None,
    *,
    stylesheet: bool = True,
) -> str:
    """The title line; present tense while running, past tense once stopped.

    elapsed: the run's wall time, when the caller measured it (the dashboard: from the end of
    its start to its stop, the span of the cell's code like the report's wall time).
    stylesheet: lead with the theme's stylesheet (the live view sends it once, elsewhere: the
    header changes at every refresh)."""
    steps = state.steps if state is not None else 0
    if elapsed is None and state is not None:
        elapsed = state.elapsed
    running = status in ("running", "ready")
    colour = {"running": style.OK, "finished": style.ACCENT}.get(status, _RED)
    recompiled = state is not None and state.recompiling
    alert = (
        f" <b style='color:{_RED}'>{'RECOMPILING' if running else 'RECOMPILED'}</b>"
        if recompiled
        else ""
    )
    counted = (
        f"sync <span class='tpunb-steps'>{steps}</span> · {format_seconds(elapsed)}"
        if running
        else f"<span class='tpunb-steps'>{steps}</span> syncs in {format_seconds(elapsed)}"
    )
    return (
        f"{style.STYLE if stylesheet else ''}<div class='tpunb' style='{style.ROOT}'>"
        f"<b>{escape(title)}</b> "
        f"<span style='color:{colour}' class='tpunb-status'>{escape(status)}</span> · "
        f"{counted}{alert}</div>"
    )


def alert_html(state: LiveState | None) -> str:
    if state is None or not state.recompiling:
        return ""
    parts = []
    for alert in state.alerts:
        if alert.settled:
            continue
        how = {
            "recorded": "the graphs read just before they compiled",
            "graphs": "captured graphs of its next syncs",
            "Dynamo": "the guard Dynamo saw fail when it compiled the function again",
        }.get(alert.source, "its compile-log blocks (counts and sizes; the ops are not logged)")
        lines = "".join(f"<li>{escape(line)}</li>" for line in alert.differs)
        fix = (
            "call torch_xla.sync() at the end of each step, so each step runs the same graph"
            if alert.growing
            else "keep shapes, dtypes and Python values in the step fixed (pad or bucket "
            "batches; pass changing scalars as tensors)"
        )
        parts.append(
            f"<div><b style='color:{_RED}'>Recompilation: {escape(alert.describe())}</b><br>"
            f"what differs between its graphs, from {escape(how)}:"
            f"<ul style='margin:2px 0 2px 1.2em;padding:0'>{lines}</ul>"
            f"what to do: {escape(fix)}</div>"
        )
    css = f"{_PANEL};border:2px solid {_RED};background:{_RED_BG}"
    return f"<div class='tpunb' style='{css}'>{''.join(parts)}</div>"


def compile_html(state: LiveState, final: bool = False) -> str:
    m = state.metrics
    head = (
        f"graphs compiled <b>{m.compiles}</b> ({format_seconds(m.compile_seconds)}) · "
        f"cache hits <b>{m.cache_hits}</b>"
    )
    rows = []
    shown = _SHOWN_EVENTS if final else _SHOWN_LIVE
    for c in reversed(state.compiles[-shown:]):
        secs = format_seconds(c.seconds) if c.seconds is not None else "compiling"
        if c.event is None:
            rows.append(_row(f"#{c.index}", "cause unknown", "", "", secs))
            continue
        rows.append(
            _row(
                f"#{c.index}",
                escape(place_text(c.place)),
                f"<span title='{escape(c.event.cause)}'>{escape(_short_cause(c.event))}</span>",
                f"<code style='font-size:inherit'>{escape(c.event.graph_hash[:8])}</code>",
                secs,
            )
        )
    body = head
    if rows:
        # The monitor keeps the last compiles only: count the earlier ones by number.
        earlier = compiled_count(state.compiles) - len(rows)
        more = f"<br><span style='color:{_GREY}'>… {earlier} earlier</span>" if earlier else ""
        head_row = _row("#", "line", "cause", "graph", "time", tag="th")
        body += (
            "<table style='border-collapse:collapse;font-size:11px;margin:2px 0;"
            "color:inherit;border:none;background:none'>"
            f"{head_row}{''.join(rows)}</table>{more}"
        )
    if m.compiles and not state.compile_analysis:
        body += (
            f"<br><span style='color:{_GREY}'>compile causes unknown: run %tpu_setup "
            "(tpu_nb.setup()) before the first compile to record them</span>"
        )
    return _panel("Compiles", body, alert=state.recompiling, height=_TOP_HEIGHT)


# Inline styles: notebook front ends restyle bare tables (JupyterLab right-aligns cells).
_CELL = (
    "text-align:left;padding:0 8px 0 0;border:none;background:none;vertical-align:top;"
    "color:inherit;font-size:inherit;line-height:1.35"
)


def _row(*cells: str, tag: str = "td") -> str:
    return (
        "<tr style='background:none'>"
        + "".join(f"<{tag} style='{_CELL}'>{cell}</{tag}>" for cell in cells)
        + "</tr>"
    )


_CAUSES = {
    "sync": "sync",
    "value-access": "value read",
    "dynamo": "dynamo",
    "compile": "torch_xla.compile",
}


def _short_cause(event: CompileEvent) -> str:
    """A few words for the table (the full cause is the cell's tooltip)."""
    short = _CAUSES.get(event.kind)
    if short is not None:
        return short
    return event.cause if len(event.cause) <= 24 else event.cause[:23] + "\u2026"


def execution_html(state: LiveState, final: bool = False) -> str:
    m = state.metrics
    if state.step_median is not None:
        measured = "" if final else f", {state.steps_measured} measured"
        steps = (
            f"step time median <b>{format_seconds(state.step_median)}</b> · p90 "
            f"<b>{format_seconds(state.step_p90)}</b><br><span style='color:{_GREY}'>"
            f"device-synced: between step completions{measured}</span>"
        )
    else:
        steps = (
            f"<span style='color:{_GREY}'>step time: no step completed"
            f"{'' if final else ' yet'}</span>"
        )
    per_second = state.execution_rate
    if final and state.elapsed > 0:
        per_second = m.executions / state.elapsed
    rate = f"{per_second:.1f}/s" if per_second < 100 else f"{per_second:.0f}/s"
    body = (
        f"syncs <b>{state.steps}</b> <span style='color:{_GREY}' title='torch_xla.sync() "
        "and mark_step calls: one per training step, plus any sync tpu_nb adds at the "
        "end of a cell'>"
        + (
            f"({state.steps - state.loader_syncs} steps; {state.loader_syncs} no steps: a "
            "loader's with nothing to run or before its first batch, a library's logging)"
            if state.loader_syncs
            else "(torch_xla.sync calls: one per training step)"
        )
        + "</span><br>"
        f"executions <b>{m.executions}</b> · {rate}"
        f"{' on average' if final else ''}<br>{steps}<br>"
        f"on device {format_seconds(m.execute_seconds)}"
    )
    return _panel("Execution", body, height=_TOP_HEIGHT)


def transfers_html(state: LiveState) -> str:
    m = state.metrics
    body = (
        f"to device <b>{m.to_device_transfers}</b> ({format_seconds(m.to_device_seconds)})<br>"
        f"to host <b>{m.from_device_transfers}</b> ({format_seconds(m.from_device_seconds)})"
    )
    return _panel("Transfers", body, height=_TOP_HEIGHT)


def fallbacks_html(state: LiveState) -> str:
    m = state.metrics
    if m.fallbacks:
        fall = "".join(
            f"<code>aten::{escape(op)}</code> ran on the CPU <b>{n}</b>\u00d7<br>"
            f"<span style='color:{_GREY}'>{escape(fallback_hint(op))}</span><br>"
            for op, n in sorted(m.fallbacks.items())
        )
    else:
        fall = "CPU fallbacks: none<br>"
    reads = f"{_SCALAR_READS} <b>{m.host_reads}</b>"
    per_step = _per_step_reads(state)
    if per_step and state.reads_cost_little:
        reads += f"<br>{escape(_in_the_loop(per_step, state))}, {escape(state.reads_cost_little)}"
    elif per_step:
        reads += (
            f"<br>{_in_the_loop(per_step, state)}<br>"
            f"<span style='color:{_GREY}'>{escape(_read_hint(state))}</span>"
        )
    return _panel("CPU fallbacks and scalar reads", f"{fall}{reads}", height=_BOTTOM_HEIGHT)


_SCALAR_READS = "scalar reads (.item(), bool(), float())"


def _per_step_reads(state: LiveState) -> int:
    """The scalar reads that earn the read advice (0: none do): those that repeat with the
    steps (a read after the loop, a few values printed or reads in step closures need no
    change). The dashboard sees counts, not which step made each read, so a count that keeps
    pace with the steps stands for "per step" while the run goes; once a tracked run ended,
    its report's judgement (which knows each read's site and steps) decides."""
    if state.per_step_reads is not None:
        return state.per_step_reads
    in_loop = state.metrics.host_reads - state.closure_reads  # a step closure's read is the fix
    steps = state.steps - state.loader_syncs  # a loader's syncs with nothing to run: no steps
    return in_loop if steps >= 3 and reads_repeat(in_loop, steps) else 0


def _read_hint(state: LiveState) -> str:
    """The report's hint for per-step reads, for a loop with syncs or without (as it says)."""
    return HOST_READ_HINT if state.steps - state.loader_syncs else HOST_READ_NO_SYNC_HINT


def _in_the_loop(reads: int, state: LiveState) -> str:
    closures = f", {state.closure_reads} more in step closures" if state.closure_reads else ""
    steps = state.steps - state.loader_syncs
    among = f"in {steps} steps" if steps else "with no sync in between"
    return f"{reads} {among}{closures}"


def memory_html(state: LiveState) -> str:
    mem = state.memory
    if mem.device_note:
        device = f"<span style='color:{_GREY}'>{escape(mem.device_note)}</span>"
    else:
        device = f"device used <b>{_bytes(mem.device_used)}</b> of {_bytes(mem.device_limit)}" + (
            f" · peak {_bytes(mem.device_peak)}" if mem.device_peak is not None else ""
        )
    host = f"host RSS <b>{_bytes(mem.host_rss)}</b> · peak {_bytes(mem.host_peak)}"
    cost = state.run_cost
    lines = "".join(f"<br>{escape(line)}" for line in (cost.lines() if cost else ()))
    title = "Memory; cost per step" if cost else "Memory"
    return _panel(title, f"{device}<br>{host}{lines}", height=_BOTTOM_HEIGHT)


def caption_html(text: str) -> str:
    return f"<div class='tpunb' style='{_FONT};font-size:11px;color:{_GREY}'>{escape(text)}</div>"


# The charts' captions (HTML beside the charts, live and final).
STEP_CAPTION = (
    "step time (ms, log scale) over steps: median (solid) and p90 (dashed) per "
    "refresh; red lines: compiles"
)
COMPILE_CAPTION = "compile seconds per graph (the last 10)"


def _counter_panels(state: LiveState | None, final: bool = False) -> list[str]:
    """The counters' panels, in the order both views show them (their titles only before
    the first poll)."""
    if state is None:
        titles = ("Compiles", "Execution", "Transfers", "CPU fallbacks and scalar reads", "Memory")
        return [
            _panel(t, "-", height=_BOTTOM_HEIGHT if i > 2 else _TOP_HEIGHT)
            for i, t in enumerate(titles)
        ]
    return [
        compile_html(state, final),
        execution_html(state, final),
        transfers_html(state),
        fallbacks_html(state),
        memory_html(state),
    ]


# The live view's two rows: each panel's share of its row (they wrap below ~1000 px); the
# final view's one row: each panel's flex-grow weight.
_LIVE_ROWS = (("42%", "31%", "24%"), ("63%", "34%"))
_FINAL_GROW = (2, 1, 1, 2, 1)


def live_panels_html(
    state: LiveState | None, status: str, title: str, elapsed: float | None = None
) -> str:
    """The live view's header, alert and counters' panels as one block (one widget update
    per refresh). Heights are reserved, so the view does not jump as rows arrive."""
    panels = iter(_counter_panels(state))
    rows = "".join(
        "<div style='display:flex;flex-wrap:wrap'>"
        + "".join(
            f"<div style='display:flex;width:{width};min-width:240px'>{next(panels)}</div>"
            for width in row
        )
        + "</div>"
        for row in _LIVE_ROWS
    )
    return header_html(state, status, title, elapsed, stylesheet=False) + alert_html(state) + rows


def anatomy_html(state: LiveState | None) -> str:
    """The step anatomy panel: the anatomy the monitor published (display/anatomy_view.py)."""
    body = anatomy_panel_html(state.anatomy if state is not None else None)
    if state is not None and state.anatomy is None and state.steps > state.loader_syncs:
        # Steps ran, but outside a tracked run: "no step yet" would be false.
        body = (
            f"<span style='color:{_GREY}'>no step anatomy: only a tracked run that starts "
            "inside the dashboard (%%on_tpu, tpu_nb.track()) times its steps' parts</span>"
        )
    return _panel("where the steps' time went", body, height=_ANATOMY_HEIGHT)


def static_html(
    state: LiveState | None,
    status: str,
    title: str,
    svgs: dict[str, str] | None = None,
    error: BaseException | None = None,
    elapsed: float | None = None,
    anatomy: str = "",
) -> str:
    """The final (or any) state as one self-contained HTML block, with the SVG charts in
    `svgs` ("step", "compile"; without them, no charts)."""
    svgs = svgs or {}

    def chart(name: str, caption: str) -> str:
        """A chart with its caption (none without the chart), as wide as the chart at most:
        the caption wraps at its width, so the two charts fit side by side. The chart comes
        with its picture, shown where a sanitizer strips the SVG (`with_picture`)."""
        svg = svgs.get(name)
        if not svg:
            return ""
        return (
            f"<div style='margin:2px 6px 2px 0;width:{CHART_SIZES[name][0]}px;max-width:100%'>"
            f"{caption_html(caption)}{with_picture(svg)}</div>"
        )

    row = "display:flex;flex-wrap:wrap;align-items:stretch"
    panels = _counter_panels(state, final=True)
    broken = ""
    if error is not None:
        broken = (
            f"<div style='{_FONT};color:{_RED}'>the dashboard stopped updating: "
            f"{escape(type(error).__name__)}: {escape(str(error)[:300])}</div>"
        )
    # The live view reserves panel heights (no jumps while it updates); the final one is
    # drawn once and needs no reserve.
    for height in (_TOP_HEIGHT, _BOTTOM_HEIGHT):
        panels = [p.replace(f";min-height:{height}", "") for p in panels]
    anatomy = anatomy.replace(f";min-height:{_ANATOMY_HEIGHT}", "")
    return (
        f"<div class='tpunb tpunb-dashboard' style='{style.ROOT};padding:0'>"
        f"{header_html(state, status, title, elapsed)}{broken}"
        f"{alert_html(state)}<div style='{row}'>"
        + "".join(
            f"<div style='flex:{grow} 1 {240 * grow}px;display:flex'>{p}</div>"
            for p, grow in zip(panels, _FINAL_GROW, strict=True)
        )
        + "</div>"
        + anatomy
        + f"<div style='{row}'>{chart('step', STEP_CAPTION)}"
        f"{chart('compile', COMPILE_CAPTION)}</div></div>"
    )


def summary_text(
    state: LiveState | None,
    status: str,
    title: str = "XLA dashboard",
    error: BaseException | None = None,
) -> str:
    """Counts and findings, no timings: the same text for the same work on every run."""
    if state is None:
        return f"{title} ({status})"
    m = state.metrics
    lines = [
        f"{title} ({status}): {state.steps - state.loader_syncs} steps, {m.executions} executions, "
        f"{m.compiles} graphs compiled, {m.cache_hits} cache hits, "
        f"{sum(m.fallbacks.values())} CPU fallbacks, {m.host_reads} scalar reads"
    ]
    for c in state.compiles[-_SHOWN_EVENTS:]:
        if c.event is not None:
            lines.append(
                f"  compiled graph {c.event.graph_hash[:8]} at {place_text(c.place)}: "
                f"{c.event.cause}"
            )
    for alert in state.alerts:
        if alert.settled:
            lines.append(f"  {alert.describe()}")
            continue
        lines.append(f"  RECOMPILATION ALERT: {alert.describe()}; what differs:")
        lines += [f"    {line}" for line in alert.differs]
    for op, n in sorted(m.fallbacks.items()):
        lines.append(f"  CPU fallback aten::{op} x{n}: {fallback_hint(op)}")
    per_step = _per_step_reads(state)
    if per_step:
        why = (
            f", {state.reads_cost_little}" if state.reads_cost_little else f": {_read_hint(state)}"
        )
        lines.append(f"  {_SCALAR_READS}: {_in_the_loop(per_step, state)}{why}")
    if error is not None:
        lines.append(f"  the dashboard stopped updating: {type(error).__name__}")
    return "\n".join(lines)
