"""Pictures of a lazy XLA graph: self-contained SVG in HTML.

The HTML needs no JavaScript and no server, so it renders the same in Colab, JupyterLab,
nbviewer and an exported notebook: an inline SVG (hover a box or an edge: its `<title>` is the
tooltip), a legend, and `<details>` panels with the group list, the IR text and the HLO.
Graphs above the node budget are drawn as groups (tpu_nb.runtime.graph._groups); `expand`
shows named groups node by node. Every string from user code (file and function names, ops,
scopes) is escaped before it reaches SVG or HTML.

    view = GraphView(tpu_nb.graph(loss))      # a notebook shows it; repr() stays plain text
    html = render_html(graph)                 # the same as a string
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from base64 import b64encode
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tpu_nb.display import style
from tpu_nb.display.graph_layout import Layout, layered_layout
from tpu_nb.runtime.frame import Frame
from tpu_nb.runtime.graph import (
    KINDS,
    NODE_BUDGET,
    PHASES,
    Graph,
    GraphDiff,
    Group,
    GroupedGraph,
    gc_paused,
    group_graph,
    module_of,
    shown_location,
)
from tpu_nb.runtime.sources import short_path
from tpu_nb.runtime.tracking import format_bytes, format_flops

# fill, stroke and name per kind; CPU fallbacks and changed nodes stand out.
KIND_STYLES = {
    "data": ("#dbeafe", "#2563eb", "device data"),
    "constant": ("#f1f5f9", "#94a3b8", "constant"),
    "view": ("#f8fafc", "#94a3b8", "view / layout"),
    "compute": ("#dcfce7", "#16a34a", "compute"),
    "reduction": ("#fef3c7", "#d97706", "reduction"),
    "collective": ("#ede9fe", "#7c3aed", "collective"),
    "random": ("#fce7f3", "#db2777", "random"),
    "fallback": ("#fee2e2", "#dc2626", "CPU fallback"),
}
CHANGED = "#ea580c"
# fill, stroke of a module box per phase: the forward cool, the backward warm, the optimizer
# apart; the box with the most FLOPs gets a red border and its FLOPs bar.
PHASE_COLOURS = {
    "forward": ("#e0f2fe", "#0284c7"),
    "backward": ("#f3e8ff", "#9333ea"),
    "optimizer": ("#ffedd5", "#ea580c"),
    "other": ("#f1f5f9", "#64748b"),
}
HEAVIEST = "#dc2626"
# Names source files for people: path -> e.g. "In [3]" for a notebook cell's file, or None.
SourceNames = Callable[[str], "str | None"]
MAX_TEXT = 200_000  # characters of IR / HLO text embedded in the HTML (at most)
MAX_HTML = 1_900_000  # the IR / HLO panels shrink to keep a view's HTML under this
_FONT = 12
_SMALL = 10  # the smallest text drawn: 10 px at the natural size
_CHAR = 0.62  # monospace glyph width per font-size unit
_BOX_H = 34
esc = style.esc


def _fit(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True)
class _Box:
    """What one box shows: text lines, tooltip, colours."""

    title: str
    line1: str
    line2: str
    kind: str
    output: bool
    changed: bool
    group: bool
    phase: str = ""  # set on module boxes: coloured by phase
    share: float = 0.0  # its FLOPs over the heaviest box's (the bar under its text)
    heaviest: bool = False

    @property
    def width(self) -> float:
        return max(len(self.line1) * _FONT * _CHAR, len(self.line2) * _SMALL * _CHAR, 30) + 16


def _node_box(graph: Graph, group: Group, changed: frozenset[int], rename) -> _Box:
    n = graph.node(group.members[0])
    loc = shown_location(n)
    where = f"{loc.function}@{loc.file}:{loc.line}" if loc else ""
    out = f" → out {n.root}" if n.root is not None else ""
    tip = [
        f"%{n.id} {n.op}",
        f"shape {n.shape}" + (f" {n.layout}" if n.layout else ""),
        f"kind {KIND_STYLES[n.kind][2] if n.kind in KIND_STYLES else n.kind}",
    ]
    tip += [f"line {where}"] if where else ["line: not recorded (IR debug off, or autograd)"]
    user = n.user_frame
    if (
        user is not None
        and loc is not None
        and (user.line, user.function) != (loc.line, loc.function)
    ):
        tip.append(f"called from {user.file}:{user.line} ({user.function})")
    phase, module = module_of(n.scope)
    tip += [f"module {module} ({phase})"] if module else []
    tip += [f"scope {n.scope}"] if n.scope and not module else []
    tip += [f"output {n.root} of the graph"] if n.root is not None else []
    tip += [f"attrs {', '.join(f'{k}={v}' for k, v in n.attrs)}"] if n.attrs else []
    short = f"{loc.file}:{loc.line}" if loc else ""
    line2 = _fit(_cell_label(rename(f"%{n.id}" + (f" · {short}" if short else "") + out)), 34)
    return _Box(
        title=rename("\n".join(tip)),
        line1=_fit(n.name, 28),
        line2=line2,
        kind=n.kind,
        output=n.root is not None,
        changed=n.id in changed,
        group=False,
    )


def _quoted(key: str) -> str:
    """A group key as `%xla_graph --expand` takes it (quoted when it has spaces)."""
    return key if re.fullmatch(r"[\w%@.:/-]+", key) else '"' + key.replace('"', '\\"') + '"'


def _group_title(tip: list[str], group: Group, changed: frozenset[int], rename) -> str:
    """A group's tooltip: `tip`, its changed nodes, and how to expand it."""
    n_changed = sum(1 for m in group.members if m in changed)
    tip += [f"{n_changed} changed nodes"] if n_changed else []
    return rename("\n".join(tip)) + f"\nexpand: %xla_graph --expand {_quoted(group.key)} ..."


