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
VERDICTS = ("device-bound", "host-bound", "input-bound", "compile-bound", "read-bound")

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
    "07_performance": [
        ("host-bound", False, {"fallback", "host-read"}),
        ("host-bound", False, set()),
        ("input-bound", False, set()),
        ("no verdict yet", False, set()),
        ("compile-bound", True, {"recompile"}),
        ("", False, set()),
    ],
    # the same step judged for a v5e, then for a 5 MB chip (the memory verdict is not a
    # bound); the out-of-memory cell is no loop
    "08_memory": [
        ("host-bound", False, set()),
        ("host-bound", False, set()),
        ("", False, set()),
    ],
    # trainer.train() with dynamic padding: recompiling, told Trainer's padding setting and
    # the SDPA mask check's; padded to a multiple (one shape) with eager attention: neither
    "09_hugging_face": [
        ("compile-bound", True, {"recompile", "host-read"}),
        ("host-bound", False, set()),
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
