"""Reports as text and HTML: the environment, a run (a cell), metrics, device timings.

Each view object has `_repr_html_` for notebooks and a plain-text `__repr__` for terminals and
nbval. Output is deterministic apart from timings, hashes and cell file names, which
tools/nbval-sanitize.cfg masks. Every string from user code or the runtime is escaped.
"""

from __future__ import annotations

from html import escape

from tpu_nb.runtime.attribution import LineFinding
from tpu_nb.runtime.environment import Environment
from tpu_nb.runtime.metrics import MetricsDelta, MetricsSnapshot
from tpu_nb.runtime.timing import DeviceTiming
from tpu_nb.runtime.tracking import RunReport

_STYLE = ("<style>.tpunb{font-family:var(--jp-code-font-family,monospace);font-size:12px}"
          ".tpunb table{border-collapse:collapse;margin:2px 0}"
          ".tpunb td,.tpunb th{padding:1px 8px;text-align:left;vertical-align:top;"
          "border-bottom:1px solid #8883}.tpunb .err{color:#c62828;font-weight:bold}"
          ".tpunb .warn{color:#b26a00;font-weight:bold}.tpunb .ok{color:#2e7d32}"
          ".tpunb summary{cursor:pointer}.tpunb code{white-space:pre-wrap}</style>")


def _table(rows, header=None) -> str:
    head = ("<tr>" + "".join(f"<th>{escape(str(h))}</th>" for h in header) + "</tr>"
            if header else "")
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>"
                   for row in rows)
    return f"<table>{head}{body}</table>"


def _seconds(value: float) -> str:
    if value >= 1:
        return f"{value:.2f} s"
    if value >= 1e-3:
        return f"{value * 1e3:.1f} ms"
    return f"{value * 1e6:.0f} us"


# -- environment ------------------------------------------------------------------------------

class EnvironmentView:
    """`%tpu_setup`'s report: an HTML table in notebooks, text in a terminal."""

    def __init__(self, env: Environment):
        self.env = env

    def __repr__(self) -> str:
        return self.env.report()

    def _repr_html_(self) -> str:
        env = self.env
        e = escape
        rows = [
            ("platform", e(env.platform)),
            ("accelerator", e(str(env.accelerator))),
            ("device", e(env.pjrt_device or "unset") + (
                f", {env.cpu_num_devices} CPU devices" if env.cpu_num_devices else "")),
            ("runtime", "initialized" if env.runtime_initialized else "not started"),
            ("compile log", e(env.debug_file or "off")),
            ("versions", e(", ".join(f"{k} {v or '-'}" for k, v in env.versions.items()))),
            ("multi-device", e(env.multi_device)),
        ]
        rows += [("applied", e(a)) for a in env.applied]
        rows += [("<span class='warn'>not applied</span>", e(n)) for n in env.not_applied]
        html = [_STYLE, "<div class='tpunb'><b>tpu_nb environment</b>",
                _table([(f"<b>{k}</b>", v) for k, v in rows])]
        if env.problems:
            probs = [(f"<span class='{'err' if p.severity == 'error' else 'warn'}'>"
                      f"{e(p.severity)}</span>", e(p.message), f"<code>{e(p.fix)}</code>")
                     for p in env.problems]
            html.append(_table(probs, ("", "problem", "fix")))
        else:
            html.append("<span class='ok'>no problems found</span>")
        return "".join(html) + "</div>"


# -- a run (a cell) ---------------------------------------------------------------------------

def _where(finding: LineFinding) -> str:
    if finding.line:
        return f"line {finding.line}"
    return finding.place or "outside this cell"