def _cell_label(text: str) -> str:
    """ "<module>@In [3]:4" -> "In [3]:4": a cell's own top-level code needs no function."""
    return text.replace("<module>@", "")


def _ops(group: Group, shown: int) -> str:
    """Its most frequent ops without their namespace, "…" when there are more."""
    more = "…" if len(group.ops) > shown else ""
    return ", ".join(f"{op.split('::', 1)[-1]} {c}" for op, c in group.ops[:shown]) + more


def _user_frames(graph: Graph, group: Group) -> list[Frame]:
    frames = (graph.node(m).user_frame for m in group.members)
    return [u for u in frames if u is not None]


def _group_box(graph: Graph, group: Group, changed: frozenset[int], rename) -> _Box:
    ops = _ops(group, 3)
    outs = sum(1 for m in group.members if graph.node(m).root is not None)
    tip = [f"group {group.key}", f"{group.size} nodes: {ops}"]
    tip += (
        ["lines: " + "; ".join(f"{k} ({c})" for k, c in group.sources[:6])] if group.sources else []
    )
    callers = Counter(f"{u.file}:{u.line} ({u.function})" for u in _user_frames(graph, group))
    if callers:
        tip.append("called from " + "; ".join(f"{k} ×{c}" for k, c in callers.most_common(3)))
    tip += [f"{outs} graph outputs"] if outs else []
    return _Box(
        title=_group_title(tip, group, changed, rename),
        line1=_fit(_cell_label(rename(group.label)), 44),
        line2=_fit(f"×{group.size} · {ops}", 40),
        kind=group.kind,
        output=outs > 0,
        changed=any(m in changed for m in group.members),
        group=True,
    )


def _module_box(graph: Graph, group: Group, changed: frozenset[int], rename, top: int) -> _Box:
    """A module's (or a row of repeated blocks') nodes of one phase."""
    module = group.key.partition(":")[2]
    cost = f"{format_flops(group.flops)} · " if group.flops else ""
    tip = [
        f"{group.phase} of {module}" if module != "other" else f"{group.phase}: no module",
        f"{group.size} nodes: {_ops(group, 4)}",
        f"{format_flops(group.flops)} (matmuls and convolutions), "
        f"{format_bytes(group.bytes)} of outputs",
    ]
    lines = sorted({f"{u.file}:{u.line}" for u in _user_frames(graph, group)})
    tip += ["lines: " + ", ".join(lines[:4]) + (" …" if len(lines) > 4 else "")] if lines else []
    return _Box(
        title=_group_title(tip, group, changed, rename),
        line1=_fit(group.label, 44),
        line2=_fit(f"{group.phase} · {cost}×{group.size}", 40),
        kind=group.kind,
        output=False,
        changed=any(m in changed for m in group.members),
        group=True,
        phase=group.phase,
        share=group.flops / top if top else 0.0,
        heaviest=bool(top) and group.flops == top,
    )


def _boxes(graph: Graph, grouped: GroupedGraph, changed: frozenset[int], rename) -> list[_Box]:
    if grouped.by != "module":
        return [
            (_group_box if g.size > 1 else _node_box)(graph, g, changed, rename)
            for g in grouped.groups
        ]
    top = max((g.flops for g in grouped.groups if not g.key.startswith("%")), default=0)
    return [
        _node_box(graph, g, changed, rename)
        if g.key.startswith("%")
        else _module_box(graph, g, changed, rename, top)
        for g in grouped.groups
    ]


