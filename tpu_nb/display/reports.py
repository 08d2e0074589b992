"""Reports as text and HTML: the environment, a run (a cell), metrics, device timings.

Each view object has `_repr_html_` for notebooks and a plain-text `__repr__` for terminals and
nbval. Output is deterministic apart from timings, hashes and cell file names, which
tools/nbval-sanitize.cfg masks. Every string from user code or the runtime is escaped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from html import escape
from typing import Any

from tpu_nb.display.anatomy_view import host_lines_html, host_lines_text
from tpu_nb.display.compiled_view import compiled_html, compiled_text
from tpu_nb.display.style import (
    ACCENT,
    CODE,
    MARK_BG,
    MUTED,
    NOWRAP,
    OK,
    PRE,
    RED,
    WARN,
    bullets,
    root,
    span,
    table,
    text_table,
)
from tpu_nb.runtime.environment import Environment
from tpu_nb.runtime.metrics import DeviceTiming, MetricsDelta, MetricsSnapshot
from tpu_nb.runtime.tracking import LineFinding, RunReport
from tpu_nb.runtime.units import format_seconds

# -- environment ------------------------------------------------------------------------------


@dataclass(eq=False)
class EnvironmentView:
    """`%tpu_setup`'s report: an HTML table in notebooks, text in a terminal."""

    env: Environment

    def __repr__(self) -> str:
        return self.env.report()

    def _repr_html_(self) -> str:
        env = self.env
        e = escape
        rows = [
            ("platform", e(env.platform)),
            ("accelerator", e(str(env.accelerator))),
            (
                "device",
                e(env.pjrt_device or "unset")
                + (f", {env.cpu_num_devices} CPU devices" if env.cpu_num_devices else ""),
            ),
            ("runtime", "initialized" if env.runtime_initialized else "not started"),
            ("compile log", e(env.debug_file or "off")),
            ("versions", e(", ".join(f"{k} {v or '-'}" for k, v in env.versions.items()))),
            ("multi-device", e(env.multi_device)),
        ]
        rows += [("applied", e(a)) for a in env.applied]
        rows += [(span("not applied", WARN, bold=True), e(n)) for n in env.not_applied]
        html = [
            "<b>tpu_nb environment</b>",
            table([(f"<b>{k}</b>", v) for k, v in rows], styles=(NOWRAP,)),
        ]
        if env.problems:
            probs = [
                (
                    span(e(p.severity), RED if p.severity == "error" else WARN, bold=True),
                    e(p.message),
                    f"<code style='{CODE}'>{e(p.fix)}</code>",
                )
                for p in env.problems
            ]
            html.append(table(probs, ("", "problem", "fix")))
        else:
            html.append(span("no problems found", OK))
        return root("".join(html), "tpunb-env")


# -- a run (a cell) ---------------------------------------------------------------------------

# What each kind of finding did, as the report says it.
KIND_WORDS = {
    "compile": "compiled",
    "warm-up": "compiled the steady step's graph",
    "state": "compiled a graph as state appeared",
    "variant": "compiled another graph",
    "earlier": "compiled, with earlier cells' work",
    "recompile": "recompiled",
    "growing": "compiled a bigger graph",
    "fallback": "fell back to the CPU",
    "host-read": "read from the device",
    "pending": "left pending",
    "inputs": "compiled its inputs' pending work",
    "device-data": "built data on the device",
}
# The same, for several at once where one reads as a single thing done N times.
_KIND_WORDS_MANY = {"variant": "compiled other graphs"}


def kind_words(kind: str, count: int) -> str:
    """What `count` findings of `kind` did: "compiled another graph" for one, "compiled
    other graphs" for several (each a graph of its own, compiled once)."""
    if count > 1 and kind in _KIND_WORDS_MANY:
        return _KIND_WORDS_MANY[kind]
    return KIND_WORDS.get(kind, kind)


