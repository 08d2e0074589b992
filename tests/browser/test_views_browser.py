"""tpu_nb's HTML views in a real browser, in every front end a user has: JupyterLab 4 light and
dark, Notebook 7, and a bare page without Jupyter's CSS (how Colab's output frames, nbviewer
and exported HTML show them), in light and dark `prefers-color-scheme`.

The views are made here on XLA:CPU from real work: a cell's report (a recompiling line, a CPU
fallback, host reads), the environment table, the dashboard's final view and the graph of a
TransformerEncoderLayer training step (~550 nodes). In JupyterLab and Notebook 7 they are the
outputs of a trusted notebook, rendered by the front end's own output renderer and CSS; in
JupyterLab also of an untrusted one, whose HTML its sanitizer strips of SVG and stylesheets.
Checked from computed styles: table cells left-aligned, text contrast at least 4.5:1 (WCAG AA)
against the background it is drawn on, no broken image, graph labels at least 10 px on screen,
the graph and the dashboard's final charts on screen (as SVG, or where it was stripped as
their pictures, with none of its text left loose).
Screenshots: tests/artifacts/views-<front end>-<theme>-<view>.png.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "artifacts"
CHROMIUM = os.environ.get("TPU_NB_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("TPU_NB_CHROMEDRIVER", "/usr/bin/chromedriver")
# Front end -> the page that opens a notebook in it (JupyterLab: in a fresh workspace, with
# no tab left from the previous test).
PAGES = {
    "jupyterlab": "/lab/workspaces/{workspace}/tree/{name}?reset&",
    "notebook7": "/notebooks/{name}?",
}
THEMES = {"light": "JupyterLab Light", "dark": "JupyterLab Dark"}
VIEW_CLASSES = ("tpunb-report", "tpunb-env", "tpunb-dashboard", "tpu-nb-graph")

pytestmark = [pytest.mark.browser, pytest.mark.timeout(420)]

if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
    _missing = f"needs {CHROMIUM} and {CHROMEDRIVER}: apt-get install -y chromium chromium-driver"
    if os.environ.get("TPU_NB_REQUIRE_BROWSER"):
        raise RuntimeError(_missing)
    pytest.skip(_missing, allow_module_level=True)


# -- the views, from real work on XLA:CPU ------------------------------------------------------

CELL = """\
import torch
w = torch.randn(16, 16, device=dev)
torch_xla.sync()
for rows in (3, 5, 7, 9, 3):
    out = (torch.ones(rows, 16, device=dev) @ w).relu().sum()
    torch_xla.sync()
    seen = out.item()
