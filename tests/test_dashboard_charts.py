"""The dashboard's SVG charts (live and final) and the snapshot the monitor publishes, on real
XLA:CPU runs.

What the charts draw is the monitor's published state (the step-time series, the compiles):
each test reads the figures back out of the SVG and compares them with the state. The SVG is
parsed as XML, so an unescaped character anywhere fails the test.
"""

import ast
import re
import xml.etree.ElementTree as ET
from base64 import b64decode
from pathlib import Path

import torch
import torch_xla
import torch_xla.core.xla_model as xm
from conftest import sgd_step

import tpu_nb
from tpu_nb.display import dashboard as D
from tpu_nb.display import style
from tpu_nb.display.live_charts import CompileSvg, StepTimeSvg
from tpu_nb.runtime.live import LiveCompile, LiveMonitor, StepPoint
from tpu_nb.runtime.metrics import CompileEvent, Frame
from tpu_nb.runtime.units import format_seconds

SVG = "{http://www.w3.org/2000/svg}"
ROOT = Path(__file__).resolve().parents[1]


def _mlp_step(width):
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(width, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
    ).to(tpu_nb.device())
    return sgd_step(model, width)


def _run(monitor, step, polls=6, steps=40):
    for _ in range(polls):
        for _ in range(steps):
            step()
        xm.wait_device_ops()  # the executions' times are recorded
        monitor.poll()
    return monitor.poll()


def _points(svg_root, index):
    """The (x, y) points of the `index`-th polyline (0: p90, 1: median)."""
    line = svg_root.findall(f"{SVG}polyline")[index]
    return [tuple(map(float, p.split(","))) for p in line.get("points").split()]


def test_the_step_chart_draws_the_published_series_and_compiles():
    monitor = LiveMonitor()
    state = _run(monitor, _mlp_step(width=23))  # a width no other test compiles: compiles
    monitor.close()
    assert state.series and state.compiles, state
    chart = StepTimeSvg()
    svg = chart.update(state)
    root = ET.fromstring(svg)  # well-formed XML
    # Each published point is drawn where the axes put it: median (solid) and p90 (dashed).
    expected_median = [(p.step, p.median * 1e3) for p in state.series]
    expected_p90 = [(p.step, p.p90 * 1e3) for p in state.series]
    for index, expected in ((1, expected_median), (0, expected_p90)):
        drawn = _points(root, index)
        assert len(drawn) == len(expected)
        for (x, y), (step, ms) in zip(drawn, expected, strict=True):
            assert abs(x - chart.x(step)) <= 0.05 and abs(y - chart.y(ms)) <= 0.05
    # The limits fit the data: no point is clipped at an edge.
    x_top, y_bottom, y_top = chart.limits
    assert all(p.step <= x_top and y_bottom < p.median * 1e3 < y_top for p in state.series)
    # One red line per compile, at the step it happened.
    path = next(p for p in root.iter(f"{SVG}path") if "--tpunb-red" in p.get("style", ""))
    xs = [float(x) for x in re.findall(r"M([\d.]+) ", path.get("d"))]
    assert xs == [round(chart.x(c.step), 1) for c in state.compiles]
    # The tooltip says the latest figures and the compile count.
    title = root.find(f"{SVG}title").text
    last = state.series[-1]
    assert f"median {format_seconds(last.median)}, p90 {format_seconds(last.p90)}" in title
    assert title.endswith(f"{len(state.compiles)} compile{'s' * (len(state.compiles) != 1)}")


