"""The live dashboard in a real browser: JupyterLab 4 and Notebook 7 headless on localhost,
Debian's chromium.

`make test-browser` (also run by CI). In each front end: opens a notebook, runs
`%load_ext tpu_nb` and a `%%on_tpu --live` cell that trains for about 20 s, and checks from
the page that the dashboard is rendered and its step counter changes while the cell is still
running, then that the final view replaces it. Screenshots go to tests/artifacts/ (not
committed).

Needs /usr/bin/chromium and /usr/bin/chromedriver (apt-get install chromium chromium-driver);
Playwright's own browser download does not work here, and Selenium drives Debian's browser
with its matching driver.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "tests" / "artifacts"
CHROMIUM = os.environ.get("TPU_NB_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("TPU_NB_CHROMEDRIVER", "/usr/bin/chromedriver")
TRAIN_SECONDS = 20
# Front end -> the page that opens a notebook in it.
# (JupyterLab: in a workspace of its own, so no tab of an earlier test is left open)
FRONTENDS = {
    "jupyterlab": "/lab/workspaces/{workspace}/tree/{name}?reset&",
    "notebook7": "/notebooks/{name}?",
}
RUNS = [("jupyterlab", "light"), ("jupyterlab", "dark"), ("notebook7", "light")]
THEMES = {"light": "JupyterLab Light", "dark": "JupyterLab Dark"}

pytestmark = [pytest.mark.browser, pytest.mark.timeout(420)]

if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
    _missing = f"needs {CHROMIUM} and {CHROMEDRIVER}: apt-get install -y chromium chromium-driver"
    if os.environ.get("TPU_NB_REQUIRE_BROWSER"):  # make test-browser: a failure, not a skip
        raise RuntimeError(_missing)
    pytest.skip(_missing, allow_module_level=True)


def _notebook(path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    nb.cells = [
        nbformat.v4.new_code_cell(
            "%load_ext tpu_nb\n%tpu_setup --device cpu\n"
            f"import sys, time\nsys.path.insert(0, {str(ROOT / 'benchmarks')!r})\n"
            "import torch, torch_xla\nfrom _workload import make_mlp_step\n"
            "step = make_mlp_step(torch_xla.device())"
        ),
        nbformat.v4.new_code_cell(
            "%%on_tpu --live\nprint('before the loop')\nstart = time.perf_counter()\n"
            f"while time.perf_counter() - start < {TRAIN_SECONDS}:\n    step()\n"
            "print('after the loop')\n"
        ),
    ]
    nbformat.write(nb, path)


@pytest.fixture(scope="module", autouse=True)
def _dashboard_notebooks(lab):
    _, _, home = lab
    for frontend, theme in RUNS:
        _notebook(home / "notebooks" / f"live-{frontend}-{theme}.ipynb")


def _kernel_idle(base: str, token: str, name: str) -> bool:
    """Whether the notebook's kernel is started and idle (the server's own view)."""
    with urllib.request.urlopen(f"{base}/api/sessions?token={token}", timeout=5) as r:
        sessions = json.load(r)
    return any(
        s.get("path", "").endswith(name) and s.get("kernel", {}).get("execution_state") == "idle"
        for s in sessions
    )


def _shot(driver, name: str, selector: str | None = None) -> Path:
    """Save a screenshot, the element `selector` scrolled to the top of the view first."""
    if selector:
        driver.execute_script(
            "const el = document.querySelector(arguments[0]);"
            "if (el) el.scrollIntoView({block: 'start'});",
            selector,
        )
        time.sleep(0.3)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"dashboard-browser-{name}.png"
    driver.save_screenshot(str(path))
    return path


def _wait(predicate, timeout: float, what: str, driver=None, poll: float = 0.25):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll)
    if driver is not None:
        _shot(driver, "timeout")  # the last page, to see why
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _prompts(driver) -> list[str]:
    return [
        p.text.strip()
        for p in driver.find_elements("css selector", ".jp-CodeCell .jp-InputArea-prompt")
    ]


def _live_height(driver) -> float | None:
    """The height of the live dashboard's output (the widget view), in CSS pixels."""
    return driver.execute_script(
        "const el = document.querySelector('.jupyter-widgets .tpunb-steps, "
        ".widget-html .tpunb-steps');"
        "const out = el && el.closest('.jp-OutputArea-output');"
        "return out ? out.getBoundingClientRect().height : null;"
    )


def _live_steps(driver) -> int | None:
    """The step counter of the live dashboard widget, read from the page."""
    found = driver.execute_script(
        "const el = document.querySelector('.jupyter-widgets .tpunb-steps, "
        ".widget-html .tpunb-steps');"
        "return el ? el.textContent : null;"
    )
    return int(found) if found and found.isdigit() else None


