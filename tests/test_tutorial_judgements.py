"""Each tutorial's `%%on_tpu` reports keep the verdict and the kinds of advice its lesson
teaches: no tutorial shows advice that contradicts its own lesson (padding advice on the
bucketing fix, "read after the loop" on a read after the loop, compile-bound on a warm-up).

The recorded outputs are what `make test-notebooks` compares each run with (nbval), so
pinning them here pins what a learner sees. When a tutorial changes, re-record it and update
the table only after reading the report as a learner would.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tpu_nb.display.reports import KIND_WORDS

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
VERDICTS = (
    "device-bound",
    "host-bound",
    "input-bound",
    "compile-bound",
    "read-bound",
    "does-not-fit",
)

# notebook -> one entry per %%on_tpu report, in order: (the verdict on the summary line, or
# "no verdict yet", or "" for a cell that is not a loop — "a|b" where the run decides which;
# RECOMPILED shown; the kinds of finding that come with advice).
EXPECTED: dict[str, list[tuple[str, bool, set[str]]]] = {
    "00_getting_started": [
        ("", False, set()),
        ("", False, set()),
    ],
    "01_modules_and_autograd": [
        ("host-bound", False, set()),
        ("host-bound", False, set()),
    ],
    # judged for a v5e: its tracing takes longer than the chip's work (XLA:CPU's own
    # execution, the CPU's, is no evidence for a device-bound loop)
    "02_training": [
        ("no verdict yet", False, set()),
        ("host-bound", False, set()),
        ("host-bound", False, set()),
        ("host-bound", False, set()),
    ],
    "03_lazy_tensors": [
        ("", False, set()),  # one training step under --graph: no loop to judge
        ("", False, set()),
        ("", False, {"host-read"}),
        ("", False, set()),
        ("compile-bound", True, {"recompile"}),
        ("host-bound", False, set()),
        ("", False, set()),
        ("host-bound", False, set()),
    ],
    "04_multiple_devices": [
        # four steps of a small model over 4 virtual devices: host and device time are close
        # on XLA:CPU, so either bound is the truth of a given run
        ("device-bound|host-bound", False, set()),
    ],
    "06_saving_and_loading": [
        ("", False, set()),
    ],
    # the first loop stops every step for a read and a CPU fallback: read-bound, naming
    # them; the fixed loop is one graph per step, host-bound for a v5e (a tiny model)
    "07_performance": [
        ("read-bound", False, {"fallback", "host-read"}),
        ("host-bound", False, set()),
        ("input-bound", False, set()),
        ("no verdict yet", False, set()),
        ("compile-bound", True, {"recompile"}),
        ("", False, set()),
    ],
    # the same step judged for a v5e, then for a 5 MB chip it does not fit (no speed is
    # judged for a step that cannot run); the out-of-memory cell is no loop
    "08_memory": [
        ("host-bound", False, set()),
        ("does-not-fit", False, set()),
        ("", False, set()),
    ],
    # trainer.train() with dynamic padding: recompiling, told Trainer's padding setting, the
    # SDPA mask check's read in every step a fact (its tracing is long beside a v5e's work);
    # padded to a multiple: one shape, and the read is the verdict (a v5e at 1 % of its peak
    # could take about as long as tracing); eager attention: no read left, host-bound for a
    # v5e, no advice but the verdict's
    "09_hugging_face": [
        ("compile-bound", True, {"recompile"}),
        ("read-bound", False, {"host-read"}),
        ("host-bound", False, set()),
    ],
    # the same small step twice, the second under --profile 3 with StepTrace annotations:
    # a tiny model, host-bound for a v5e; the first step's graph is the one compile
    "10_profiling": [
        ("host-bound", False, set()),
        ("host-bound", False, set()),
    ],
    # data parallel, weights sharded by hand, FSDPv2: five steps each over 4 virtual
    # devices; host and device time are close on XLA:CPU, as in 04
    "11_scaling": [
        ("device-bound|host-bound", False, set()),
        ("device-bound|host-bound", False, set()),
        ("device-bound|host-bound", False, set()),
    ],
}


def reports(path: Path) -> list[str]:
    """The plain-text report of each `%%on_tpu` cell, in order."""
    out = []
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] != "code" or not "".join(cell["source"]).startswith("%%on_tpu"):
            continue
        texts = [
            "".join(o.get("data", {}).get("text/plain", ""))
            for o in cell.get("outputs", [])
            if o.get("output_type") in ("display_data", "execute_result")
        ]
        out.append(next((t for t in texts if t.startswith("XLA: ")), ""))
    return out


def judgement(text: str) -> tuple[str, bool, set[str]]:
    lines = text.splitlines()
    head = lines[0] if lines else ""
    last = head.rsplit(" | ", 1)[-1]
    verdict = last if last in VERDICTS or last == "no verdict yet" else ""
    advice: set[str] = set()
    if "what to do:" in lines:
        for line in lines[lines.index("what to do:") + 1 :]:
            if not line.startswith("  ") or line.startswith("   "):
                break
            words = line.strip().split(" (", 1)[0]
            advice |= {kind for kind, said in KIND_WORDS.items() if said == words}
    return verdict, "RECOMPILED" in head, advice


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_tutorial_reports_keep_their_lesson(name):
    got = [judgement(t) for t in reports(NOTEBOOKS / f"{name}.ipynb")]
    assert len(got) == len(EXPECTED[name]), got
    for (verdict, recompiled, advice), (verdicts, expect_recompiled, expect_advice) in zip(
        got, EXPECTED[name], strict=True
    ):
        assert verdict in verdicts.split("|"), (got, EXPECTED[name])
        assert (recompiled, advice) == (expect_recompiled, expect_advice), got


def test_every_tutorial_report_is_pinned():
    for path in sorted(NOTEBOOKS.glob("*.ipynb")):
        if reports(path):
            assert path.stem in EXPECTED, f"{path.stem}: add its reports to EXPECTED"


# notebook -> (index of its %%on_tpu report, a figure of the summary line its lesson states)
STATED_COUNTS: dict[str, list[tuple[int, str]]] = {
    "01_modules_and_autograd": [(0, "2 compiled"), (0, "18 cache hits"), (1, "0 compiled")],
    "02_training": [(1, "2 compiled"), (1, "30 cache hits"), (1, "1 host read |")],
    "03_lazy_tensors": [(4, "4 compiled"), (5, "2 compiled"), (7, "2 compiled")],
    "07_performance": [
        (0, "15 host reads"),
        (0, "15 CPU fallbacks"),
        (1, "1 host read |"),
        (2, "1 compiled"),
    ],
    "10_profiling": [
        (0, "1 compiled"),
        (0, "7 cache hits"),
        (1, "1 compiled"),
        (1, "4 executed"),
        (1, "3 cache hits"),
    ],
    "11_scaling": [(i, "5 executed") for i in range(3)],
}
# notebook -> (report, words its lesson relies on, in the report's details)
STATED_FACTS: dict[str, list[tuple[int, str]]] = {
    # the first step's graph also computed the pending targets
    "01_modules_and_autograd": [(0, "aten::sum")],
    # the fixed loop's first graph also ran the pending split of the data
    "07_performance": [(1, "aten::split"), (1, "the first step's and the steady step's")],
    # the bucketed loop under --max-graphs 2 compiles its two graphs once each
    "03_lazy_tensors": [(7, "2 graphs, each compiled once")],
    # the lesson reads the memory line as 16 bytes per parameter (300,040 of them), then one
    # device's quarter of the sharded parameters, gradients (laid out as the cell ends) and
    # AdamW state
    "11_scaling": [
        (0, "parameters 1.2 MB, gradients 1.2 MB, optimizer state 2.4 MB"),
        (1, "parameters 300 KB, gradients 300 KB, optimizer state 600 KB"),
        (2, "parameters 300 KB, gradients 300 KB, optimizer state 600 KB"),
    ],
}


@pytest.mark.parametrize("name", sorted(STATED_COUNTS))
def test_reports_show_the_counts_their_lessons_state(name):
    got = reports(NOTEBOOKS / f"{name}.ipynb")
    for index, figure in STATED_COUNTS[name]:
        head = got[index].splitlines()[0] + " |"
        assert f"| {figure}" in head or head.startswith(f"XLA: {figure}"), (figure, head)
    for index, words in STATED_FACTS.get(name, []):
        assert words in got[index], (words, got[index])


# torch_xla's own words for a compile's cause, and tpu_nb's internal names
_RAW = (
    "user torch_xla.sync",
    "access tensor value",
    "dynamo is compiling",
    "parallel loader at step end",
    "dynamo processing input graphs",
    "has_kwargs",
    "torch_dynamo_resume_in",
)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_report_sentences_hold_no_ids_raw_causes_or_two_meanings_of_warm_up(name):
    import re

    for text in reports(NOTEBOOKS / f"{name}.ipynb"):
        sentences = text.split("\nthe cell, annotated:")[0]  # not the cell's own code
        for line in sentences.splitlines():
            assert not re.search(r"\bgraph [0-9a-f]{8}\b", line), line
            assert not any(raw in line for raw in _RAW), line
            assert "warm-up" not in line and "state created on the way" not in line, line
            assert not re.search(r"\b1 (host reads|cache hits|CPU fallbacks)\b", line), line


# notebook -> the steps each `%%on_tpu --profile N` timeline covers, as its lesson states
PROFILED_STEPS: dict[str, list[int]] = {"10_profiling": [3]}


@pytest.mark.parametrize("name", sorted(PROFILED_STEPS))
def test_profile_timelines_cover_the_steps_their_lessons_state(name):
    cells = json.loads((NOTEBOOKS / f"{name}.ipynb").read_text())["cells"]
    heads = [
        "".join(o.get("data", {}).get("text/plain", ""))
        for c in cells
        if c["cell_type"] == "code" and "".join(c["source"]).startswith("%%on_tpu --profile")
        for o in c.get("outputs", [])
        if "".join(o.get("data", {}).get("text/plain", "")).startswith("profile of ")
    ]
    assert [int(h.split(": ", 1)[1].split(" steps", 1)[0]) for h in heads] == PROFILED_STEPS[name]