def test_the_compile_chart_shows_each_compiles_seconds_and_line():
    monitor = LiveMonitor()
    w = torch.randn(17, 17, device=tpu_nb.device())
    for n in (3, 5, 7):  # three new graphs on one line
        _kept = (torch.ones(n, 17, device=tpu_nb.device()) @ w).sum()
        torch_xla.sync()  # COMPILE-LINE
    xm.wait_device_ops()
    state = monitor.poll()
    monitor.close()
    shown = [c for c in state.compiles if c.seconds is not None]
    assert len(shown) >= 3
    root = ET.fromstring(CompileSvg().update(state))
    bars = root.findall(f".//{SVG}rect")
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert len(bars) == min(len(shown), CompileSvg.SHOWN)
    for c, bar in zip(shown[-CompileSvg.SHOWN :], bars, strict=True):
        assert format_seconds(c.seconds) in texts  # the time at the bar's end
        assert any(t.startswith(f"#{c.index} ") for t in texts)  # its label
        tip = bar.find(f"{SVG}title").text
        assert tip.startswith(f"#{c.index} ") and c.event.graph_hash[:8] in tip
    # The longest compile has the longest bar.
    widths = [float(b.get("width")) for b in bars]
    longest = max(range(len(widths)), key=widths.__getitem__)
    assert shown[-CompileSvg.SHOWN :][longest].seconds == max(c.seconds for c in shown)


def test_an_unchanged_snapshot_does_not_redraw():
    step = _mlp_step(width=19)
    step()
    step()
    xm.wait_device_ops()
    monitor = LiveMonitor()
    state = _run(monitor, step, polls=2, steps=20)
    charts = [StepTimeSvg(), CompileSvg()]
    assert all(chart.update(state) is not None for chart in charts)  # the first drawing
    idle = monitor.poll()  # nothing ran: no new step, no compile
    assert (idle.series_version, idle.compile_version) == (
        state.series_version,
        state.compile_version,
    )
    assert [chart.update(idle) for chart in charts] == [None, None]
    # The dashboard draws nothing either, even with a chart due.
    dash = tpu_nb.Dashboard(widgets=False)
    assert set(dash._draw_live_charts(state)) == {"step", "compile"}
    dash._next_chart = 0.0
    assert dash._draw_live_charts(idle) == {}
    # New steps: the step chart again, the compile chart not (nothing compiled).
    moved = _run(monitor, step, polls=1, steps=20)
    monitor.close()
    assert moved.series_version > idle.series_version
    assert charts[0].update(moved) is not None and charts[1].update(moved) is None


HOSTILE = "<img src=x onerror=alert(1)>&'\"\x0b.py"


def test_strings_in_the_svg_charts_are_escaped():
    event = CompileEvent("user <torch_xla.sync> & 'co'", "f" * 32, (Frame(HOSTILE, 3, "<f>"),))
    compiles = (LiveCompile(1, 2.0, 0.25, event), LiveCompile(2, 4.0, 0.5, None))
    svgs = {"compile": CompileSvg().render(compiles), "step": StepTimeSvg().render((), [2, 4])}
    final = {
        "compile": CompileSvg().render(compiles, final=True),
        "step": StepTimeSvg().render((), [2, 4], final=True),
    }
    for svg in (*svgs.values(), *final.values()):
        ET.fromstring(svg)  # an unescaped <, & or control character would not parse
        assert "<img" not in svg and "\x0b" not in svg
    tip = ET.fromstring(svgs["compile"]).find(f".//{SVG}rect/{SVG}title").text
    assert HOSTILE.replace("\x0b", "\ufffd") in tip and "<torch_xla.sync> & 'co'" in tip
    # The static (final) view carries the SVG charts, each followed by its picture: the same
    # SVG in a data: URI, escaped the same way, with its own colours and background.
    html = D.static_html(None, "finished", "XLA <dashboard>", final)
    assert html.count("<svg ") == 2 and "<img src=x" not in html and "&lt;img src=x" in html
    pictures = _pictures(html)
    assert [p["class"] for p in pictures] == ["tpunb-chart-picture"] * 2
    for picture, name in zip(pictures, ("step", "compile"), strict=True):
        svg = ET.fromstring(picture["svg"])
        assert f"<style>{svg.find(f'{SVG}style').text}</style>" == style.PICTURE_STYLE
        assert svg.find(f"{SVG}rect").get("style") == "fill:var(--tpunb-bg)"  # the background
        drawn = ET.fromstring(final[name])
        assert [t.text for t in svg.iter(f"{SVG}text")] == [
            t.text for t in drawn.iter(f"{SVG}text")
        ]
        assert picture["alt"] == drawn.get("aria-label")
        assert (picture["width"], picture["height"]) == (drawn.get("width"), drawn.get("height"))
    tips = [t.text for t in ET.fromstring(pictures[1]["svg"]).iter(f"{SVG}title")]
    assert any(HOSTILE.replace("\x0b", "\ufffd") in tip for tip in tips)