@dataclass
class _Scene:
    """A grouped graph, its boxes and their layout: what the SVG and the figure draw."""

    grouped: GroupedGraph
    boxes: list[_Box]
    layout: Layout


def _renamer(graph: Graph, source_names: SourceNames | None) -> Callable[[str], str]:
    """Replace source file names (full paths and the basenames IR locations use) with what
    `source_names` calls them, e.g. ipykernel's cell files with "In [3]"."""
    if source_names is None:
        return lambda text: text
    paths = {f.file for n in graph.nodes for f in n.frames}
    table: dict[str, str] = {}
    for path in sorted(paths, key=len, reverse=True):
        name = source_names(path)
        if name:
            table[path] = name
            table.setdefault(os.path.basename(path), name)
    if not table:
        return lambda text: text
    pattern = re.compile("|".join(re.escape(k) for k in sorted(table, key=len, reverse=True)))
    return lambda text: pattern.sub(lambda m: table[m.group(0)], text)


def _scene(
    graph: Graph,
    by: str,
    budget: int,
    expand: Iterable[str],
    changed: frozenset[int],
    source_names: SourceNames | None = None,
) -> _Scene:
    rename = _renamer(graph, source_names)
    with gc_paused():
        grouped = group_graph(graph, by=by, budget=budget, expand=expand)
        boxes = _boxes(graph, grouped, changed, rename)
        pairs = [(e.src, e.dst) for e in grouped.edges]
        upward, order = _phases(grouped) if grouped.by == "module" else (set(), [])
        placed = [p for k, p in enumerate(pairs) if k not in upward]
        layout = layered_layout(
            [(b.width, _BOX_H) for b in boxes],
            placed + order,
            node_gap=14,
            layer_gap=34,
        )
        routes = iter(layout.routes)
        layout.routes = [  # an edge back to an earlier phase: straight, not placed by
            [(layout.x[a], layout.y[a] + _BOX_H / 2), (layout.x[b], layout.y[b] - _BOX_H / 2)]
            if k in upward
            else next(routes)
            for k, (a, b) in enumerate(pairs)
        ]
    return _Scene(grouped, boxes, layout)


_PHASE_RANK = {"forward": 0, "backward": 1, "optimizer": 2}


def _phases(grouped: GroupedGraph) -> tuple[set[int], list[tuple[int, int]]]:
    """What keeps a module view's phases in order, top to bottom, and their bands apart:
    the edges (by index) from a box of a later phase to one of an earlier phase (a value
    the backward made that a forward box holds), left out of the layout; and layout-only
    edges that put every forward box above the backward band and every backward box above
    the optimizer's: from each box of one phase to the boxes of the next phase that nothing
    of that phase feeds."""
    rank = [_PHASE_RANK.get(g.phase, 0) for g in grouped.groups]
    upward = {k for k, e in enumerate(grouped.edges) if rank[e.src] > rank[e.dst]}
    phase = [g.phase for g in grouped.groups]
    fed = {e.dst for e in grouped.edges if phase[e.src] == phase[e.dst]}
    extra = []
    for before, after in (("forward", "backward"), ("backward", "optimizer")):
        later = [i for i, p in enumerate(phase) if p == after]
        # a cycle inside the later phase leaves it no top: then every box of it
        tops = [i for i in later if i not in fed] or later
        extra += [(i, j) for i, p in enumerate(phase) if p == before for j in tops]
    return upward, extra


def layout(
    graph: Graph, *, by: str = "auto", budget: int = NODE_BUDGET, expand: Iterable[str] = ()
) -> tuple[GroupedGraph, Layout]:
    """The boxes a view draws (groups above `budget` nodes) and where: box i of
    `grouped.groups` is centred at (layout.x[i], layout.y[i]); route k follows
    `grouped.edges[k]`. For custom drawings and for benchmarks."""
    scene = _scene(graph, by, budget, expand, frozenset())
    return scene.grouped, scene.layout


# -- SVG -----------------------------------------------------------------------------------


