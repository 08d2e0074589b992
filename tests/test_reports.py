"""The cell report (`RunView`) and the other report views: what a reader sees.

Findings are built directly (the report renders whatever attribution produces) and once end
to end through `%%on_tpu` on XLA:CPU.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser

import pytest

from tpu_nb.display.reports import EnvironmentView, RunView, group_findings
from tpu_nb.runtime.metrics import MetricsDelta
from tpu_nb.runtime.tracking import LineFinding, RunReport
from tpu_nb.runtime.units import format_seconds

SOURCE = (
    "import torch\n"
    "for i in range(64):\n"
    "    x = torch.randn(i + 1)\n"
    "    loss = step(x)\n"
    "    print(loss.item())\n"
)
HINT = "keep shapes and Python values in the step fixed (pad or bucket the batch)"
READ_HINT = "read once after the loop"


def _report(findings=(), source=SOURCE, wall_seconds=1.1, **metrics) -> RunReport:
    return RunReport(
        name="In[5]",
        wall_seconds=wall_seconds,
        waited=True,
        compile_analysis=True,
        metrics=MetricsDelta(**metrics),
        findings=tuple(findings),
        source=source,
        complete=True,
    )


def _findings() -> list[LineFinding]:
    via = "torch/optim/adamw.py:480 _single_tensor_adamw"
    return [
        LineFinding(4, "compile", "graph 3a4b5c6d compiled", seconds=0.012, order=0),
        LineFinding(5, "host-read", ".item() reads a device value", READ_HINT, count=64, order=1),
        *[
            LineFinding(
                4,
                "recompile",
                f"graph {h} compiled",
                HINT,
                seconds=0.02,
                order=o,
                via=via,
                changed=(f"input 0 shape [{o}] -> [{o + 1}]",),
            )
            for o, h in ((2, "1111aaaa"), (3, "2222bbbb"), (4, "3333cccc"))
        ],
        LineFinding(0, "compile", "graph 99999999 compiled", place="end of cell", order=9),
    ]


def test_format_seconds_one_format_for_every_scale():
    assert [format_seconds(v) for v in (5.4e-5, 0.4266, 1.1, 12.34, 0.99996, 250)] == [
        "54.0 µs",
        "427 ms",
        "1.10 s",
        "12.3 s",
        "1.00 s",
        "250 s",
    ]
    assert format_seconds(None) == "-" and format_seconds(0) == "0 s"
    # A toy step's roofline time on a TPU is under a nanosecond: never "0.000 µs".
    assert [format_seconds(v) for v in (5.4e-7, 3.2e-12)] == ["540 ns", "3.20 ps"]


def test_findings_are_grouped_by_line_and_kind_in_time_order():
    groups = group_findings(_findings()[::-1])  # order comes from `order`
    assert [(g.where, g.kind, g.count) for g in groups] == [
        ("line 4", "compile", 1),
        ("line 5", "host-read", 64),
        ("line 4", "recompile", 3),
        ("end of cell", "compile", 1),
    ]
    recompile = groups[2]
    assert recompile.seconds == pytest.approx(0.06)
    assert recompile.vias == ["torch/optim/adamw.py:480 _single_tensor_adamw"]
    # What changed, once: the latest two compiles' facts (not a list of every pair).
    assert recompile.changed == ["input 0 shape [3] -> [4]", "input 0 shape [4] -> [5]"]


def test_a_row_says_a_description_once_when_another_only_extends_it():
    at_sync = "at torch_xla.sync(), the end of the step"
    within = f"{at_sync}; another graph of this line, within the 8 --max-graphs allows"
    findings = [
        LineFinding(4, "compile", what, order=o) for o, what in enumerate((at_sync, within, within))
    ]
    findings.append(LineFinding(4, "compile", "at print(loss)", order=3))
    (group,) = group_findings(findings)
    assert group.description() == f"{within}; at print(loss)"
    # A description that only shares words with another is kept.
    apart = [LineFinding(4, "compile", w, order=o) for o, w in enumerate((at_sync, at_sync + "s"))]
    assert group_findings(apart)[0].description() == f"{at_sync}; {at_sync}s"


def test_text_report_one_hint_per_kind_and_an_annotated_listing():
    text = repr(RunView(_report(_findings(), compiles=5, host_reads=64), label="In[5]"))
    lines = text.splitlines()
    assert lines[0].startswith("In[5]: 1.10 s") and "RECOMPILED" in lines[0]
    assert text.count(HINT) == 1 and text.count(READ_HINT) == 1  # not once per finding
    assert "  line 4: recompiled ×3 (60.0 ms): graph 1111aaaa compiled" in text
    assert "      line 4 → torch/optim/adamw.py:480 _single_tensor_adamw" in text
    assert "input 0 shape [3] -> [4]" in text
    happened = lines[lines.index("what happened, in order:") + 1 :]
    assert [line.split(":")[0].strip() for line in happened[:2]] == ["line 4", "line 5"]
    # The listing marks the lines that did something, under the line, like %lprun's.
    listing = lines[lines.index("the cell, annotated:") + 1 :]
    assert listing[0] == "    1  import torch"
    assert listing[3] == ">   4      loss = step(x)"
    assert listing[4] == "        ^ compiled ×1 (12.0 ms), recompiled ×3 (60.0 ms)"
    assert listing[6] == "        ^ read from the device ×64"
    assert "    3      x = torch.randn(i + 1)" in listing


def test_text_report_is_deterministic_apart_from_what_the_sanitizer_masks():
    """nbval compares the text: the same work at other speeds gives the same masked text."""
    sanitize = re.compile(r"\b\d+(\.\d+)?\s?(s|ms|us|µs|ns|ps)\b")
    fast = repr(RunView(_report(_findings(), compiles=5)))
    slow_findings = [
        LineFinding(**{**f.__dict__, "seconds": (f.seconds or 0) * 937 or None})
        for f in _findings()
    ]
    slow = RunView(_report(slow_findings, wall_seconds=123.4, compiles=5))
    assert sanitize.sub("T", fast) == sanitize.sub("T", repr(slow))


def test_long_cells_list_only_the_marked_lines_and_their_context():
    source = "".join(f"a{n} = {n}\n" for n in range(1, 101))
    text = repr(
        RunView(
            _report(
                [
                    LineFinding(
                        50, "fallback", "aten::nonzero ran on the CPU", "use torch.where", count=3
                    )
                ],
                source=source,
            )
        )
    )
    listing = text.split("the cell, annotated:\n")[1].splitlines()
    assert listing[0] == "   ..." and listing[-1] == "   ..."
    assert ">  50  a50 = 50" in listing and "   48  a48 = 48" in listing
    assert not any("a47 =" in line or "a53 =" in line for line in listing)


class _Cells(HTMLParser):
    """Each table cell's inline style and text."""

    def __init__(self):
        super().__init__()
        self.cells, self._open = [], None

    def handle_starttag(self, tag, attrs):
        if tag in ("td", "th"):
            self._open = [dict(attrs).get("style", ""), ""]

    def handle_data(self, data):
        if self._open is not None:
            self._open[1] += data

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._open is not None:
            self.cells.append(tuple(self._open))
            self._open = None