hist = torch.histc(torch.linspace(0, 1, 32, device=dev), bins=4)
"""


def _report_view():
    import torch_xla

    import tpu_nb
    from tpu_nb.display.reports import RunView

    filename = str(ROOT / "tests" / "artifacts" / "views_cell.py")  # the "cell"'s file
    scope = {"torch_xla": torch_xla, "dev": tpu_nb.device()}
    code = compile(CELL, filename, "exec")  # the cell's own code, as %%on_tpu passes it
    with tpu_nb.track("In[7]", code=(code,), source=CELL, filename=filename) as report:
        exec(code, scope)
    return RunView(report, label="In[7]")


def _dashboard_view():
    import torch
    import torch_xla

    import tpu_nb
    from tpu_nb.display.dashboard import Dashboard

    w = torch.randn(32, 32, device=tpu_nb.device())
    with Dashboard(widgets=False, refresh=0.2, alert_graphs=2) as dash:
        for i in range(60):
            kept = (torch.ones(2 + i // 15, 32, device=tpu_nb.device()) @ w).tanh().sum()
            torch_xla.sync()
            time.sleep(0.01)
    assert kept.device.type == "xla"
    return dash  # its final state: the summary and the static HTML


def _graph_view():
    import torch
    import torch_xla

    import tpu_nb
    from tpu_nb.display.graph_view import GraphView
    from tpu_nb.runtime.graph import pending_graph, record_locations

    torch.manual_seed(0)
    dev = tpu_nb.device()
    layer = torch.nn.TransformerEncoderLayer(64, 4, 128, batch_first=True).to(dev)
    opt = torch.optim.AdamW(layer.parameters())
    with record_locations():  # module scopes: the view a step under %%on_tpu --graph gets
        layer(torch.randn(8, 16, 64, device=dev)).pow(2).mean().backward()
        opt.step()
    found = pending_graph(layer, opt)
    torch_xla.sync()
    assert len(found.nodes) >= 500
    view = GraphView(found, title="training step")
    assert view.grouped().by == "module"  # forward and backward bands of module boxes
    return view


@pytest.fixture(scope="module")
def views() -> dict[str, object]:
    import tpu_nb
    from tpu_nb.display.reports import EnvironmentView

    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return {
        "report": _report_view(),
        "environment": EnvironmentView(tpu_nb.detect()),
        "dashboard": _dashboard_view(),
        "graph": _graph_view(),
    }


def _notebook(views: dict, path: Path, data_dir: Path, trusted: bool = True) -> None:
    """A notebook whose outputs are the views, signed as trusted (as after running it), or
    not (as a notebook someone else ran: the front end sanitizes its HTML)."""
    from nbformat.sign import NotebookNotary

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    for name, view in views.items():
        cell = nbformat.v4.new_code_cell(f"# {name}", execution_count=len(nb.cells) + 1)
        cell.outputs = [
            nbformat.v4.new_output(
                "display_data", data={"text/html": view._repr_html_(), "text/plain": repr(view)}
            )
        ]
        nb.cells.append(cell)
    if trusted:
        NotebookNotary(data_dir=str(data_dir)).sign(nb)
    nbformat.write(nb, path)


# -- checks ----------------------------------------------------------------------------------

_SELECTOR = ", ".join(f".{c}" for c in VIEW_CLASSES)


def _check(driver, style_checks, charts_shown, picture: bool = True) -> dict:
    """`picture`: the SVG is shown (the graph picture, the dashboard's SVG charts); else it
    was stripped, and the graph and the dashboard's charts show as their pictures, with none
    of the stripped SVG's text left loose and no zoom buttons (they need the stylesheet)."""
    result = style_checks(driver, _SELECTOR)
    assert result["roots"] == len(VIEW_CLASSES), result
    assert result["texts"] > 100 and result["cells"] > 40, result
    assert not result["misaligned"], result["misaligned"][:10]
    assert not result["low"], result["low"][:10]
    assert not result["broken"], result["broken"]
    (graph,) = result["graphPictures"]
    if picture:
        assert result["labels"] > 40 and result["minLabel"] >= 10, result
        assert graph["width"] == 0 and result["zoomShown"] == 9, result  # the SVG, zoomable
    else:
        assert graph["width"] >= 300 and graph["height"] >= 300 and graph["natural"], graph
        assert not graph["loose"] and result["zoomShown"] == 0, result
    charts_shown(result, inline=picture)  # the dashboard's step and compile charts
    return result


def _drag_pans(driver) -> bool:
    """Drag inside the graph's frame by (-200, -150): whether it scrolled by that, as far as
    its size allows (the pan script, where it runs)."""
    from selenium.webdriver.common.action_chains import ActionChains

    frame = driver.find_element("css selector", ".tpu-nb-graph .tpunb-frame")
    driver.execute_script(
        "arguments[0].scrollIntoView({block: 'center'});"
        "arguments[0].scrollLeft = 0; arguments[0].scrollTop = 0;",
        frame,
    )
    time.sleep(0.2)
    ActionChains(driver).move_to_element(frame).click_and_hold().move_by_offset(
        -120, -90
    ).move_by_offset(-80, -60).release().perform()
    time.sleep(0.2)
    left, top, room_x, room_y = driver.execute_script(
        "const f = arguments[0]; return [f.scrollLeft, f.scrollTop, "
        "f.scrollWidth - f.clientWidth, f.scrollHeight - f.clientHeight];",
        frame,
    )
    assert room_y > 150, room_y  # a 500-node step is taller than the frame
    return abs(left - min(200, room_x)) <= 1 and abs(top - 150) <= 1


def _shots(driver, prefix: str) -> None:
    for name in VIEW_CLASSES:
        driver.execute_script(
            "const el = document.querySelector(arguments[0]);"
            "if (el) el.scrollIntoView({block: 'start'});",
            f".{name}",
        )
        time.sleep(0.3)
        driver.save_screenshot(str(ARTIFACTS / f"views-{prefix}-{name}.png"))


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_views_on_a_bare_page_without_jupyter_css(
    views, browser, style_checks, charts_shown, scheme, tmp_path
):
    page = tmp_path / "views.html"
    page.write_text(
        "<!DOCTYPE html><html><head><meta charset='utf-8'></head><body>"
        + "".join(f"<div style='margin:12px 0'>{v._repr_html_()}</div>" for v in views.values())
        + "</body></html>",
        encoding="utf-8",
    )
    browser.execute_cdp_cmd(
        "Emulation.setEmulatedMedia",
        {"features": [{"name": "prefers-color-scheme", "value": scheme}]},
    )
    try:
        browser.get(page.as_uri())
        _wait(
            lambda: browser.execute_script("return [...document.images].every(i => i.complete)"),
            20,
            "the images",
        )
        result = _check(browser, style_checks, charts_shown)
        assert _drag_pans(browser)  # dragging the picture pans it
        _shots(browser, f"bare-{scheme}")
    finally:
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})
    print(f"bare page, {scheme}: {json.dumps(result)[:400]}")