def _straighten(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Drop points in the middle of vertical runs (a long edge's virtual nodes mostly line
    up): the same drawing in a fraction of the bytes."""
    out = [points[0]]
    for k in range(1, len(points) - 1):
        if not (abs(points[k][0] - out[-1][0]) < 0.5 and abs(points[k + 1][0] - out[-1][0]) < 0.5):
            out.append(points[k])
    out.append(points[-1])
    return out


def _path(points: list[tuple[float, float]]) -> str:
    """Straight down where x stays, vertical S-curves where it moves; whole pixels."""
    points = _straighten(points)
    (x, y), rest = points[0], points[1:]
    parts = [f"M{x:.0f},{y:.0f}"]
    for nx, ny in rest:
        if abs(nx - x) < 0.5:
            parts.append(f"V{ny:.0f}")
        else:
            mid = (y + ny) / 2
            parts.append(f"C{x:.0f},{mid:.0f} {nx:.0f},{mid:.0f} {nx:.0f},{ny:.0f}")
        x, y = nx, ny
    return "".join(parts)


def _edge_svg(scene: _Scene) -> list[str]:
    out, labelled = [], set()
    for k, edge in enumerate(scene.grouped.edges):
        route = scene.layout.routes[k]
        if not route:
            continue
        src, dst = scene.grouped.groups[edge.src], scene.grouped.groups[edge.dst]
        shape = ", ".join(edge.shapes)
        count = f" ({edge.count} edges)" if edge.count > 1 else ""
        tip = f"{src.key} → {dst.key}{count}: {shape}"
        direct = len(route) == 2 and abs(route[1][1] - route[0][1]) > 2 * (_BOX_H + 34)
        style = ' stroke-dasharray="4 3" opacity="0.55"' if direct else ""
        # f<i>/t<j>: the boxes it joins, for hover highlighting (_hover_css)
        out.append(
            f'<path d="{_path(route)}" class="e f{edge.src} t{edge.dst}"{style} '
            f'marker-end="url(#tpu-nb-arrow)"><title>{esc(tip)}</title></path>'
        )
        # One label per box, under it: labels of a box's other edges would start at the
        # same point and overprint (each edge's tooltip has its shapes).
        if edge.src not in labelled and shape:
            labelled.add(edge.src)
            x, y = route[0][0] + 4, route[0][1] + 11
            text = _fit(shape, 30) + (f" ×{edge.count}" if edge.count > 1 and src.size > 1 else "")
            out.append(f'<text x="{x:.1f}" y="{y:.1f}" class="s">{esc(text)}</text>')
    return out


def _node_svg(scene: _Scene) -> list[str]:
    out = []
    lay = scene.layout
    for i, box in enumerate(scene.boxes):
        fill, stroke = (
            PHASE_COLOURS[box.phase]
            if box.phase
            else KIND_STYLES.get(box.kind, KIND_STYLES["compute"])[:2]
        )
        x, y = lay.x[i] - box.width / 2, lay.y[i] - _BOX_H / 2
        width = 2.6 if box.output or box.kind == "fallback" else 1.2
        extra = ""
        if box.heaviest:
            stroke, width = HEAVIEST, 3.0
        if box.changed:
            stroke, width, extra = CHANGED, 3.0, ' stroke-dasharray="5 2"'
        shadow = (
            f'<rect x="{x + 3:.1f}" y="{y + 3:.1f}" width="{box.width:.1f}" '
            f'height="{_BOX_H}" rx="4" fill="{fill}" stroke="{stroke}" '
            f'stroke-width="0.8"/>'
            if box.group
            else ""
        )
        out.append(
            f'<g class="nd n{i}"><title>{esc(box.title)}</title>{shadow}'
            f'<rect x="{x:.1f}" y="{y:.1f}" width="{box.width:.1f}" height="{_BOX_H}" rx="4" '
            f'fill="{fill}" stroke="{stroke}" stroke-width="{width}"{extra}/>'
            f'<text x="{lay.x[i]:.1f}" y="{y + 14:.1f}" class="o">{esc(box.line1)}</text>'
            f'<text x="{lay.x[i]:.1f}" y="{y + 27:.1f}" class="d">{esc(box.line2)}</text>'
            + _bar(box, x, y)
            + "</g>"
        )
    return out


def _bar(box: _Box, x: float, y: float) -> str:
    """A module box's FLOPs as a bar along its bottom edge, full width for the heaviest."""
    if box.share <= 0:
        return ""
    colour = HEAVIEST if box.heaviest else PHASE_COLOURS[box.phase][1]
    return (
        f'<rect x="{x + 2:.1f}" y="{y + _BOX_H - 5:.1f}" height="3" '
        f'width="{max(box.share * (box.width - 4), 1.5):.1f}" fill="{colour}" class="bar"/>'
    )


def _bands(scene: _Scene) -> list[str]:
    """Behind a module view, each phase's stretch of the picture, named at the left."""
    if scene.grouped.by != "module":
        return []
    spans: dict[str, list[float]] = {}
    for i, group in enumerate(scene.grouped.groups):  # single nodes too
        if group.phase in ("forward", "backward", "optimizer"):
            spans.setdefault(group.phase, []).append(scene.layout.y[i])
    out = []
    width = max(scene.layout.width, 60)
    for phase in (p for p in PHASES if p in spans):
        lo, hi = min(spans[phase]), max(spans[phase])
        fill = PHASE_COLOURS[phase][0]
        top, height = lo - _BOX_H / 2 - 8, hi - lo + _BOX_H + 16
        out.append(
            f'<rect x="2" y="{top:.0f}" width="{width - 4:.0f}" height="{height:.0f}" rx="6" '
            f'fill="{fill}" opacity="0.45" class="band"/>'
            f'<text x="8" y="{top + 12:.0f}" class="s band-label">{esc(phase)}</text>'
        )
    return out


_STYLE = (
    "<style>.e{fill:none;stroke:#64748b;stroke-width:1.1}"
    f".s{{font-size:{_SMALL}px;fill:#475569}}"
    f".o{{font-size:{_FONT}px;text-anchor:middle;fill:#0f172a}}"
    f".d{{font-size:{_SMALL}px;text-anchor:middle;fill:#475569}}"
    ".nd{cursor:default}</style>"
)
_HOVER = "#d97706"  # a hovered box's edges and neighbours


def _hover_css(scene: _Scene, scope: str) -> str:
    """CSS that lights up, while a box is hovered, its edges and its neighbours' borders and
    dims the other edges: no script, so it works wherever the view's <style> does."""
    near: dict[int, set[int]] = {}
    for e in scene.grouped.edges:
        near.setdefault(e.src, set()).add(e.dst)
        near.setdefault(e.dst, set()).add(e.src)
    rules = [
        f"{scope} svg:has(.nd:hover) .e{{opacity:.25}}",
        f"{scope} .nd:hover>rect:last-of-type{{stroke:{_HOVER};stroke-width:3px}}",
    ]
    for i, others in sorted(near.items()):
        on = f"{scope} svg:has(.n{i}:hover)"
        rules.append(f"{on} :is(.f{i},.t{i}){{opacity:1;stroke:{_HOVER};stroke-width:2.4px}}")
        boxes = ",".join(f".n{j}" for j in sorted(others))
        rules.append(f"{on} :is({boxes})>rect:last-of-type{{stroke:{_HOVER};stroke-width:2.4px}}")
    return "<style>" + "".join(rules) + "</style>"


def _svg(scene: _Scene) -> str:
    lay = scene.layout
    w, h = max(lay.width, 60), max(lay.height, 40)
    # Natural size: front ends shrink SVG to the output's width (JupyterLab: max-width 100%),
    # which makes a big graph's labels unreadable; the frame around it scrolls instead.
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w:.0f}" height="{h:.0f}" '
        f'viewBox="0 0 {w:.0f} {h:.0f}" font-family="monospace" class="tpunb-chart" '
        f'style="background:#ffffff;max-width:none;height:auto;display:block">',
        _STYLE,
        '<defs><marker id="tpu-nb-arrow" viewBox="0 0 8 8" refX="7" refY="4" '
        'markerWidth="7" markerHeight="7" orient="auto">'
        '<path d="M0,0L8,4L0,8z" fill="#64748b"/></marker></defs>',
        f'<rect width="{w:.0f}" height="{h:.0f}" fill="#ffffff"/>',
    ]
    parts += _bands(scene)
    parts += _edge_svg(scene)
    parts += _node_svg(scene)
    parts.append("</svg>")
    return "".join(parts)