_FLAGGED = ("recompile", "growing", "fallback", "host-read", "device-data")
_KIND_COLOURS = {
    **dict.fromkeys(KIND_WORDS, MUTED),
    **dict.fromkeys(_FLAGGED[:2], RED),
    **dict.fromkeys(_FLAGGED[2:], WARN),
    "compile": ACCENT,
}
_SHOWN_WHATS = 3  # distinct descriptions listed per group before "and N more"
_NOT_CAPTURED = "tpu_nb did not capture both graphs"
_CONTEXT = 2  # source lines shown around a marked line of a long cell
_LONG_CELL = 30  # cells longer than this show only marked lines and their context


def _wall_parts(r: RunReport) -> str:
    """What the wall time covers: the cell's code, tpu_nb's sync if asked, the wait."""
    parts = ["the cell's code"]
    if getattr(r, "synced_at_end", False):
        parts.append("tpu_nb's end-of-cell sync (--sync)")
    if r.waited and r.metrics.executions:  # waited for, not synced: no graph of tpu_nb's
        parts.append("the device's work")
    text = ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]
    return f" ({text})"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _timed(n: int, seconds: float, more: str = "") -> str:
    return f"{n} ({format_seconds(seconds)}{more})"


_RESUME = re.compile(r"\btorch_dynamo_resume_in_(\w+?)_at_(\d+)\b")


def plain_via(via: str) -> str:
    """A frame's function as a learner knows it: Dynamo's resume function after a graph
    break ("torch_dynamo_resume_in_f_at_3") is the rest of `f`, after line 3."""
    return _RESUME.sub(r"\1 (the part after its graph break at line \2)", via)


def _distinct(values) -> list[str]:
    return list(dict.fromkeys(v for v in values if v))


def _each(name: str) -> Any:
    """A property: the distinct non-empty `name` fields of a group's findings, in order."""
    return property(lambda group: _distinct(getattr(f, name) for f in group.findings))


@dataclass
class FindingGroup:
    """The findings of one kind on one line (or place), merged: what a report row shows."""

    where: str
    line: int
    kind: str
    findings: list[LineFinding] = field(default_factory=list)

    @property
    def count(self) -> int:
        return sum(max(f.count, 1) for f in self.findings)

    @property
    def seconds(self) -> float | None:
        known = [f.seconds for f in self.findings if f.seconds is not None]
        return sum(known) if known else None

    @property
    def order(self) -> tuple[int, int, int]:
        return min(f.sort_key for f in self.findings)

    whats = _each("what")
    details = _each("detail")  # the graphs' hashes and torch_xla's own words: for the curious
    patterns = _each("pattern")  # each site's once (a library's loop on one line has several)
    hints = _each("hint")

    @property
    def vias(self) -> list[str]:
        return _distinct(plain_via(f.via) for f in self.findings)

    @property
    def changed(self) -> list[str]:
        """What differs from the line's graph before, once for the group: the facts from
        captured graphs first (a compile whose graphs were not both captured adds nothing
        when another says more); a dimension moving through the line's graphs is said once,
        by the line's pattern."""
        facts = [f.changed for f in sorted(self.findings, key=lambda f: f.sort_key) if f.changed]
        captured = [c for c in facts if not c[-1].startswith(_NOT_CAPTURED)]
        chosen = captured or facts[-1:]
        return _distinct(c for changed in chosen[-2:] for c in changed)

    def marker(self) -> str:
        """A few words for the annotated listing: "recompiled ×3 (1.20 s)"."""
        secs = self.seconds
        return f"{kind_words(self.kind, self.count)} \u00d7{self.count}" + (
            f" ({format_seconds(secs)})" if secs is not None else ""
        )

    def description(self) -> str:
        # A what that another only extends ("at torch_xla.sync(), …" and "at
        # torch_xla.sync(), …; another graph of this line") is said once, by the longer.
        whats = [w for w in self.whats if not any(o.startswith(w + "; ") for o in self.whats)]
        text = "; ".join(whats[:_SHOWN_WHATS])
        if len(whats) > _SHOWN_WHATS:
            text += f"; and {len(whats) - _SHOWN_WHATS} more"
        return text


