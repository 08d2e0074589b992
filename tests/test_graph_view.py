"""The graph picture: well-formed SVG with tooltips, escaped user strings, HTML panels."""

import xml.etree.ElementTree as ET

import torch
import torch_xla

import tpu_nb
from tpu_nb.display.graph_view import GraphView, render_html, render_svg
from tpu_nb.runtime.graph import graph, record_locations

SVG = "{http://www.w3.org/2000/svg}"


def _small_graph(head=lambda y: torch.softmax(y, dim=-1)):
    """A Linear layer and `head` on the device, traced with source locations."""
    dev = tpu_nb.device()
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 3).to(dev)
    x = torch.randn(2, 4).to(dev)
    torch_xla.sync()
    with record_locations():
        out = head(layer(x))
    return graph(out)


def _titles(svg: str) -> list[str]:
    return [t.text for t in ET.fromstring(svg).iter(f"{SVG}title")]


def test_svg_is_well_formed_with_a_box_per_node_and_hover_tooltips():
    g = _small_graph()
    svg = render_svg(g)
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    boxes = [grp for grp in root.iter(f"{SVG}g") if grp.find(f"{SVG}rect") is not None]
    assert len(boxes) == len(g.nodes)
    titles = _titles(svg)
    softmax = next(t for t in titles if "aten::softmax" in t)
    assert "shape f32[2,3]" in softmax and "line " in softmax and "test_graph_view.py:" in softmax
    edge_tips = [t for t in titles if "→" in t]
    assert len(edge_tips) == len({(e.src, e.dst) for e in g.edges})
    assert any(t.endswith(": f32[2,3]") for t in edge_tips)  # shapes on the edges
    labels = [t.text for t in root.iter(f"{SVG}text")]
    assert "softmax" in labels and "f32[2,3]" in labels


def test_html_is_self_contained_with_ir_and_hlo_panels():
    g = _small_graph()
    page = render_html(g)
    # One small script: drag to pan, where scripts run (scroll bars elsewhere).
    assert page.count("<script>") == 1 and "pointermove" in page
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    assert page.count("<details>") == 2  # IR text and HLO (no groups: small graph)
    assert "aten::softmax" in page and "HloModule" in page
    assert "graph hash" in page.split("<details>")[1]  # with the IR text, not in a sentence
    ET.fromstring(page)  # the whole fragment is well-formed XML too


def test_a_function_named_like_a_script_tag_renders_as_text():
    dev = tpu_nb.device()
    x = torch.randn(3, device=dev)
    torch_xla.sync()
    namespace = {}
    exec(compile("def f(t):\n    return t * 2\n", 'we"ird&<file>.py', "exec"), namespace)
    f = namespace["f"]
    f.__code__ = f.__code__.replace(co_name="<script>alert(1)</script>")
    with record_locations():
        y = f(x)
    g = graph(y)
    mul = next(n for n in g.nodes if n.op == "aten::mul")
    assert mul.location.function == "<script>alert(1)</script>"
    assert mul.location.file == 'we"ird&<file>.py'
    page = render_html(g)
    svg = render_svg(g)
    for text in (page, svg):
        assert "<script>alert" not in text and "<file>" not in text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    tip = next(t for t in _titles(svg) if "aten::mul" in t)
    assert '<script>alert(1)</script>@we"ird&<file>.py:2' in tip  # shown as text
    ET.fromstring(page)
    # the picture an untrusted notebook shows is the same SVG, escaped the same way
    assert "<script>alert" not in _picture(page) and "&lt;script&gt;alert" in _picture(page)


def _picture(page: str) -> str:
    from base64 import b64decode

    root = ET.fromstring(page)
    (img,) = [e for e in root.iter("img") if e.get("class") == "tpunb-graph-picture"]
    return b64decode(img.get("src").removeprefix("data:image/svg+xml;base64,")).decode()


def test_where_a_sanitizer_strips_svg_and_styles_the_picture_shows_and_nothing_loose():
    """JupyterLab's untrusted outputs lose every <svg> and <style>, keep inline styles and an
    <img> with a data: URI, and leave the SVG's text behind: the view then shows the same
    picture as an image, hides that text, and hides the zoom buttons that need the styles.
    With the styles, the stylesheet hides the image and shows the buttons."""
    g = _small_graph()
    page, svg = render_html(g), render_svg(g)
    assert _picture(page) == svg
    root = ET.fromstring(page)
    (view,) = [e for e in root.iter("div") if e.get("class") == "tpunb-graph-view"]
    frame = next(e for e in view if e.get("class") == "tpunb-frame")
    assert "font-size:0" in frame.get("style")  # the stripped SVG's text: not shown
    img = frame.find("img")
    assert (img.get("width"), img.get("height")) == (
        ET.fromstring(svg).get("width"),
        ET.fromstring(svg).get("height"),
    )
    zoom = [e for e in view if "tpunb-zoom" in (e.get("class") or "").split()]
    assert len(zoom) == 9 and all("display:none" in e.get("style") for e in zoom)
    rules = "".join(e.text for e in view.iter("style"))
    view_id = view.get("id")
    assert f"#{view_id} .tpunb-graph-picture{{display:none!important}}" in rules
    assert f"#{view_id} .tpunb-zoom{{display:inline!important}}" in rules


def test_graph_view_has_a_stable_plain_repr_and_html():
    g = _small_graph()
    view = GraphView(g)
    assert repr(view) == f"<GraphView: {len(g.nodes)} nodes, {len(g.edges)} edges, 1 outputs>"
    assert view._repr_html_().startswith('<div class="tpunb tpu-nb-graph"')
    ET.fromstring(view.to_svg())