def render_svg(
    graph: Graph,
    *,
    by: str = "auto",
    budget: int = NODE_BUDGET,
    expand: Iterable[str] = (),
    diff: GraphDiff | None = None,
    source_names: SourceNames | None = None,
) -> str:
    """The graph (or, above `budget` nodes, its groups) as a standalone SVG document."""
    return _svg(_scene(graph, by, budget, expand, _changed(diff), source_names))


def _changed(diff: GraphDiff | None) -> frozenset[int]:
    return diff.changed_ids if diff is not None else frozenset()


# -- HTML ----------------------------------------------------------------------------------


def _swatch(fill: str, border: str) -> str:
    background = f"background:{fill};" if fill else ""
    return (
        f'<span style="display:inline-block;width:10px;height:10px;{background}'
        f'border:{border};margin:0 3px 0 10px;vertical-align:middle"></span>'
    )


def _legend(scene: _Scene) -> str:
    present = Counter(b.kind for b in scene.boxes if not b.phase)
    items = [
        _swatch(PHASE_COLOURS[p][0], f"1.5px solid {PHASE_COLOURS[p][1]}") + esc(p)
        for p in PHASES
        if any(b.phase == p for b in scene.boxes)
    ]
    if any(b.heaviest for b in scene.boxes):
        items.append(
            _swatch("#ffffff", f"3px solid {HEAVIEST}") + "most FLOPs (bar: a box's share)"
        )
    for kind in (k for k in KINDS if present[k]):
        fill, stroke, name = KIND_STYLES[kind]
        items.append(_swatch(fill, f"1.5px solid {stroke}") + esc(name))
    if any(b.changed for b in scene.boxes):
        items.append(_swatch("", f"2px dashed {CHANGED}") + "changed")
    items.append('<span style="margin-left:10px">thick border: graph output</span>')
    return "".join(items)