def group_findings(findings: list[LineFinding]) -> list[FindingGroup]:
    """Findings merged by (line or place, kind), in the order they first happened."""
    groups: dict[tuple, FindingGroup] = {}
    for f in findings:
        key = (f.line, f.place if not f.line else "", f.kind)
        if key not in groups:
            where = f"line {f.line}" if f.line else f.place or "outside this cell"
            groups[key] = FindingGroup(where, f.line, f.kind)
        groups[key].findings.append(f)
    return sorted(groups.values(), key=lambda g: (g.order, g.line))


def _hints(groups: list[FindingGroup]) -> list[tuple[str, list[str], str]]:
    """Each distinct hint once per kind of finding: (kind, the places it applies to, the
    hint)."""
    seen: dict[tuple[str, str], tuple[str, list[str], str]] = {}
    for g in groups:
        for hint in g.hints:
            entry = seen.setdefault((g.kind, hint), (g.kind, [], hint))
            if g.where not in entry[1]:
                entry[1].append(g.where)
    return list(seen.values())


def _shown_lines(total: int, marked: set[int]) -> list[int | None]:
    """Line numbers to list (None: an elision); all of them for a short cell."""
    if total <= _LONG_CELL:
        return list(range(1, total + 1))
    keep = sorted(
        {n for m in marked for n in range(m - _CONTEXT, m + _CONTEXT + 1) if 1 <= n <= total}
    )
    out: list[int | None] = []
    last = 0
    for n in keep:
        if n != last + 1:  # lines left out before this one (also before the first)
            out.append(None)
        out.append(n)
        last = n
    if keep and keep[-1] != total:
        out.append(None)
    return out