def _cells(html: str):
    parser = _Cells()
    parser.feed(html)
    return parser.cells


def test_html_report_lays_out_with_inline_styles_and_escapes_user_text():
    findings = _findings() + [
        LineFinding(3, "fallback", "aten::<script>alert(1)</script>", "use <b>x</b>", order=5)
    ]
    html = RunView(_report(findings, source=SOURCE + "y = '<img src=x>'\n"))._repr_html_()
    assert "<script>" not in html and "<img src=x>" not in html and "&lt;script&gt;" in html
    cells = _cells(html)
    text_cells = [style for style, text in cells if not text.strip().isdigit()]
    # JupyterLab's `.jp-RenderedHTMLCommon td {text-align: right}` loses to inline styles.
    assert text_cells and all("text-align:left" in s for s in text_cells)
    assert html.count(HINT) == 1
    assert "the cell, annotated" in html and "loss = step(x)" in html
    assert "<details open" in html  # something to fix: the listing is open
    headers = [text for style, text in cells if "font-weight:bold" in style and text]
    assert {"where", "what", "times", "time", "details"} <= set(headers)


def test_environment_view_is_themed_and_left_aligned():
    import tpu_nb

    html = EnvironmentView(tpu_nb.detect())._repr_html_()
    assert "<style>" in html and "prefers-color-scheme:dark" in html
    assert "data-jp-theme-light=false" in html and "vscode-dark" in html
    assert all("text-align:left" in style for style, _ in _cells(html))