def _notes(graph: Graph, scene: _Scene) -> list[str]:
    notes = []
    # (a graph small enough to draw node by node reads without module boxes)
    if (
        scene.grouped.by not in ("module", "node")
        and graph.pending
        and any(n.kind not in ("data", "constant", "view") for n in graph.nodes)
    ):
        lines = any(n.location for n in graph.nodes)
        notes.append(
            "This graph was traced before module scopes were on, so its nodes name "
            + ("no module" if lines else "neither module nor line (groups: ranges of ids)")
            + ". To see forward, backward and optimizer by module, run the step as "
            "<code style='white-space:nowrap'>%%on_tpu --graph</code> and look again."
        )
    if graph.fallback_ops:
        ops = ", ".join(f"{esc(op)} ×{count}" for op, count in graph.fallback_ops)
        notes.append(
            f"<b>CPU fallbacks</b> ran in this process: {ops}. They run eagerly on "
            "the host while tracing, so they are not nodes here: their results "
            "enter the graph as device data."
        )
    if scene.layout.direct_edges:
        notes.append(f"{scene.layout.direct_edges} very long edges are drawn dashed and straight.")
    if not graph.pending:
        notes.append(
            "Nothing pending: these tensors are already device data (capture "
            "the graph before the sync that runs it)."
        )
    return notes


def _header(graph: Graph, scene: _Scene, title: str | None) -> str:
    grouped = scene.grouped
    shown = ""
    if grouped.collapsed:
        names = {"module": "phase and module", "line": "source line", "range": "id range"}
        how = names.get(grouped.by, grouped.by)
        shown = (
            f" · shown as {len(grouped.groups)} groups by {how} (more than {grouped.budget} nodes)"
        )
    head = esc(title) if title else "XLA graph"
    return f"<b>{head}</b>: {esc(graph.summary())}{shown}"


_SOURCE_FILE = re.compile(r'source_file="([^"]*)"')


def _short_sources(hlo: str) -> str:
    """The HLO's source files as the report names them (`torch/nn/modules/linear.py`, a
    cell's "In [3]"), not as absolute paths of this machine."""
    short = functools.cache(short_path)
    return _SOURCE_FILE.sub(lambda found: f'source_file="{short(found.group(1))}"', hlo)


def _text_panel(summary: str, text: str, limit: int) -> str:
    cut = ""
    if len(text) > limit:
        cut = (
            f"\n… {len(text) - limit:,} more characters: graph.ir_text() / graph.hlo() "
            "return all of it"
        )
        text = text[:limit]
    return (
        f"<details><summary style='cursor:pointer'>{esc(summary)}</summary>"
        f'<pre style="{style.PRE};max-height:420px;overflow:auto;font-size:11px;'
        f'line-height:1.3">{esc(text)}{esc(cut)}</pre></details>'
    )


def _groups_panel(scene: _Scene) -> str:
    grouped = scene.grouped
    if not grouped.collapsed:
        return ""
    rows = []
    big = sorted((g for g in grouped.groups if g.size > 1), key=lambda g: -g.size)
    for g in big[:300]:
        ops = ", ".join(f"{op} {c}" for op, c in g.ops[:4])
        rows.append(
            (f"<code style='{style.CODE}'>{esc(_quoted(g.key))}</code>", str(g.size), esc(ops))
        )
    more = f"<div>… and {len(big) - 300} smaller groups</div>" if len(big) > 300 else ""
    return (
        "<details><summary style='cursor:pointer'>Groups, largest first: draw one node "
        f"by node with <code style='{style.CODE}'>%xla_graph --expand KEY tensors</code> "
        f"(or <code style='{style.CODE}'>GraphView(graph).expand(KEY)</code>)</summary>"
        f"<div style='font-size:11px'>{style.table(rows, ('key', 'nodes', 'ops'))}</div>"
        f"{more}</details>"
    )


