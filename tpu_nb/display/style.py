"""How every tpu_nb HTML view looks in any front end: layout inline, colours from the theme.

Notebook front ends restyle bare HTML (JupyterLab right-aligns table cells, pads them, stripes
rows; VS Code and Colab bring their own fonts and colours; GitHub and some sanitizers strip
<style> blocks). So layout is written in inline `style` attributes, which outrank any class
selector of the host page, and colours are CSS variables set by one scoped stylesheet:

- the text and background follow the front end: JupyterLab's `--jp-*` variables, VS Code's
  `--vscode-*`, else the browser's `prefers-color-scheme` (Colab's output frames, nbviewer,
  exported HTML);
- the accent colours (error, warning, ok, links, muted text) come in a light and a dark set,
  each at least 4.5:1 against its background (WCAG AA); the dark set applies in JupyterLab's
  dark themes (`body[data-jp-theme-light=false]`), VS Code's dark ones (`body.vscode-dark`),
  or a dark `prefers-color-scheme` when no front end says otherwise.

Each view carries its own block's background, so its text never depends on the page behind
it. Where the stylesheet is stripped (JupyterLab's untrusted outputs) the variables are
undefined and the colours fall back to the front end's own text colour (see `color`).
"""

from __future__ import annotations

import html
import re

from tpu_nb.runtime.units import format_seconds

# name -> (light, dark). Contrast checked against #fff / #111-#2b2b2b respectively.
PALETTE = {
    "fg": ("#1f1f1f", "#e8e8e8"),
    "bg": ("#ffffff", "#1e1e1e"),
    "muted": ("#5c5c5c", "#b0b0b0"),
    "red": ("#b3261e", "#ff8f85"),
    "red-bg": ("#fdecea", "#3d1714"),
    "warn": ("#8a4b00", "#ffbf66"),
    "ok": ("#1b6e20", "#86cf8a"),
    "accent": ("#0b57d0", "#8ab4f8"),
    "line": ("#c4c4c4", "#4a4a4a"),
    "mark-bg": ("#fff4ce", "#3a3000"),  # highlighted source lines
}
# Front ends' own text and background variables, tried in this order.
_FG = ("--jp-content-font-color1", "--vscode-editor-foreground")
_BG = ("--jp-layout-color0", "--vscode-editor-background")
_DARK_HOSTS = (
    "body[data-jp-theme-light=false] .tpunb",
    "body.vscode-dark .tpunb",
    "body.vscode-high-contrast:not(.vscode-high-contrast-light) .tpunb",
)
_LIGHT_HOSTS = (
    "body[data-jp-theme-light=true] .tpunb",
    "body.vscode-light .tpunb",
    "body.vscode-high-contrast-light .tpunb",
)
# Graph pictures (class tpunb-chart) are drawn light; in a dark theme they are inverted, hues
# kept. (The dashboard's charts are drawn in the theme's colours instead.)
_CHART_DARK = "filter:invert(0.88) hue-rotate(180deg)"
# A chart's stand-in picture (see live_charts.with_picture) shows only where its inline SVG
# was stripped: where both are kept, this rule hides it (over its inline display:block);
# where a sanitizer strips the SVG (and this rule's <style>), nothing does. The picture
# carries the rule: the other views' outputs stay as they were.
PICTURE_HIDDEN = (
    "<style>svg.tpunb-svg-chart+img.tpunb-chart-picture{display:none!important}</style>"
)


def _chain(names: tuple[str, ...], fallback: str) -> str:
    out = fallback
    for name in reversed(names):
        out = f"var({name},{out})"
    return out


def _variables(which: int, fixed: bool = False) -> str:
    """The palette as CSS variables; unless `fixed`, the text and background follow the
    front end's own (`_FG`, `_BG`), declared last."""
    decl = {name: pair[which] for name, pair in PALETTE.items()}
    if not fixed:
        fg, bg = decl.pop("fg"), decl.pop("bg")
        decl |= {"fg": _chain(_FG, fg), "bg": _chain(_BG, bg)}
    return ";".join(f"--tpunb-{name}:{value}" for name, value in decl.items())


def _stylesheet() -> str:
    light, dark = _variables(0), _variables(1)
    # Such pictures may sit outside a .tpunb block.
    dark_charts = ",".join(h.replace(" .tpunb", " .tpunb-chart") for h in _DARK_HOSTS)
    light_charts = ",".join(h.replace(" .tpunb", " .tpunb-chart") for h in _LIGHT_HOSTS)
    return (
        "<style>"
        f".tpunb{{{light}}}"
        "@media (prefers-color-scheme:dark){"
        f".tpunb{{{dark}}}.tpunb-chart{{{_CHART_DARK}}}}}"
        f"{','.join(_DARK_HOSTS)}{{{dark}}}"
        f"{','.join(_LIGHT_HOSTS)}{{{light}}}"
        f"{dark_charts}{{{_CHART_DARK}}}"
        f"{light_charts}{{filter:none}}"
        "</style>"
    )


STYLE = _stylesheet()


# The palette inside an SVG drawn as a picture of its own (an <img>, which the page's
# stylesheet and variables do not reach): its light set, or its dark one where the system
# prefers dark, each with its background (`--tpunb-bg`) for the picture to paint.
PICTURE_STYLE = (
    f"<style>:root{{{_variables(0, True)}}}"
    f"@media (prefers-color-scheme:dark){{:root{{{_variables(1, True)}}}}}</style>"
)