def test_diff_view_outlines_the_changed_nodes():
    before = _small_graph()
    dev = tpu_nb.device()
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 3).to(dev)
    x = torch.randn(5, 4).to(dev)
    torch_xla.sync()
    with record_locations():
        after = graph(torch.softmax(layer(x), dim=-1))
    d = after.diff(before)
    page = render_html(d.after, diff=d, title="XLA graph (changed)")
    ET.fromstring(page)
    assert "Difference from the earlier graph" in page and "f32[2,3] -&gt; f32[5,3]" in page
    svg = render_svg(after, diff=d)
    assert svg.count('stroke-dasharray="5 2"') == len(d.changed_ids)


def test_source_names_rename_cell_files_in_labels_and_tooltips():
    g = _small_graph(lambda y: y.relu())
    names = {__file__: "In [7]"}
    svg = GraphView(g, source_names=names.get).to_svg()
    tips = _titles(svg)
    addmm = next(t for t in tips if "aten::addmm" in t)
    assert "called from In [7]:" in addmm and __file__ not in addmm
    relu = next(t for t in tips if "aten::relu" in t)
    assert "@In [7]:" in relu and "test_graph_view.py" not in relu
    grouped = GraphView(g, by="line", budget=2, source_names=names.get).to_svg()
    assert "In [7]:" in grouped and "test_graph_view.py:" in grouped  # keys stay raw


def _transformer_step(locations: bool):
    """A real model's training step, pending: ~550 nodes (above the node budget)."""
    from tpu_nb.runtime.graph import pending_graph

    dev = tpu_nb.device()
    torch.manual_seed(0)
    with record_locations(locations):
        layer = torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True).to(dev)
        opt = torch.optim.AdamW(layer.parameters())
        loss = layer(torch.randn(8, 16, 64, device=dev)).pow(2).mean()
        loss.backward()
        opt.step()
    found = pending_graph(layer, opt, loss)
    torch_xla.sync()
    return found


def test_a_real_training_step_is_an_overview_of_at_most_40_boxes_at_natural_size():
    for locations in (False, True):
        g = _transformer_step(locations)
        assert len(g.nodes) > 500
        view = GraphView(g)
        grouped = view.grouped()
        assert 20 <= len(grouped.groups) <= 40, grouped
        assert grouped.by == ("module" if locations else "range")
        page = view._repr_html_()
        ET.fromstring(page)
        svg = ET.fromstring(view.to_svg())
        # Drawn at its natural size (front ends shrink SVG to the output width otherwise),
        # in a scrolling frame with zoom buttons; text no smaller than 10 px.
        assert "max-width:none" in svg.get("style")
        assert "overflow:auto" in page and 'class="tpunb-zoom-fit tpunb-zoom"' in page
        sizes = {
            float(m)
            for m in __import__("re").findall(
                r"font-size:(\d+)px", page[page.index("<svg") : page.index("</svg>")]
            )
        }
        assert sizes and min(sizes) >= 10, sizes


def test_hovering_a_box_lights_its_edges_and_neighbours_and_hints_name_magic_flags():
    g = _transformer_step(False)
    view = GraphView(g)
    page = view._repr_html_()
    grouped = view.grouped()
    edge = grouped.edges[0]
    # Each box's hover rule names its own edges and its neighbours (CSS only, no script).
    assert f"svg:has(.n{edge.src}:hover) :is(.f{edge.src},.t{edge.src})" in page
    rule = page.split(f"svg:has(.n{edge.src}:hover) :is(")[2].split(")")[0]
    assert f".n{edge.dst}" in rule.split(",")
    assert f'class="e f{edge.src} t{edge.dst}"' in page
    assert "record_locations" not in page and "%%on_tpu --graph" in page
    assert "%xla_graph --expand" in page and "GraphView(graph, expand=" not in page
    # One small script: drag to pan, where scripts run (scroll bars elsewhere).
    assert page.count("<script>") == 1 and "pointermove" in page


def test_on_tpu_graph_labels_name_the_cell_not_its_temporary_file(shell, monkeypatch):
    from tpu_nb.ipython import _on_tpu as magics  # where %%on_tpu shows its views

    shown = []
    monkeypatch.setattr(magics, "display", shown.append)
    shell.run_cell(
        "%%on_tpu --graph\n"
        "lab = torch.nn.Linear(6, 6)\n"
        "pre = torch.ones(3, 6)\n"
        "for _ in range(40):\n"
        "    pre = lab(pre).tanh()\n"
    )
    (view,) = [v for v in shown if isinstance(v, GraphView)]
    svg = view.to_svg()
    import re

    assert re.search(r"In \[\d+\]:5\b", svg)  # the cell's line 5, by its name
    assert not re.search(r"\d+\.py:5\b", svg)  # not ipykernel's file for it
    assert "defaults.py" not in svg


def test_a_small_graph_drawn_node_by_node_does_not_ask_for_module_scopes():
    x = torch.ones(4, 4, device=torch_xla.device())
    page = GraphView(tpu_nb.graph((x @ x).relu()))._repr_html_()
    assert "module scopes" not in page and "%%on_tpu --graph" not in page
    # a step big enough to be drawn in groups, traced without the scopes, does
    assert "module scopes were on" in GraphView(_transformer_step(False))._repr_html_()


def test_the_hlo_names_source_files_as_the_report_does_not_by_machine_paths():
    import torch.nn.modules.linear as linear

    from tpu_nb.display.graph_view import _short_sources

    hlo = f'metadata={{op_type="aten__addmm" source_file="{linear.__file__}" source_line=125}}'
    assert _short_sources(hlo) == (
        'metadata={op_type="aten__addmm" source_file="torch/nn/modules/linear.py" source_line=125}'
    )