@pytest.mark.parametrize(
    "frontend, theme, trusted, scheme",
    [
        ("jupyterlab", "light", True, "light"),
        ("jupyterlab", "dark", True, "light"),
        ("notebook7", "light", True, "light"),
        ("notebook7", "dark", True, "light"),
        ("jupyterlab", "light", False, "light"),
        ("jupyterlab", "dark", False, "light"),
        ("jupyterlab", "light", False, "dark"),
    ],
)
def test_views_in_jupyter_front_ends(
    views, lab, browser, style_checks, charts_shown, frontend, theme, trusted, scheme
):
    """`scheme`: the system's (prefers-color-scheme), which JupyterLab's theme does not
    follow; the dashboard's chart pictures do (an untrusted notebook shows them)."""
    base, token, home = lab
    settings = home / "settings" / "@jupyterlab" / "apputils-extension"
    (settings / "themes.jupyterlab-settings").write_text(json.dumps({"theme": THEMES[theme]}))
    variant = f"{theme}{'' if trusted else '-untrusted'}{'' if scheme == 'light' else '-os-dark'}"
    name = f"views-{frontend}-{variant}.ipynb"
    _notebook(views, home / "notebooks" / name, home / "data", trusted)
    browser.execute_cdp_cmd(
        "Emulation.setEmulatedMedia",
        {"features": [{"name": "prefers-color-scheme", "value": scheme}]},
    )
    try:
        url = PAGES[frontend].format(name=name, workspace=name[:-6])
        browser.get(f"{base}{url}token={token}")
        _wait(
            lambda: len(browser.find_elements("css selector", _SELECTOR)) == len(VIEW_CLASSES),
            90,
            "the notebook's outputs",
        )
        _wait(
            lambda: (
                browser.execute_script("return document.body.dataset.jpThemeLight")
                == ("true" if theme == "light" else "false")
            ),
            30,
            f"the {theme} theme",
        )
        time.sleep(1)  # fonts and images settle
        # Untrusted: JupyterLab sanitizes the notebook's HTML: no <style>, no <svg>, no
        # script. Layout (inline) stays, and the colours fall back to the theme's own text
        # colour. The graph and the dashboard's charts show as their pictures.
        result = _check(browser, style_checks, charts_shown, picture=trusted)
        # The pictures follow the page's colour scheme (JupyterLab sets its theme's as CSS
        # color-scheme, which chromium passes into an SVG <img>), not the system's.
        dark = [p["background"] < 0.05 for p in result["pictures"] if p["width"]]
        assert dark == ([] if trusted else [theme == "dark"] * 2), result["pictures"]
        assert not trusted or _drag_pans(browser)  # a trusted output's script runs
        _shots(browser, f"{frontend}-{variant}")
    finally:
        browser.execute_cdp_cmd("Emulation.setEmulatedMedia", {"features": []})
    print(f"{frontend}, {variant}: {json.dumps(result)[:400]}")