class RunView:
    """A `%%on_tpu` cell's report: one summary line, the details expandable."""

    def __init__(self, report: RunReport, findings: list[LineFinding] | None = None,
                 label: str = "XLA", allowed_graphs: int = 1, source: str = ""):
        self.report = report
        self.source = source                      # the cell's code, for the annotated listing
        self.findings = findings or []
        self.label = label
        self.allowed_graphs = allowed_graphs      # the cell's --max-graphs: not flagged
        self.recompiled = bool(report.recompiled_lines(allowed_graphs))

    def summary(self) -> str:
        r = self.report
        m = r.metrics
        bits = [f"{self.label}: {_seconds(r.wall_seconds)}"
                + (" (device-synced)" if r.waited else ""),
                f"{m.compiles} compiled", f"{m.executions} executed"]
        if m.cache_hits:
            bits.append(f"{m.cache_hits} cache hits")
        if m.host_reads:
            bits.append(f"{m.host_reads} host reads")
        if m.fallbacks:
            bits.append(f"{sum(m.fallbacks.values())} CPU fallbacks")
        if self.recompiled:
            bits.append("RECOMPILED")
        if r.error is not None:
            bits.append(f"failed: {type(r.error).__name__}")
        return " | ".join(bits)

    def text(self) -> str:
        r = self.report
        lines = [self.summary(), str(r.metrics)]
        for f in self.findings:
            lines.append(f"  {_where(f)}: {f.kind}: {f.what}")
            if f.hint:
                lines.append(f"      -> {f.hint}")
        if r.metrics.compiles and not r.compile_analysis:
            lines.append("  compile causes unknown: run %tpu_setup before the first compile")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        r, m, e = self.report, self.report.metrics, escape
        cls = "err" if r.error is not None or self.recompiled else "ok"
        rows = [
            ("wall time", _seconds(r.wall_seconds) + (" (includes sync and device wait)"
                                                      if r.waited else "")),
            ("graphs compiled", f"{m.compiles} ({_seconds(m.compile_seconds)})"),
            ("compile cache hits", str(m.cache_hits)),
            ("executions", f"{m.executions} ({_seconds(m.execute_seconds)} on device)"),
            ("transfers to device", f"{m.to_device_transfers} ({_seconds(m.to_device_seconds)})"),
            ("transfers to host", f"{m.from_device_transfers} "
                                  f"({_seconds(m.from_device_seconds)})"),
            ("device\u2192host reads", str(m.host_reads)),
            ("CPU fallbacks", e(", ".join(f"{op} \u00d7{n}" for op, n in
                                          sorted(m.fallbacks.items())) or "none")),
        ]
        parts = [_STYLE, "<div class='tpunb'><details><summary>",
                 f"<span class='{cls}'>{e(self.summary())}</span></summary>",
                 _table([(f"<b>{k}</b>", v) for k, v in rows])]
        if self.findings:
            parts.append(_table([(e(_where(f)), e(f.kind), e(f.what), e(f.hint))
                                 for f in self.findings], ("where", "what", "", "what to do")))
        if m.compiles and not r.compile_analysis:
            parts.append("<p>Compile causes unknown: run <code>%tpu_setup</code> before the "
                         "first compile.</p>")
        return "".join(parts) + "</details></div>"


# -- metrics ----------------------------------------------------------------------------------

class MetricsView:
    """`%xla_metrics`: a delta (since the last cell, or since the start) or a full snapshot."""

    def __init__(self, title: str, delta: MetricsDelta | None = None,
                 full: MetricsSnapshot | None = None):
        self.title, self.delta, self.full = title, delta, full

    def _full_rows(self):
        snap = self.full
        rows = [(name, str(value), "counter") for name, value in sorted(snap.counters.items())]
        for name, (samples, total) in sorted(snap.metrics.items()):
            shown = _seconds(total / 1e9) if name.endswith("Time") else f"{total:g}"
            rows.append((name, f"{samples} samples", f"total {shown}"))
        return rows

    def __repr__(self) -> str:
        lines = [self.title]
        if self.delta is not None:
            lines.append(str(self.delta))
            if self.delta.host_reads:
                lines.append("  device->host reads: .item(), print(tensor), bool(tensor) wait "
                             "for the device; read once after the loop instead")
        if self.full is not None:
            lines += [f"  {a:40}{b:>16}  {c}" for a, b, c in self._full_rows()]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        e = escape
        parts = [_STYLE, f"<div class='tpunb'><b>{e(self.title)}</b>"]
        if self.delta is not None:
            parts.append(f"<pre>{e(str(self.delta))}</pre>")
        if self.full is not None:
            parts.append(_table([(e(a), e(b), e(c)) for a, b, c in self._full_rows()],
                                ("name", "value", "")))
        return "".join(parts) + "</div>"


class CellsView:
    """`%xla_metrics --cells`: one row per cell that did XLA work."""

    # Timings last: their width varies, and nothing after them must move when they change.
    HEADER = ("cell", "graphs compiled", "executions", "to device", "to host", "host reads",
              "CPU fallbacks", "code", "compile / execute time")

    def __init__(self, history: list[tuple[int, str, MetricsDelta]]):
        self.history = history

    def rows(self) -> list[tuple[str, ...]]:
        out = []
        for count, first_line, d in self.history:
            code = first_line if len(first_line) <= 40 else first_line[:39] + "…"
            out.append((f"[{count}]", str(d.compiles), str(d.executions),
                        str(d.to_device_transfers), str(d.from_device_transfers),
                        str(d.host_reads),
                        ", ".join(f"{op}×{n}" for op, n in sorted(d.fallbacks.items()))
                        or "-", code,
                        f"{_seconds(d.compile_seconds)} / {_seconds(d.execute_seconds)}"))
        return out

    def __repr__(self) -> str:
        rows = [self.HEADER] + self.rows()
        widths = [max(len(r[i]) for r in rows) for i in range(len(self.HEADER) - 1)] + [0]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
        if not self.history:
            lines.append("no cell did XLA work yet")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        return (f"{_STYLE}<div class='tpunb'>" + _table(
            [tuple(escape(c) for c in r) for r in self.rows()], self.HEADER) + "</div>")


class TimingView:
    """`%tpu_time`'s result."""

    def __init__(self, timing: DeviceTiming):
        self.timing = timing

    def __repr__(self) -> str:
        return self.timing.summary()

    def _repr_html_(self) -> str:
        t = self.timing
        cls = "err" if t.recompiles else "ok"
        return (f"{_STYLE}<div class='tpunb'><span class='{cls}'>"
                f"{escape(t.summary())}</span></div>")
