"""The layering rule, pinned (the public surface: tests/test_public_api.py)."""

import ast
import json
from pathlib import Path

import tpu_nb

PACKAGE = Path(tpu_nb.__file__).parent
NOTEBOOK_LIBS = ("IPython", "ipywidgets", "matplotlib", "ipykernel")


def test_import_tpu_nb_imports_no_notebook_library_and_no_torch_xla(py):
    out = py(f"""
        import json, sys
        import tpu_nb, tpu_nb.runtime
        print(json.dumps(sorted(m for m in {list(NOTEBOOK_LIBS) + ["torch_xla", "torch"]!r}
                                if m in sys.modules)))
    """).stdout
    assert json.loads(out) == []


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_runtime_never_imports_upward_or_notebook_libraries():
    for path in (PACKAGE / "runtime").rglob("*.py"):
        for name in _imports(path):
            top = name.split(".")[0]
            assert top not in NOTEBOOK_LIBS, f"{path.name} imports {name}"
            assert not name.startswith(("tpu_nb.display", "tpu_nb.ipython")), (
                f"{path.name} imports {name}"
            )


def test_display_never_imports_the_extension():
    for path in (PACKAGE / "display").rglob("*.py"):
        for name in _imports(path):
            assert not name.startswith("tpu_nb.ipython"), f"{path.name} imports {name}"
            assert not name.startswith("IPython.core.magic"), f"{path.name} imports {name}"