@pytest.mark.stack
def test_on_tpu_report_end_to_end_names_the_lines_of_the_cell(shell, capsys):
    capsys.readouterr()
    shell.run_cell(
        "%%on_tpu\n"
        "wr = torch.randn(8, 8)\n"
        "for rows in (3, 5, 7, 9, 11, 13):\n"
        "    out = (torch.ones(rows, 8) @ wr).sum()\n"
        "    torch_xla.sync()\n"
        "    seen = out.item()\n"
    )
    text = capsys.readouterr().out
    assert "RECOMPILED" in text.splitlines()[0], text
    listing = text.split("the cell, annotated:\n")[1].splitlines()
    # Lines are the cell's own (line 1 holds the %%on_tpu line, not listed).
    assert not listing[0].startswith("    1")
    sync_line = [line for line in listing if line.startswith(">   5")]
    assert sync_line, listing
    marks = listing[listing.index(sync_line[0]) + 1]
    assert "recompiled" in marks and marks.lstrip().startswith("^"), marks
    assert "    4      out = (torch.ones(rows, 8) @ wr).sum()" in listing
    read = listing.index(">   6      seen = out.item()")
    assert "read from the device" in listing[read + 1], listing


def test_cache_hits_loaded_from_disk_are_told_apart():
    """A TPU restarted with the persistent compile cache finds its graphs on disk: cache
    hits, of which the report says how many came from there (the counters alone cannot be
    moved on XLA:CPU, which cannot load what it writes: constructed figures)."""
    restarted = _report(compiles=1, cache_hits=3, persistent_cache_hits=2, executions=4)
    view = RunView(restarted)
    assert "3 cache hits (2 from disk)" in view.summary()
    assert ("compile cache hits", "3 (2 from disk)") in view.figures()
    rows = str(restarted.metrics).splitlines()
    hits = next(i for i, row in enumerate(rows) if row.split()[:3] == ["compile", "cache", "hits"])
    assert rows[hits + 1].split() == ["from", "disk", "2"], rows  # under the cache hits
    assert "3 cache hits (2 from disk)" in restarted.metrics.summary()
    warm = _report(compiles=1, cache_hits=3, executions=4)  # all found in memory
    assert "disk" not in RunView(warm).summary() + str(warm.metrics) + str(warm.metrics.summary())


def test_one_time_cost_names_each_kind_it_counts():
    from tpu_nb.runtime.tracking import Judgement

    def one_time(*kinds):
        judgement = Judgement(
            one_time_kinds=kinds, one_time_compiles=len(kinds), one_time_seconds=1.0
        )
        return judgement.one_time_cost()

    assert one_time("first", "first", "warm-up") == (
        "one-time cost: 3 compiles (1.00 s): the first step's graphs (2), the steady step's"
    )
    assert one_time("first", "warm-up", "later") == (
        "one-time cost: 3 compiles (1.00 s): the first step's graph, the steady step's, "
        "a graph first needed in a later step"
    )
    assert one_time("first", "warm-up", "after", "after") == (
        "one-time cost: 4 compiles (1.00 s): the first step's graph, the steady step's, "
        "graphs after the loop's last sync (2)"
    )
    # one of a kind is said in the singular, several in the plural: never "other graphs" for one
    assert one_time("first", "variant") == (
        "one-time cost: 2 compiles (1.00 s): the first step's graph, another graph, compiled once"
    )
    assert one_time("first", "warm-up", "warm-up", "variant", "variant") == (
        "one-time cost: 5 compiles (1.00 s): the first step's graph, the steady step's graphs "
        "(2), other graphs, each compiled once"
    )


def test_several_other_graphs_of_a_line_do_not_read_as_one_compiled_again():
    from tpu_nb.display.reports import kind_words

    # "compiled another graph ×2" reads as one graph compiled twice: two are plural
    assert kind_words("variant", 1) == "compiled another graph"
    assert kind_words("variant", 2) == "compiled other graphs"
    assert kind_words("recompile", 3) == "recompiled"