def render_html(
    graph: Graph,
    *,
    by: str = "auto",
    budget: int = NODE_BUDGET,
    expand: Iterable[str] = (),
    diff: GraphDiff | None = None,
    title: str | None = None,
    max_text: int = MAX_TEXT,
    source_names: SourceNames | None = None,
) -> str:
    """The graph as one self-contained HTML fragment: SVG picture, legend, notes, and the
    group list, IR text and HLO in collapsible panels. No JavaScript."""
    scene = _scene(graph, by, budget, expand, _changed(diff), source_names)
    picture = _svg(scene)
    parts = [
        f'<div class="tpunb tpu-nb-graph" style="{style.ROOT};'
        'font-family:system-ui,sans-serif;font-size:13px">',
        style.STYLE,
        f"<div>{_header(graph, scene, title)}</div>",
    ]
    parts += [
        f'<div style="color:{style.WARN};margin:2px 0">{note}</div>'
        for note in _notes(graph, scene)
    ]
    if diff is not None:
        parts.append(_diff_panel(diff))
    parts.append(_frame(scene, picture))
    parts.append(f'<div style="font-size:11px;margin-bottom:4px">{_legend(scene)}</div>')
    parts.append(_groups_panel(scene))
    # the graph's hash (torch_xla's id for it, as compile logs name it) with the IR, not in
    # the sentence above the picture
    digest = f" · graph hash {graph.hash[:16]}" if graph.hash else ""
    texts = [(f"IR text ({len(graph.nodes):,} nodes){digest}", graph.ir_text())]
    texts += [("HLO", _short_sources(graph.hlo_text))] if graph.hlo_text is not None else []
    room = (MAX_HTML - sum(len(p) for p in parts)) // len(texts)
    limit = max(2_000, min(max_text, room * 4 // 5))  # escaping can grow text by ~1/4
    parts += [_text_panel(summary, text, limit) for summary, text in texts]
    parts.append("</div>")
    return "".join(parts)


_ZOOMS = (("fit", None), ("50%", 0.5), ("100%", 1.0), ("200%", 2.0))
# Drag to pan, where the front end runs an output's scripts (JupyterLab and Notebook with a
# trusted notebook, VS Code, Colab); elsewhere the frame's scroll bars do it. No "<" or "&"
# in it: the view stays well-formed XML.
_PAN = (
    "(function(){var v=document.getElementById('VIEW');if(!v||v.dataset.pan)return;"
    "v.dataset.pan='1';var f=v.querySelector('.tpunb-frame');var d=null;"
    "f.style.cursor='grab';"
    "f.addEventListener('pointerdown',function(e){if(e.button!==0)return;"
    "if(e.target.closest('input,label,a'))return;"
    "d=[e.clientX,e.clientY,f.scrollLeft,f.scrollTop];f.setPointerCapture(e.pointerId);"
    "f.style.cursor='grabbing';f.style.userSelect='none';});"
    "f.addEventListener('pointermove',function(e){if(!d)return;"
    "f.scrollLeft=d[2]-(e.clientX-d[0]);f.scrollTop=d[3]-(e.clientY-d[1]);});"
    "function up(){d=null;f.style.cursor='grab';f.style.userSelect='';}"
    "f.addEventListener('pointerup',up);f.addEventListener('pointercancel',up);})();"
)


def _frame(scene: _Scene, picture: str) -> str:
    """The picture at its natural size in a scrolling frame, with zoom buttons (radio inputs
    and CSS: no script, so Colab, nbviewer and exported HTML zoom too), hover highlights, and
    drag-to-pan where scripts run. After the SVG, the same SVG as an <img>, which the view's
    stylesheet hides: JupyterLab's sanitizer (an untrusted notebook: one downloaded, or run
    by someone else) strips the inline SVG and every <style>, keeps an <img> with a data: URI,
    and leaves the SVG's text behind, which the frame's font size of 0 hides; the zoom
    buttons, which need the stylesheet, show only with it.
    The frame's id comes from the picture, so the same graph gives the same HTML."""
    # The id is masked by the nbval sanitizer (a hex word): cell names inside the picture
    # differ between a recording and a test run.
    view = "tpunb-g-" + hashlib.sha1(picture.encode()).hexdigest()[:10]
    scope = f"#{view}"
    w, h = max(scene.layout.width, 60), max(scene.layout.height, 40)
    rules = [f"{scope} .tpunb-graph-picture{{display:none!important}}"]
    rules.append(f"{scope} .tpunb-zoom{{display:inline!important}}")
    buttons = []
    hidden = "display:none;vertical-align:middle"  # shown by the rule above
    for label, z in _ZOOMS:
        cls = "tpunb-zoom-" + ("fit" if z is None else str(int(z * 100)))
        size = f"{w * z:.0f}px" if z else "100%!important;max-width:100%"
        rules.append(
            f"{scope} .{cls}:checked~.tpunb-frame svg"
            f"{{width:{size}!important;height:auto!important}}"
        )
        checked = ' checked="checked"' if z == 1.0 else ""
        buttons.append(
            f'<input type="radio" name="{view}-zoom" id="{view}-{cls}" '
            f'class="{cls} tpunb-zoom"{checked} style="margin:0 2px 0 8px;{hidden}"/>'
            f'<label for="{view}-{cls}" class="tpunb-zoom" style="font-size:11px;'
            f'cursor:pointer;{hidden}">{label}</label>'
        )
    alt = esc(f"XLA graph: {len(scene.boxes)} boxes")
    return (
        f'<div id="{view}" class="tpunb-graph-view" style="margin:4px 0">'
        f"<style>{''.join(rules)}</style>{_hover_css(scene, scope)}"
        f'<span class="tpunb-zoom" style="font-size:11px;color:{style.MUTED};{hidden}">'
        f"zoom</span>{''.join(buttons)}"
        f'<div class="tpunb-frame" style="overflow:auto;max-height:640px;max-width:100%;'
        f'border:1px solid {style.LINE};margin:4px 0;font-size:0;line-height:0">{picture}'
        f'<img class="tpunb-graph-picture" alt="{alt}" width="{w:.0f}" height="{h:.0f}" '
        'style="display:block;max-width:none" '
        f'src="data:image/svg+xml;base64,{b64encode(picture.encode()).decode()}"/></div>'
        f"<script>{_PAN.replace('VIEW', view)}</script></div>"
    )


def _diff_panel(diff: GraphDiff) -> str:
    head, *rest = str(diff).splitlines()
    more = "\n".join(rest)
    return (
        f'<div style="margin:2px 0"><b>Difference from the earlier graph</b>: {esc(head)}</div>'
        + (
            f'<pre style="font-size:11px;max-height:200px;overflow:auto;margin:2px 0">'
            f"{esc(more)}</pre>"
            if rest
            else ""
        )
    )


# -- notebook objects ----------------------------------------------------------------------


class GraphView:
    """A graph as a notebook shows it: HTML (SVG picture, panels) via `_repr_html_`, and a
    stable one-line plain-text repr (no hash, no timings) for text outputs and nbval.

    by: what groups nodes above the budget: "auto" (scope if the code opened any, else
        source line, else id ranges), "line", "function", "file", "scope", "range".
    budget: up to this many nodes every node is drawn; above it, about 40 groups.
    expand: group keys (or a source key, for all its pieces) to draw node by node; a group
        bigger than the budget opens into sub-groups.
    diff: outline the nodes that changed (`later.diff(earlier)`, drawn on the later graph).
    source_names: path -> a name for people or None, e.g. a notebook cell's file -> "In [3]"
        (labels and tooltips; group keys stay raw, as `expand` takes them).
    """

    def __init__(
        self,
        graph: Graph,
        *,
        by: str = "auto",
        budget: int = NODE_BUDGET,
        expand: Iterable[str] = (),
        diff: GraphDiff | None = None,
        title: str | None = None,
        source_names: SourceNames | None = None,
    ) -> None:
        self.graph = graph
        self.by, self.budget, self.expanded = by, budget, tuple(expand)
        self.diff, self.title, self.source_names = diff, title, source_names

    def grouped(self) -> GroupedGraph:
        """The boxes this view draws (their keys are what `expand` takes)."""
        return group_graph(self.graph, by=self.by, budget=self.budget, expand=self.expanded)

    def _options(self) -> dict:
        return {
            "by": self.by,
            "budget": self.budget,
            "expand": self.expanded,
            "diff": self.diff,
            "source_names": self.source_names,
        }

    def expand(self, *keys: str) -> GraphView:
        """The same view with the named groups drawn node by node."""
        options = self._options() | {"expand": self.expanded + keys}
        return GraphView(self.graph, title=self.title, **options)

    def _repr_html_(self) -> str:
        return render_html(self.graph, title=self.title, **self._options())

    def to_svg(self) -> str:
        return render_svg(self.graph, **self._options())

    def save(self, path: str) -> None:
        """Write a standalone HTML page (opens in any browser, no network needed)."""
        with open(path, "w", encoding="utf-8") as f:
            f.write(
                '<!DOCTYPE html><html><head><meta charset="utf-8"><title>XLA graph'
                f"</title></head><body>{self._repr_html_()}</body></html>"
            )

    def __repr__(self) -> str:
        g = self.graph
        return f"<GraphView: {len(g.nodes)} nodes, {len(g.edges)} edges, {len(g.roots)} outputs>"
