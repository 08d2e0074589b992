"""One view of every host of a pod launch (`%%on_tpu --hosts`, `launch(fn, hosts=...)`): the
hosts lined up (compiles, executions, reads, step median and p90, the step anatomy's verdict),
what diverged between them, the straggler. Text for terminals and nbval, escaped HTML for
notebooks."""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

from tpu_nb.display.style import MUTED, PRE, RED, WARN, root, span, table, text_table
from tpu_nb.runtime.parallel import HostResult, PodResult
from tpu_nb.runtime.units import format_seconds

HEADER = (
    "host",
    "address",
    "running after",
    "compiles",
    "executions",
    "reads",
    "step median",
    "step p90",
    "verdict",
)


def _row(h: HostResult) -> tuple[str, ...]:
    m = h.metrics
    counts = ("-",) * 3 if m is None else (m.compiles, m.executions, m.host_reads)
    return (
        str(h.host),
        h.address or "-",
        format_seconds(h.started_seconds),
        *map(str, counts),
        format_seconds(h.step_median),
        format_seconds(h.step_p90),
        h.verdict_kind or "-",
    )


@dataclass(eq=False)
class PodView:
    """Every host of a pod launch in one view."""

    result: PodResult

    def _line_text(self, line: int) -> str:
        lines = self.result.source.splitlines()
        return lines[line - 1].strip() if 0 < line <= len(lines) else ""

    def text(self) -> str:
        r = self.result
        out = [r.summary(), *text_table([HEADER, *(_row(h) for h in r.hosts)], indent="  ")]
        for d in r.divergences:
            out.append(f"  DIVERGED: {d}")
            if d.line and (code := self._line_text(d.line)):
                out.append(f"    line {d.line}: {code}")
        for hosts, text in r.verdicts():
            out.append(f"  verdict ({hosts}): {text}")
        out += [f"  {note}" for note in r.notes]
        return "\n".join(out)

    def __repr__(self) -> str:
        return self.text()

    def _repr_html_(self) -> str:
        r, e = self.result, escape
        rows = [tuple(e(c) for c in _row(h)) for h in r.hosts]
        styles = [
            f";color:{WARN};font-weight:bold" if h.host == r.straggler else "" for h in r.hosts
        ]
        body = [
            f"<div><b>{e(r.summary())}</b></div>",
            table(rows, HEADER, row_styles=styles),
        ]
        for d in r.divergences:
            code = self._line_text(d.line) if d.line else ""
            body.append(
                "<div>"
                + span("DIVERGED", RED, bold=True)
                + f" {e(d.what)}"
                + "".join(f"<br>&nbsp;&nbsp;{e(fact)}" for fact in d.changed)
                + (f"<pre style='{PRE}'>line {d.line}: {e(code)}</pre>" if code else "")
                + "</div>"
            )
        for hosts, text in r.verdicts():
            body.append(f"<div>verdict ({e(hosts)}): {e(text)}</div>")
        body += [f"<div>{span(e(note), MUTED)}</div>" for note in r.notes]
        return root("".join(body), cls="tpunb-pod")
