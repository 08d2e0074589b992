"""Real-browser tests: run by `make test-browser`, kept out of `make test` (--ignore).

Shared here: a JupyterLab server on localhost (`lab`: base URL, token, its home folder; test
modules write their notebooks into home/"notebooks") and headless chromium (`browser`).
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from _env import without_xla_settings

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("TPU_NB_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("TPU_NB_CHROMEDRIVER", "/usr/bin/chromedriver")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "browser: drives JupyterLab in a real browser (make test-browser)"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """A JupyterLab server on localhost with a fresh config, settings and workspace."""
    home = tmp_path_factory.mktemp("lab")
    root = home / "notebooks"
    root.mkdir()
    # No news, no update checks: nothing fetched from the network, no toast over the page.
    settings = home / "settings" / "@jupyterlab" / "apputils-extension"
    settings.mkdir(parents=True)
    (settings / "notification.jupyterlab-settings").write_text(
        '{"fetchNews": "false", "checkForUpdates": false}'
    )
    port, token = _free_port(), secrets.token_hex(16)
    env = without_xla_settings(os.environ)
    env.update(
        PJRT_DEVICE="CPU",
        PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
        JUPYTER_CONFIG_DIR=str(home / "config"),
        JUPYTER_RUNTIME_DIR=str(home / "runtime"),
        JUPYTER_DATA_DIR=str(home / "data"),
        IPYTHONDIR=str(home / "ipython"),
    )
    with open(home / "server.log", "w") as log:
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "jupyterlab",
                "--no-browser",
                f"--port={port}",
                "--ServerApp.ip=127.0.0.1",
                f"--IdentityProvider.token={token}",
                f"--ServerApp.root_dir={root}",
                "--LabApp.news_url=None",
                "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                "--LabApp.extension_manager=readonly",
                f"--LabApp.user_settings_dir={home / 'settings'}",
                f"--LabApp.workspaces_dir={home / 'workspaces'}",
            ]
            + (["--allow-root"] if os.geteuid() == 0 else []),  # CI runs as root
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=str(root),
        )
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 90
            while True:
                try:
                    urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2).close()
                    break
                except OSError:
                    if server.poll() is not None or time.monotonic() > deadline:
                        log.flush()
                        # The server's log says why; the refused connection does not.
                        raise RuntimeError(
                            "JupyterLab did not start:\n"
                            + (home / "server.log").read_text()[-4000:]
                        ) from None
                    time.sleep(0.5)
            yield base, token, home
        finally:
            server.terminate()
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


@pytest.fixture(scope="module")
def browser(lab):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    _, _, home = lab
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        "--window-size=1400,1300",
        f"--user-data-dir={home / 'chromium'}",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


# What a reader sees, from computed styles, for every element under the roots matching a
# selector: text contrast against the background it is drawn on (alpha-blended up the
# ancestors; WCAG's relative luminance), table cells' alignment (unless the cell asks for
# right alignment inline), broken images, the on-screen size of graph labels, and the
# dashboard's charts: the SVG charts' on-screen size and their text's contrast (its fill)
# against the background behind it; the charts' pictures (shown where the SVG was stripped):
# their on-screen size, the contrast of their darkest or lightest ink against their own
# background (read from the decoded pixels), and any text left visible beside them.
_CHECKS = r"""
const roots = [...document.querySelectorAll(arguments[0])];
function rgba(text) {
  const m = text.match(/rgba?\(([^)]+)\)/);
  if (!m) return [0, 0, 0, 0];
  const v = m[1].split(/[ ,\/]+/).filter(Boolean).map(Number);
  return [v[0], v[1], v[2], v.length > 3 ? v[3] : 1];
}
function over(top, under) {        // alpha-blend a colour over an opaque one
  const a = top[3];
  return [0, 1, 2].map(i => top[i] * a + under[i] * (1 - a));
}
function background(el) {
  const layers = [];
  for (let e = el; e; e = e.parentElement) {
    const c = rgba(getComputedStyle(e).backgroundColor);
    if (c[3] > 0) { layers.push(c); if (c[3] >= 1) break; }
  }
  let colour = [255, 255, 255];
  for (const c of layers.reverse()) colour = over(c, colour);
  return colour;
}
function luminance(c) {
  const [r, g, b] = c.map(v => { v /= 255; return v <= 0.03928 ? v / 12.92
                                              : Math.pow((v + 0.055) / 1.055, 2.4); });
  return 0.2126 * r + 0.7152 * g + 0.0722 * b;
}
const low = [], misaligned = [], broken = [];
let cells = 0, texts = 0, images = 0, minLabel = Infinity, labels = 0, charts = 0;
let shownCharts = 0, zoomShown = 0;
const pictures = [], graphPictures = [];
function contrast(el, colour) {
  const bg = background(el);
  const fg = over(rgba(colour), bg);
  const [a, b] = [luminance(fg), luminance(bg)];
  return (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
}
for (const root of roots) {
  for (const el of root.querySelectorAll('*')) {
    if (el.closest('svg')) continue;        // the graph picture: checked by its labels
    const own = [...el.childNodes].some(n => n.nodeType === 3 && n.textContent.trim());
    if (own) {
      const ratio = contrast(el, getComputedStyle(el).color);
      texts++;
      if (ratio < 4.5)
        low.push(`${ratio.toFixed(2)} ${el.tagName} "${el.textContent.trim().slice(0, 40)}"`);
    }
    const asksRight = /text-align:\s*right/.test(el.getAttribute('style') || '');
    if ((el.tagName === 'TD' || el.tagName === 'TH') && !asksRight) {
      cells++;
      const align = getComputedStyle(el).textAlign;
      if (align !== 'left' && align !== 'start')
        misaligned.push(`${align} "${el.textContent.trim().slice(0, 30)}"`);
    }
    if (el.tagName === 'IMG') {
      images++;
      if (!el.complete || el.naturalWidth === 0) broken.push(el.getAttribute('alt'));
    }
  }
  for (const svg of root.querySelectorAll('svg.tpunb-chart')) {
    const scale = svg.getBoundingClientRect().width / svg.viewBox.baseVal.width;
    for (const t of svg.querySelectorAll('text')) {
      labels++;
      minLabel = Math.min(minLabel, parseFloat(getComputedStyle(t).fontSize) * scale);
    }
  }
  for (const svg of root.querySelectorAll('svg.tpunb-svg-chart')) {
    charts++;
    const box = svg.getBoundingClientRect();
    if (box.width > 0 && box.height > 0) shownCharts++;
    for (const t of svg.querySelectorAll('text')) {
      const ratio = contrast(t, getComputedStyle(t).fill);
      texts++;
      if (ratio < 4.5) low.push(`${ratio.toFixed(2)} chart text "${t.textContent.slice(0, 40)}"`);
    }
  }
  for (const img of root.querySelectorAll('img.tpunb-chart-picture')) {
    const box = img.getBoundingClientRect();
    const p = {width: Math.round(box.width), height: Math.round(box.height),
               natural: img.naturalWidth, ink: null, left: null};
    if (p.width > 0 && p.height > 0 && img.naturalWidth > 0) {
      const canvas = document.createElement('canvas');
      [canvas.width, canvas.height] = [img.naturalWidth, img.naturalHeight];
      const g = canvas.getContext('2d');
      g.drawImage(img, 0, 0);
      const px = g.getImageData(0, 0, canvas.width, canvas.height).data;
      const bg = [px[0], px[1], px[2]], lb = luminance(bg);
      p.opaque = px[3] === 255;
      p.background = lb;
      p.ink = 1;
      for (let i = 0; i < px.length; i += 4) {
        const l = luminance([px[i], px[i + 1], px[i + 2]]);
        p.ink = Math.max(p.ink, (Math.max(l, lb) + 0.05) / (Math.min(l, lb) + 0.05));
      }
    }
    const parent = img.parentElement;
    const loose = [...parent.childNodes].filter(n => n.nodeType === 3 && n.textContent.trim());
    if (loose.length && parseFloat(getComputedStyle(parent).fontSize) > 0)
      p.left = loose.map(n => n.textContent).join(' ').slice(0, 60);
    pictures.push(p);
  }
  for (const img of root.querySelectorAll('img.tpunb-graph-picture')) {
    const box = img.getBoundingClientRect(), frame = img.parentElement;
    const walk = document.createTreeWalker(frame, NodeFilter.SHOW_TEXT);
    let loose = '';
    for (let n = walk.nextNode(); n; n = walk.nextNode()) {
      const shown = parseFloat(getComputedStyle(n.parentElement).fontSize) > 0;
      if (n.textContent.trim() && shown && !n.parentElement.closest('svg'))
        loose += n.textContent.trim().slice(0, 30) + ' ';
    }
    graphPictures.push({width: Math.round(box.width), height: Math.round(box.height),
                        natural: img.naturalWidth, loose: loose.slice(0, 60)});
  }
  for (const el of root.querySelectorAll('.tpunb-zoom'))
    if (el.getBoundingClientRect().width > 0) zoomShown++;
}
return {roots: roots.length, low, misaligned, broken, cells, texts, images, labels, charts,
        shownCharts, pictures, graphPictures, zoomShown,
        minLabel: labels ? minLabel : null,
        jpLight: document.body.dataset.jpThemeLight || null,
        colorScheme: getComputedStyle(roots[0] || document.body).colorScheme};
"""


@pytest.fixture
def style_checks():
    """driver, selector -> dict of findings (see _CHECKS)."""
    return lambda driver, selector: driver.execute_script(_CHECKS, selector)


def _charts_shown(result: dict, inline: bool) -> None:
    """The dashboard's two final charts are on screen in `result` (style_checks): as inline
    SVG (`inline`), their pictures hidden; or, where the SVG was stripped, as their pictures:
    decoded, opaque, with ink at least 4.5:1 against their background, no loose text left."""
    pictures = result["pictures"]
    assert len(pictures) == 2, result
    if inline:
        assert result["charts"] == result["shownCharts"] == 2, result
        assert all(p["width"] == p["height"] == 0 for p in pictures), pictures
        return
    assert result["charts"] == 0, result
    for p in pictures:
        assert p["width"] >= 300 and p["height"] >= 150 and p["natural"] > 0, pictures
        assert p["opaque"] and p["ink"] >= 4.5 and p["left"] is None, pictures


@pytest.fixture
def charts_shown():
    """result, inline -> asserts the dashboard's final charts are shown (see _charts_shown)."""
    return _charts_shown