class RunView:
    """A `%%on_tpu` cell's report: the summary line; what each line did, grouped, in time
    order, with one hint per kind of problem; the cell's source annotated line by line (as
    `%lprun` annotates a listing); all figures on demand."""

    def __init__(self, report: RunReport, label: str = "XLA"):
        self.report = report
        self.label = label
        self.groups = group_findings(list(report.findings))
        # the cell's --max-graphs: lines within it are not flagged
        self.recompiled = bool(report.recompiled_lines(report.allowed_graphs)) or any(
            g.kind == "recompile" for g in self.groups
        )

    # -- content, shared by the text and HTML forms --

    def summary(self) -> str:
        r = self.report
        m = r.metrics
        bits = [
            f"{self.label}: {format_seconds(r.wall_seconds)}"
            + (" (incl. device work)" if r.waited and m.executions else ""),
            f"{m.compiles} compiled",
            f"{m.executions} executed",
        ]
        if m.cache_hits:
            bits.append(_count(m.cache_hits, "cache hit") + m.from_disk())
        if m.host_reads:
            bits.append(_count(m.host_reads, "host read"))
        if m.fallbacks:
            bits.append(_count(sum(m.fallbacks.values()), "CPU fallback"))
        if self.recompiled:
            bits.append("RECOMPILED")
        if r.error is not None:
            bits.append(f"failed: {type(r.error).__name__}")
        verdict = getattr(r.anatomy, "verdict", None)  # where the steady steps' time went
        if verdict is not None:
            bits.append(verdict.kind)
        elif getattr(r.judgement, "note", "") and r.error is None:
            bits.append("no verdict yet")
        return " | ".join(bits)

    def figures(self) -> list[tuple[str, str]]:
        r, m = self.report, self.report.metrics
        fallbacks = ", ".join(f"aten::{op} \u00d7{n}" for op, n in sorted(m.fallbacks.items()))
        incomplete = "" if r.waited else "; some may still run: their time is incomplete"
        executions = _timed(m.executions, m.execute_seconds, f" on device{incomplete}")
        if r.error is not None and m.unfinished_executions:  # timed, not counted: failed
            executions = (
                f"{m.executions}, and {m.unfinished_executions} that failed "
                + (executions[len(str(m.executions)) + 1 :])
            )
        return [
            ("wall time", format_seconds(r.wall_seconds) + _wall_parts(r)),
            ("graphs compiled", _timed(m.compiles, m.compile_seconds)),
            ("compile cache hits", f"{m.cache_hits}{m.from_disk()}"),
            ("executions", executions),
            ("transfers to device", _timed(m.to_device_transfers, m.to_device_seconds)),
            ("transfers to host", _timed(m.from_device_transfers, m.from_device_seconds)),
            ("scalar reads (.item(), bool(), float())", str(m.host_reads)),
            ("CPU fallbacks", fallbacks or "none"),
        ]

    def _describes_line(self, g: FindingGroup) -> bool:
        """Whether `g` carries its line's compile pattern: the line's last compile group,
        when the line compiled more than one graph."""
        if not g.patterns or not g.line:
            return False
        same = [h for h in self.groups if h.line == g.line and h.patterns]
        return same[-1] is g and sum(h.count for h in same) > 1

    def _group_notes(self, g: FindingGroup) -> list[tuple[str, str, str]]:
        """(label, text, colour) of the lines under a group: the paths from its line to the
        code that did it, what changed, and its line's pattern."""
        notes = [("", f"{g.where} \u2192 {via}", MUTED) for via in g.vias]
        if g.changed:
            notes.append(("changed:", "; ".join(g.changed), RED))
        if self._describes_line(g):
            notes += [("this line:", pattern, MUTED) for pattern in g.patterns]
        return notes

    def _scope(self) -> str:
        """Which steps the host lines cover, when the verdict left the warm-up out, and
        whether the syncs' wait for XLA:CPU was left out."""
        judgement = getattr(self.report, "judgement", None)
        if judgement is None or judgement.verdict is None:
            return ""
        steps = self._steps_scope(judgement)
        if not judgement.syncs_left_out:
            return steps
        chip = getattr(getattr(judgement.cost, "chip", None), "name", "TPU")
        syncs = f"the syncs: XLA:CPU running the steps, which a {chip} runs on the chip"
        return f"{steps}; without {syncs}" if steps else f"without {syncs}"

    def _steps_scope(self, judgement) -> str:
        steps = getattr(self.report.anatomy, "steps", ())
        if not 0 < judgement.steady_steps < len(steps):
            return ""
        if getattr(self.report.anatomy, "dropped_steps", 0):  # the first steps are not kept:
            return "the whole run but the code after its loop"  # nor left out (the warm-up)
        if not self.report.compile_analysis:  # no compile log: first steps are not known
            return f"the {judgement.steady_steps} steps after the last one that compiled"
        return f"the {judgement.steady_steps} steady steps"

    def _notes(self) -> list[str]:
        notes = [self.report.metrics.unknown_note()] if self.report.metrics.unknown else []
        if self.report.metrics.compiles and not self.report.compile_analysis:
            notes.append("compile causes unknown: run %tpu_setup before the first compile")
        problem = getattr(self.report, "compile_log_problem", "")
        if problem:
            notes.append(f"compile causes unknown for this cell: {problem}")
        judgement = getattr(self.report, "judgement", None)
        if judgement is not None and judgement.one_time_compiles and judgement.loop:
            notes.append(judgement.one_time_cost())
        verdict = getattr(self.report.anatomy, "verdict", None)
        if verdict is not None:
            if judgement is not None and judgement.note:  # what the verdict leaves out
                notes.append(judgement.note)
            notes.append(f"verdict: {verdict}")
        elif judgement is not None and judgement.note:
            notes.append(f"no verdict: {judgement.note}")
        if getattr(self.report, "synced_at_end", False):
            notes.append(
                "--sync: tpu_nb's end-of-cell sync ran the work the cell left pending (a "
                "sync the plain cell does not make); its compiles and executions are counted "
                "here"
            )
        return notes

    # -- text --

    def text(self) -> str:
        lines = [self.summary()]
        lines += [f"  {k}: {v}" for k, v in self.figures()]
        lines += compiled_text(getattr(self.report, "compiled", ()))
        if self.groups:
            lines.append("what happened, in order:")
            for g in self.groups:
                what = g.description()
                lines.append(f"  {g.where}: {g.marker()}" + (f": {what}" if what else ""))
                lines += [
                    f"      {label} {text}" if label else f"      {text}"
                    for label, text, _ in self._group_notes(g)
                ]
        hints = _hints(self.groups)
        if hints:
            lines.append("what to do:")
            lines += [
                f"  {KIND_WORDS.get(kind, kind)} ({', '.join(places)}): {hint}"
                for kind, places, hint in hints
            ]
        lines += self._notes()
        lines += [f"  {line}" for line in host_lines_text(self.report.anatomy, self._scope())]
        title, cost = self._cost()
        if cost:
            lines.append(title + ":")
            lines += [f"  {line}" for line in cost]
        for card in self.report.error_cards():
            lines += card
        lines += self._listing_text()
        return "\n".join(lines)

    def _cost(self) -> tuple[str, list[str]]:
        """The title and lines of the steady step's cost (none when the run had no steps)."""
        cost = self.report.cost
        if cost is None or not self.report.steps:
            return "", []
        title = "cost per step"
        if not cost.on_chip:
            title += f", judged for a {cost.chip.name} (this machine has no TPU)"
        return title, cost.lines()

    def _listing(self) -> tuple[dict[int, list[FindingGroup]], list[str], list[int | None] | None]:
        """The groups on each marked line, the cell's code, and the line numbers to list
        (None: an elision), without the %%on_tpu line left blank in the cell's code; None
        when no line is marked."""
        marks: dict[int, list[FindingGroup]] = {}
        for g in self.groups:
            if g.line:
                marks.setdefault(g.line, []).append(g)
        code = self.report.source.splitlines()
        if not code or not marks:
            return marks, code, None
        blank_first = not code[0].strip() and 1 not in marks
        shown = [n for n in _shown_lines(len(code), set(marks)) if not (blank_first and n == 1)]
        return marks, code, shown

    def _listing_text(self) -> list[str]:
        marks, code, shown = self._listing()
        if shown is None:
            return []
        out = ["the cell, annotated:"]
        for n in shown:
            if n is None:
                out.append("   ...")
                continue
            flag = ">" if n in marks else " "
            out.append(f"{flag}{n:4d}  {code[n - 1]}".rstrip())
            if n in marks:
                out.append("        ^ " + ", ".join(g.marker() for g in marks[n]))
        return out

    def __repr__(self) -> str:
        return self.text()

    # -- HTML --

    def _repr_html_(self) -> str:
        e = escape
        bad = self.report.error is not None or self.recompiled
        flagged = bad or any(g.kind in _FLAGGED for g in self.groups)
        parts = [
            f"<div class='tpunb-summary' style='font-weight:bold'>"
            f"{span(e(self.summary()), RED if bad else OK)}</div>"
        ]
        if self.groups:
            parts.append(self._groups_html())
        parts.append(compiled_html(getattr(self.report, "compiled", ())))
        hints = _hints(self.groups)
        if hints:
            items = (
                f"{span(e(KIND_WORDS.get(kind, kind)), _KIND_COLOURS.get(kind, ACCENT), bold=True)}"
                f" <span style='color:{MUTED}'>({e(', '.join(places))})</span>: {e(hint)}"
                for kind, places, hint in hints
            )
            parts.append(bullets("tpunb-hints", "what to do", items))
        for note in self._notes():
            parts.append(f"<div style='color:{MUTED}'>{e(note)}</div>")
        parts.append(host_lines_html(self.report.anatomy, self._scope()))
        title, cost = self._cost()
        if cost:
            lines = (e(line) for line in cost)
            parts.append(bullets("tpunb-cost", e(title), lines, "margin:0;padding:0"))
        for head, *rest in self.report.error_cards():
            body = "".join(f"<div>{e(line)}</div>" for line in rest)
            parts.append(
                f"<div class='tpunb-error' style='margin:4px 0;padding:4px 8px;"
                f"border-left:3px solid {RED}'>{span(e(head), RED, bold=True)}{body}</div>"
            )
        listing = self._listing_html()
        if listing:
            parts.append(
                f"<details{' open' if flagged else ''} style='margin:4px 0 0'>"
                "<summary style='cursor:pointer'>the cell, annotated</summary>"
                f"{listing}</details>"
            )
        parts.append(
            "<details style='margin:4px 0 0'><summary style='cursor:pointer'>"
            "all figures</summary>"
            + table([(f"<b>{e(k)}</b>", e(v)) for k, v in self.figures()], styles=(NOWRAP,))
            + "</details>"
        )
        return root("".join(parts), "tpunb-report")

    def _groups_html(self) -> str:
        e = escape
        rows: list[tuple[str, ...]] = []
        for g in self.groups:
            colour = _KIND_COLOURS.get(g.kind, ACCENT)
            details = e(g.description()) + "".join(
                f"<br><span style='color:{tone}'>{e(label)}</span> {e(text)}"
                if label
                else f"<br><span style='color:{tone}'>{e(text)}</span>"
                for label, text, tone in self._group_notes(g)
            )
            if g.details:
                details += (
                    f"<details style='color:{MUTED}'><summary style='cursor:pointer'>"
                    "graphs and torch_xla's words</summary>"
                    + "<br>".join(e(d) for d in g.details)
                    + "</details>"
                )
            secs = g.seconds
            rows.append(
                (
                    e(g.where),
                    span(e(kind_words(g.kind, g.count)), colour, bold=True),
                    f"\u00d7{g.count}",
                    e(format_seconds(secs)) if secs is not None else "",
                    details,
                )
            )
        header: tuple[str, ...] = ("where", "what", "times", "time", "details")
        styles: tuple[str, ...] = (NOWRAP,) * 4 + ("",)
        if all(g.seconds is None for g in self.groups):  # no column of blanks
            rows = [r[:3] + r[4:] for r in rows]
            header, styles = header[:3] + header[4:], styles[1:]
        return table(rows, header, styles=styles)

    def _listing_html(self) -> str:
        e = escape
        marks, code, shown = self._listing()
        if shown is None:
            return ""
        rows, row_styles = [], []
        for n in shown:
            if n is None:
                rows.append((f"<span style='color:{MUTED}'>\u22ee</span>", "", ""))
                row_styles.append("")
                continue
            groups = marks.get(n, [])
            badges = ", ".join(
                span(e(g.marker()), _KIND_COLOURS.get(g.kind, ACCENT), bold=g.kind in _FLAGGED)
                for g in groups
            )
            rows.append(
                (
                    f"<span style='color:{MUTED}'>{n}</span>",
                    badges,
                    f"<pre style='{PRE}'>{e(code[n - 1])}</pre>",
                )
            )
            # Lines that did something worth fixing stand out.
            row_styles.append(
                f";background:{MARK_BG}" if any(g.kind in _FLAGGED for g in groups) else ""
            )
        flat = "border-bottom:none;padding-top:0;padding-bottom:0"
        html = table(
            rows,
            ("line", "tpu_nb", "code"),
            row_styles=row_styles,
            styles=(f"text-align:right;{flat}", f"{NOWRAP};{flat}", flat),
        )
        return f"<div class='tpunb-listing' style='overflow-x:auto'>{html}</div>"


