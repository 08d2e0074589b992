"""Each tutorial notebook has one reviewed source, notebooks/NN_name.md (MyST markdown, paired
with the .ipynb by jupytext), and the .ipynb's cells are exactly what that source says. The
.ipynb keeps the recorded outputs nbval compares against; the .md holds no outputs."""

from pathlib import Path

import jupytext
import nbformat
import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
PAIRED = "ipynb,md:myst"
NOTEBOOK_FILES = sorted(NOTEBOOKS.glob("*.ipynb"))


def _cells(nb) -> list[tuple[str, str, list]]:
    """What the source decides: each cell's type, text and tags (ids and outputs are not)."""
    return [(c.cell_type, c.source, c.metadata.get("tags", [])) for c in nb.cells]


def test_every_notebook_and_every_source_has_its_pair():
    sources = {p.stem for p in NOTEBOOKS.glob("*.md")}
    notebooks = {p.stem for p in NOTEBOOK_FILES}
    assert len(notebooks) >= 8
    assert sources == notebooks


@pytest.mark.parametrize("notebook", NOTEBOOK_FILES, ids=lambda p: p.stem)
def test_notebook_cells_are_what_its_source_says(notebook):
    source = notebook.with_suffix(".md")
    from_source = jupytext.read(source)
    recorded = nbformat.read(notebook, as_version=4)
    assert recorded.metadata.get("jupytext", {}).get("formats") == PAIRED, (
        f"{notebook.name} is not paired with its source. Fix: "
        f"jupytext --set-formats {PAIRED} notebooks/{notebook.name}"
    )
    assert from_source.metadata.get("jupytext", {}).get("formats") == PAIRED
    expected, found = _cells(from_source), _cells(recorded)
    first = next(
        (i for i, (a, b) in enumerate(zip(expected, found, strict=False)) if a != b),
        min(len(expected), len(found)),
    )
    assert found == expected, (
        f"{notebook.name} differs from {source.name} from cell {first} on "
        f"({len(found)} cells vs {len(expected)} in the source). Fix: "
        f"jupytext --sync notebooks/{source.name} (make sync-notebooks), then record its "
        f"outputs with tools/record_outputs.py notebooks/{notebook.name}"
    )


def test_sources_hold_no_outputs():
    # Outputs live in the .ipynb only; a source that carried them could not be reviewed.
    for source in sorted(NOTEBOOKS.glob("*.md")):
        nb = jupytext.read(source)
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), source.name