def _pictures(html: str) -> list[dict]:
    """The final view's chart pictures: each <img>'s attributes, and its SVG decoded."""
    found = []
    for tag in re.findall(r"<img [^>]*>", html):
        attrs = dict(re.findall(r"(\w+)='([^']*)'", tag))
        head, data = attrs.pop("src").split(",", 1)
        assert head == "data:image/svg+xml;base64"
        found.append({**attrs, "svg": b64decode(data).decode()})
    return found


def test_the_final_step_chart_ends_at_the_first_tick_past_the_last_step():
    """The final chart's x axis spans the data, a little more, to a labelled tick: the data
    takes two thirds of the width or more (the live chart's axis only grew, to twice)."""
    for last in (*range(5, 400), 3253, 4940, 12_345, 99_999):
        chart = StepTimeSvg()
        drawn = ET.fromstring(chart.render((StepPoint(last, 0.002, 0.003, 4),), [1], final=True))
        x_top = chart.limits[0]
        assert last * 1.05 <= x_top <= last * 1.5, (last, x_top)
        ticks = [t.text for t in drawn.iter(f"{SVG}text") if t.get("text-anchor") == "middle"]
        values = [float(t[:-1]) * 1e3 if t.endswith("k") else float(t) for t in ticks]
        assert values[-1] == x_top, (last, ticks)  # the right edge's tick
        assert values == sorted(set(values)), (last, ticks)  # each label once
        assert all(v == int(v) for v in values), (last, ticks)  # whole steps


def test_the_final_charts_say_what_did_not_happen_in_the_run():
    live = {"step": StepTimeSvg().render((), []), "compile": CompileSvg().render(())}
    final = {
        "step": StepTimeSvg().render((), [], final=True),
        "compile": CompileSvg().render((), final=True),
    }

    def texts(svg):
        return [t.text for t in ET.fromstring(svg).iter(f"{SVG}text")]

    assert "waiting for the first steps (torch_xla.sync)" in texts(live["step"])
    assert "no graph compiled yet" in texts(live["compile"])
    assert "no step completed: no torch_xla.sync() ran twice" in texts(final["step"])
    assert "no graph compiled in this run" in texts(final["compile"])
    assert not any("yet" in t for svg in final.values() for t in texts(svg))
    step_title = ET.fromstring(final["step"]).find(f"{SVG}title").text
    assert step_title == "step time: no step measured; 0 compiles"


def test_the_monitor_publishes_the_tracked_runs_anatomy_and_wall_time():
    step = _mlp_step(width=21)
    step()
    step()
    monitor = LiveMonitor()
    assert monitor.poll().anatomy is None  # outside a tracked run: nothing to show
    with tpu_nb.track() as report:
        for _ in range(12):
            step()
        live = monitor.poll(final=True)  # final: built whatever the cadence
        builds = monitor.anatomy_builds
        again = monitor.poll(final=True)  # no step since: the same anatomy, not rebuilt
    assert live.anatomy is not None and len(live.anatomy.steps) >= 10
    assert again.anatomy is live.anatomy and again.anatomy_version == live.anatomy_version
    assert monitor.anatomy_builds == builds and live.run_wall_seconds is None
    done = monitor.poll()
    monitor.close()
    # The run ended: its report's anatomy (with the verdict) and its wall time.
    assert done.anatomy is report.anatomy and done.anatomy_version > live.anatomy_version
    assert done.run_wall_seconds == report.wall_seconds
    panel = D.anatomy_html(done)
    assert "where the last steps" in panel and "<svg" in panel