@pytest.mark.parametrize("frontend, theme", RUNS)
def test_dashboard_renders_and_its_step_counter_moves_while_the_cell_runs(
    lab, browser, style_checks, charts_shown, frontend, theme
):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys

    if frontend == "notebook7" and importlib.util.find_spec("notebook") is None:
        pytest.skip("Notebook 7 is not installed (pip install 'notebook>=7')")
    base, token, home = lab
    (
        home / "settings" / "@jupyterlab" / "apputils-extension" / "themes.jupyterlab-settings"
    ).write_text(json.dumps({"theme": THEMES[theme]}))
    driver = browser
    name = f"live-{frontend}-{theme}.ipynb"
    driver.get(base + FRONTENDS[frontend].format(name=name, workspace=name[:-6]) + f"token={token}")
    _wait(
        lambda: len(driver.find_elements("css selector", ".jp-CodeCell")) >= 2,
        90,
        "the notebook's cells",
        driver,
    )
    _wait(lambda: _kernel_idle(base, token, name), 90, "the kernel to be idle", driver)
    time.sleep(1)
    first = driver.find_elements("css selector", ".jp-CodeCell")[0]
    first.find_element("css selector", ".jp-InputArea-prompt").click()  # command mode
    ActionChains(driver).key_down(Keys.SHIFT).send_keys(Keys.ENTER).key_up(Keys.SHIFT).pause(
        0.5
    ).key_down(Keys.SHIFT).send_keys(Keys.ENTER).key_up(Keys.SHIFT).perform()

    first_seen = _wait(lambda: _live_steps(driver), 150, "the live dashboard", driver)
    live = ".jp-CodeCell:nth-child(2) .jp-OutputArea"
    running_shot = _shot(driver, f"{frontend}-{theme}-1-live", live)
    # While the training cell still runs ([*]), the counter read from the page moves on.
    readings = [first_seen]
    heights = [_live_height(driver)]
    for _ in range(6):
        time.sleep(1.5)
        value = _live_steps(driver)
        heights.append(_live_height(driver))
        prompts = _prompts(driver)
        assert prompts[1] == "[*]:", prompts  # still running
        if value is not None:
            readings.append(value)
    assert len(set(readings)) >= 3, readings
    assert readings == sorted(readings), readings
    # Space for the charts is reserved from the first paint: the view does not jump when
    # they arrive or change.
    heights = [h for h in heights if h is not None]
    assert len(heights) >= 5 and max(heights) - min(heights) <= 4, heights
    page = driver.find_element("css selector", "body").text
    assert "Compiles" in page and "Execution" in page and "Memory" in page
    assert "step time median" in page
    assert "Error displaying widget" not in page
    _shot(driver, f"{frontend}-{theme}-2-live-later", live)
    # Readable in the theme: every panel's text at least 4.5:1, cells left-aligned.
    live_view = style_checks(driver, ".widget-html .tpunb")
    assert live_view["roots"] >= 6 and live_view["texts"] > 20, live_view
    assert not live_view["low"] and not live_view["misaligned"], live_view
    assert live_view["jpLight"] == ("true" if theme == "light" else "false")

    # The cell ends: the live widget gives way to the final static view.
    _wait(
        lambda: re.fullmatch(r"\[\d+\]:", _prompts(driver)[1]),
        TRAIN_SECONDS + 120,
        "the training cell to finish",
        driver,
    )
    final = _wait(
        lambda: driver.find_elements("css selector", ".tpunb-dashboard .tpunb-status"),
        30,
        "the final view",
        driver,
    )
    assert final[0].text == "finished"
    steps = int(driver.find_element("css selector", ".tpunb-dashboard .tpunb-steps").text)
    assert steps >= max(readings)
    assert _live_steps(driver) is None  # no widget view left
    assert driver.find_elements("css selector", ".tpunb-dashboard svg.tpunb-svg-chart")
    # The final view took the live view's place: above the prints that came after it.
    order = driver.execute_script(
        "const outs = [...document.querySelectorAll("
        "'.jp-CodeCell:nth-child(2) .jp-OutputArea-output')];"
        "return outs.map(o => o.querySelector('.tpunb-dashboard') ? 'dashboard'"
        "  : o.textContent.includes('after the loop') ? 'after' : 'other');"
    )
    assert "dashboard" in order and "after" in order, order
    assert order.index("dashboard") < order.index("after"), order
    final_view = style_checks(driver, ".tpunb-dashboard")
    assert final_view["roots"] == 1, final_view
    charts_shown(final_view, inline=True)  # step, compile: SVG, their pictures hidden
    assert not final_view["low"] and not final_view["misaligned"], final_view
    assert not final_view["broken"], final_view
    final_shot = _shot(driver, f"{frontend}-{theme}-3-final", ".tpunb-dashboard")
    print(
        f"screenshots: {running_shot}, {final_shot}; step counter read while running: "
        f"{readings}; final: {steps}"
    )