# -- metrics ----------------------------------------------------------------------------------


@dataclass(eq=False)
class MetricsView:
    """`%xla_metrics`: a delta (since the last cell, or since the start) or a full snapshot."""

    title: str
    delta: MetricsDelta | None = None
    full: MetricsSnapshot | None = None

    @staticmethod
    def _full_rows(snap: MetricsSnapshot) -> list[tuple[str, str, str]]:
        rows = [(name, str(value), "counter") for name, value in sorted(snap.counters.items())]
        for name, (samples, total) in sorted(snap.metrics.items()):
            shown = format_seconds(total / 1e9) if name.endswith("Time") else f"{total:g}"
            rows.append((name, f"{samples} samples", f"total {shown}"))
        return rows

    @staticmethod
    def _delta_rows(d: MetricsDelta) -> list[tuple[str, str, str]]:
        """(what, count, time) of the delta, times in the package's one format."""
        rows = d.rows()
        rows += [(f"CPU fallback aten::{op}", n, None) for op, n in sorted(d.fallbacks.items())]
        return [(what, str(n), "" if t is None else format_seconds(t)) for what, n, t in rows]

    def __repr__(self) -> str:
        lines = [self.title]
        if self.delta is not None:
            # times last: their width varies (masked by the nbval sanitizer)
            lines += [f"  {a:22}{b:>8}  {c}".rstrip() for a, b, c in self._delta_rows(self.delta)]
            if self.delta.host_reads:
                lines.append(
                    "  scalar reads: each .item(), bool(tensor) or float(tensor) waited for "
                    "the device's pending work"
                )
        if self.full is not None:
            lines += [f"  {a:40}{b:>16}  {c}" for a, b, c in self._full_rows(self.full)]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        e = escape
        parts = [f"<b>{e(self.title)}</b>"]
        if self.delta is not None:
            parts.append(
                table(
                    [
                        (e(a.replace("->", "\u2192")), e(b), e(c))
                        for a, b, c in self._delta_rows(self.delta)
                    ],
                    styles=(NOWRAP, "text-align:right", NOWRAP),
                )
            )
        if self.full is not None:
            parts.append(
                table(
                    [(e(a), e(b), e(c)) for a, b, c in self._full_rows(self.full)],
                    ("name", "value", ""),
                )
            )
        return root("".join(parts), "tpunb-metrics")