def test_the_dashboard_reads_only_what_the_monitor_publishes():
    """No module of the dashboard imports a private runtime module, the tracker's reports or
    the anatomy collector: the monitor's LiveState is all it reads."""
    modules = ["dashboard", "dashboard_html", "anatomy_view", "live_charts"]
    for name in modules:
        tree = ast.parse((ROOT / "tpu_nb" / "display" / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tpu_nb"):
                path = node.module.split(".")
                assert not any(part.startswith("_") for part in path), (name, node.module)
                imported = {alias.name for alias in node.names}
                assert not imported & {"last_report", "anatomy_in_progress"}, (name, imported)
                assert not any(n.startswith("_") for n in imported), (name, imported)


def test_the_final_view_draws_the_svg_charts_without_matplotlib(py):
    out = py(
        """
        import sys
        import torch, torch_xla
        import tpu_nb
        tpu_nb.setup("cpu")
        from tpu_nb.display.dashboard import Dashboard
        dev = torch_xla.device()
        w = torch.randn(6, 6, device=dev)
        dash = Dashboard(widgets=True, refresh=0.1, chart_refresh=0.1)
        with dash:
            for i in range(30):
                (torch.ones(4, 6, device=dev) @ w).sum()
                torch_xla.sync()
            torch_xla.sync(wait=True)
            dash._next_chart = 0.0
            dash.refresh_now()
            print("LIVE", "<svg" in dash._step_chart.value, "<svg" in dash._compile_chart.value)
        html = dash._repr_html_()
        print("FINAL", sorted(dash._svgs), html.count("class='tpunb-svg-chart "),
              html.count("<img class='tpunb-chart-picture'"), "data:image/png" in html,
              "waiting for" in html)
        print("MATPLOTLIB", "matplotlib" in sys.modules)
        """
    ).stdout
    assert "LIVE True True" in out, out
    # The final view: both charts, as SVG drawn anew from the final state, each with its SVG
    # picture (no PNG).
    assert "FINAL ['compile', 'step'] 2 2 False False" in out, out
    assert "MATPLOTLIB False" in out, out  # the dashboard never imports it


def test_compiles_beyond_those_kept_are_still_counted(monkeypatch):
    """The monitor keeps only its most recent compiles: the panel's "earlier" line and the
    charts' titles count every graph the run compiled, not the ones kept."""
    from tpu_nb.display import dashboard_html as H
    from tpu_nb.runtime.live import _monitor

    monkeypatch.setattr(_monitor, "_SHOWN_COMPILES", 4)
    monitor = LiveMonitor()
    w = torch.randn(23, 23, device=tpu_nb.device())
    torch_xla.sync()
    for n in range(1, 10):  # nine new graphs
        _kept = (torch.ones(n, 23, device=tpu_nb.device()) @ w).sum()
        torch_xla.sync()
        monitor.poll()
    xm.wait_device_ops()
    state = monitor.poll(final=True)
    monitor.close()
    compiled = state.metrics.compiles
    assert compiled >= 9 and len(state.compiles) == 4
    assert state.compiles[-1].index == compiled
    for final in (False, True):
        assert f"\u2026 {compiled - 4} earlier" in H.compile_html(state, final)
    compile_title = ET.fromstring(CompileSvg().render(state.compiles, final=True)).find(
        f"{SVG}title"
    )
    assert compile_title.text.startswith(f"{compiled} graphs compiled;"), compile_title.text
    step_title = ET.fromstring(StepTimeSvg().update(state)).find(f"{SVG}title").text
    assert step_title.endswith(f"; {compiled} compiles"), step_title