def color(name: str) -> str:
    """A palette colour as CSS. No fallback on purpose: where the stylesheet was stripped
    (JupyterLab's untrusted outputs) the variable is undefined, so the property falls back
    to `unset` - text inherits the front end's own colour, backgrounds stay transparent -
    which is readable in any theme, where a fixed light or dark fallback is not."""
    return f"var(--tpunb-{name})"


# In PALETTE's order.
FG, BG, MUTED, RED, RED_BG, WARN, OK, ACCENT, LINE, MARK_BG = (color(name) for name in PALETTE)
MONO = "var(--jp-code-font-family,var(--vscode-editor-font-family,monospace))"
FONT = f"font-family:{MONO};font-size:12px;line-height:1.4"
# The root of every view: its own colours and alignment, whatever the page around it.
ROOT = (
    f"{FONT};color:{FG};background:{BG};text-align:left;padding:2px 4px;"
    "box-sizing:border-box;max-width:100%"
)
TABLE = (
    "border-collapse:collapse;border:none;margin:2px 0;font-size:inherit;"
    "color:inherit;background:transparent;table-layout:auto;width:auto"
)
CELL = (
    "text-align:left;vertical-align:top;padding:1px 10px 1px 0;border:none;"
    f"border-bottom:1px solid {LINE};background:transparent;color:inherit;"
    "white-space:normal;max-width:none;line-height:1.4"
)
NOWRAP = "white-space:nowrap"
ROW = "background:transparent;border:none"
CODE = (
    f"font-family:{MONO};font-size:inherit;background:transparent;color:inherit;"
    "padding:0;border:none;white-space:pre-wrap"
)
PRE = (
    f"font-family:{MONO};font-size:inherit;background:transparent;color:inherit;"
    "padding:0;margin:0;border:none;white-space:pre;overflow:visible;line-height:1.4"
)


def root(body: str, cls: str = "") -> str:
    """A view's outer block: the stylesheet, then `body` in the themed, left-aligned root."""
    names = "tpunb" + (f" {cls}" if cls else "")
    return f"{STYLE}<div class='{names}' style='{ROOT}'>{body}</div>"


def table(
    rows, header=None, *, styles: tuple[str, ...] = (), row_styles: list[str] | None = None
) -> str:
    """A table of already-escaped cells; `styles[i]` is added to column i's cells,
    `row_styles[j]` to row j."""

    def row(cells, tag, extra=""):
        bold = ";font-weight:bold" if tag == "th" else ""
        out = []
        for i, content in enumerate(cells):
            css = (styles[i] if i < len(styles) else "") + bold
            out.append(f"<{tag} style='{CELL}{';' + css if css else ''}'>{content}</{tag}>")
        return f"<tr style='{ROW}{extra}'>{''.join(out)}</tr>"

    head = row(header, "th") if header else ""
    extras = row_styles or [""] * len(rows)
    return (
        f"<table style='{TABLE}'>{head}"
        + "".join(row(r, "td", extra) for r, extra in zip(rows, extras, strict=True))
        + "</table>"
    )


def bullets(
    cls: str, title: str, items, item_css: str = "margin:0;padding:0;text-align:left"
) -> str:
    """A run report's titled list: already-escaped `title` and `items`, in a block of class
    `cls`."""
    lis = "".join(f"<li style='{item_css}'>{item}</li>" for item in items)
    return (
        f"<div class='{cls}' style='margin:4px 0 0'><b>{title}</b>"
        f"<ul style='margin:2px 0 2px 1.4em;padding:0'>{lis}</ul></div>"
    )


def text_table(rows, *, indent: str = "", strip: bool = False) -> list[str]:
    """The lines of a plain-text table: each column padded to its widest cell, two spaces
    between columns, each line after `indent`; `strip` drops the trailing spaces."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        indent + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows
    ]
    return [line.rstrip() for line in lines] if strip else lines


def timeline_span(x: float, y: int, width: float, height: int, fill: str, tip: str) -> str:
    """One span of a timeline: a bar at least half a pixel wide, filled with `fill` (CSS: a
    colour, and an opacity if wanted), with `tip` as its tooltip."""
    return (
        f"<rect x='{x:.1f}' y='{y}' width='{max(width, 0.5):.1f}' height='{height}' "
        f"style='fill:{fill}'><title>{html.escape(tip)}</title></rect>"
    )


def timeline_svg(width: int, height: int, left: int, seconds: float, lanes, spans) -> str:
    """A timeline in inline SVG: each lane's label (name, baseline y) at the left edge, the
    already-built SVG elements `spans`, then a time axis from 0 at x=`left` to `seconds`."""
    text = f"style='fill:{FG};font-size:10px;font-family:{MONO}'"
    labels = [f"<text x='0' y='{y}' {text}>{html.escape(name)}</text>" for name, y in lanes]
    axis = (
        f"<text x='{left}' y='{height - 2}' {text}>0</text>"
        f"<text x='{width - 4}' y='{height - 2}' text-anchor='end' {text}>"
        f"{html.escape(format_seconds(seconds))}</text>"
    )
    return (
        f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' "
        f"viewBox='0 0 {width} {height}' style='max-width:100%;display:block'>"
        f"{''.join(labels + spans)}{axis}</svg>"
    )


def span(text: str, colour: str, *, bold: bool = False) -> str:
    """Already-escaped `text` in a palette colour."""
    return f"<span style='color:{colour}{';font-weight:bold' if bold else ''}'>{text}</span>"


_INVALID_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def esc(text: object) -> str:
    """Text safe inside HTML and SVG (XML) content and attribute values: escaped, quotes
    included, and the characters XML forbids replaced (an SVG with one does not render)."""
    return html.escape(_INVALID_XML.sub("\ufffd", str(text)), quote=True)