@dataclass(eq=False)
class CellsView:
    """`%xla_metrics --cells`: one row per cell that did XLA work."""

    history: list[tuple[int, str, MetricsDelta]]

    # Timings last: their width varies, and nothing after them must move when they change.
    HEADER = (
        "cell",
        "graphs compiled",
        "executions",
        "to device",
        "to host",
        "host reads",
        "CPU fallbacks",
        "code",
        "compile / execute time",
    )

    def rows(self) -> list[tuple[str, ...]]:
        out: list[tuple[str, ...]] = []
        for count, first_line, d in self.history:
            code = first_line if len(first_line) <= 40 else first_line[:39] + "…"
            out.append(
                (
                    f"[{count}]",
                    str(d.compiles),
                    str(d.executions),
                    str(d.to_device_transfers),
                    str(d.from_device_transfers),
                    str(d.host_reads),
                    ", ".join(f"{op}×{n}" for op, n in sorted(d.fallbacks.items())) or "-",
                    code,
                    f"{format_seconds(d.compile_seconds)} / {format_seconds(d.execute_seconds)}",
                )
            )
        return out

    def __repr__(self) -> str:
        lines = text_table([self.HEADER, *self.rows()], strip=True)
        if not self.history:
            lines.append("no cell did XLA work yet")
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        html = table([tuple(escape(c) for c in r) for r in self.rows()], self.HEADER)
        if not self.history:
            html += span("no cell did XLA work yet", MUTED)
        return root(html, "tpunb-cells")


@dataclass(eq=False)
class TimingView:
    """`%tpu_time`'s result."""

    timing: DeviceTiming

    def __repr__(self) -> str:
        return self.timing.summary()

    def _repr_html_(self) -> str:
        t = self.timing
        return root(
            span(escape(t.summary()), RED if t.recompiles else OK, bold=t.recompiles),
            "tpunb-timing",
        )
