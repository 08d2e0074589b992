"""The layering rule, pinned (the public surface: tests/test_public_api.py)."""

import ast
import json
from pathlib import Path

import tpu_nb

PACKAGE = Path(tpu_nb.__file__).parent
NOTEBOOK_LIBS = ("IPython", "ipywidgets", "matplotlib", "ipykernel")


def test_import_tpu_nb_imports_no_notebook_library_and_no_torch_xla(py):
    out = py(
        f"""
        import json, sys
        import tpu_nb, tpu_nb.runtime
        print(json.dumps(sorted(m for m in {list(NOTEBOOK_LIBS) + ["torch_xla", "torch"]!r}
                                if m in sys.modules)))
    """,
        cold=True,
    ).stdout
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


# -- no import cycles --------------------------------------------------------------------------
#
# Every import counts, also those inside functions (a function-level import that closes a
# cycle only hides it until the function runs) and those under `if TYPE_CHECKING:` (they never
# run, but two modules that each need the other's types are one module in two files: the
# shared type belongs lower, e.g. runtime/frame.py, or in a Protocol). A package's own
# `__init__` importing its modules is not a cycle.


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _runtime_imports(
    name: str, path: Path, modules: dict[str, Path], *, typing: bool = True
) -> set[str]:
    """The tpu_nb modules `name` imports; `typing=False` leaves out `if TYPE_CHECKING:` blocks
    (what runs)."""
    tree = ast.parse(path.read_text())
    typing_only = (
        set()
        if typing
        else {
            id(node)
            for block in ast.walk(tree)
            if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
            for node in ast.walk(block)
        }
    )
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            submodules = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]
            targets = submodules if len(submodules) == len(node.names) else [base, *submodules]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # tpu_nb.x.y.Name -> tpu_nb.x.y
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def _import_graph(*, typing: bool = True) -> dict[str, set[str]]:
    modules = _modules()
    graph = {
        name: _runtime_imports(name, path, modules, typing=typing) for name, path in modules.items()
    }
    for name in graph:  # a package importing its own modules is how a package is built
        graph[name] = {t for t in graph[name] if not t.startswith(name + ".")}
    return graph


def test_no_module_imports_in_a_cycle():
    assert _cycles(_import_graph()) == []  # imports for type checking included


def test_no_module_imports_in_a_cycle_at_run_time():
    # Implied by the test above; kept apart so that a failure says which kind of cycle it is.
    assert _cycles(_import_graph(typing=False)) == []


def test_runtime_packages_import_each_other_in_one_order():
    """Above the foundations, each runtime package imports only packages listed before it."""
    order = [
        "backend",
        "probe",
        "environment",
        "metrics",
        "graph",
        "tracking",
        "live",
        "parallel",
        "plan",
    ]
    base = (
        "tpu_nb.runtime.errors",
        "tpu_nb.runtime.units",
        "tpu_nb.runtime.frame",
        "tpu_nb.runtime.sources",
    )
    for name, targets in _import_graph().items():
        if not name.startswith("tpu_nb.runtime.") or name in base:
            continue
        own = name.split(".")[2]
        for target in targets:
            if target in base or not target.startswith("tpu_nb.runtime."):
                continue
            other = target.split(".")[2]
            assert order.index(other) <= order.index(own), f"{name} imports {target}"


def test_the_cycle_check_finds_a_cycle_hidden_in_a_function(tmp_path):
    # _counters as if it imported track() inside a function: _report imports it at its top.
    module = tmp_path / "_counters.py"
    module.write_text("def f():\n    from tpu_nb.runtime.tracking._report import track\n")
    graph = _import_graph()
    name = "tpu_nb.runtime.metrics._counters"
    graph[name] = _runtime_imports(name, module, _modules())
    assert any(name in cycle for cycle in _cycles(graph))
    typing_only = tmp_path / "_typing.py"
    typing_only.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from tpu_nb.runtime.tracking._report import track\n"
    )
    graph[name] = _runtime_imports(name, typing_only, _modules())
    assert any(name in cycle for cycle in _cycles(graph))  # a cycle of types is one too
    graph[name] = _runtime_imports(name, typing_only, _modules(), typing=False)
    assert _cycles(graph) == []  # but it never runs


def test_benchmark_only_code_is_not_shipped():
    shipped = "\n".join(p.read_text() for p in PACKAGE.rglob("*.py"))
    for name in ("def synthetic_ir", "def count_crossings"):
        assert name not in shipped


def test_no_private_name_is_imported_from_another_module():
    """`from x import _name` across modules hides a helper where it does not belong (a
    sub-package's private modules, `from pkg import _module`, are how packages are built)."""
    modules = _modules()
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tpu_nb"):
                for alias in node.names:
                    private = alias.name.startswith("_") and not alias.name.startswith("__")
                    if private and f"{node.module}.{alias.name}" not in modules:
                        raise AssertionError(f"{name} imports {alias.name} from {node.module}")


# -- torch_xla only behind the backend seam ----------------------------------------------------
#
# tpu_nb/runtime/backend/ is the one package that imports torch_xla or looks it up in
# sys.modules; everything else asks a `Backend` (tpu_nb.runtime.backend.current()): a module
# that reaches torch_xla itself fails this test. (The backend once handed out torch_xla
# itself through `xla()`/`xlac()`; a module importing names like them from the backend is
# flagged too, so no such handle comes back.)
HANDLES = {"xla", "xlac"}


def _reaches_torch_xla(tree: ast.AST) -> list[str]:
    """How a module reaches torch_xla: imports of it, sys.modules lookups of it, and handles
    to it imported from the backend."""

    def names_torch_xla(node) -> bool:
        return isinstance(node, ast.Constant) and str(node.value).split(".")[0] == "torch_xla"

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if a.name.split(".")[0] == "torch_xla"]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if module.split(".")[0] == "torch_xla":
                found.append(f"from {module} import ...")
            elif module == "tpu_nb.runtime.backend":
                found += [f"backend.{a.name}" for a in node.names if a.name in HANDLES]
        elif isinstance(node, ast.Subscript):
            lookup = ast.unparse(node.value) == "sys.modules" and names_torch_xla(node.slice)
            found += [ast.unparse(node)] if lookup else []
        elif isinstance(node, ast.Call) and ast.unparse(node.func) == "sys.modules.get":
            lookup = bool(node.args) and names_torch_xla(node.args[0])
            found += [ast.unparse(node)] if lookup else []
        elif isinstance(node, ast.Compare) and names_torch_xla(node.left):
            lookup = any(ast.unparse(c) == "sys.modules" for c in node.comparators)
            found += [ast.unparse(node)] if lookup else []
    return found


def test_only_walk_stack_reads_another_threads_frames():
    """A frame held by a walk from another thread keeps its function's tensors alive after it
    returns, into the next sync's graph: every such walk goes through `frame.walk_stack`,
    which a sync waits for."""
    readers = {
        name
        for name, path in _modules().items()
        if any(
            isinstance(node, ast.Attribute) and node.attr == "_current_frames"
            for node in ast.walk(ast.parse(path.read_text()))
        )
    }
    assert readers == {"tpu_nb.runtime.frame"}


def test_frames_are_taken_and_walked_in_two_modules():
    """How tpu_nb finds a line is read in one place: every frame is taken (`caller`) or
    walked (outwards, through a traceback, or on another thread) by `sources` and `frame`."""
    walking = {"_getframe", "f_back", "tb_next", "_current_frames"}
    walkers = {
        name
        for name, path in _modules().items()
        if any(
            isinstance(node, ast.Attribute) and node.attr in walking
            for node in ast.walk(ast.parse(path.read_text()))
        )
    }
    assert walkers == {"tpu_nb.runtime.sources", "tpu_nb.runtime.frame"}


def test_only_the_backend_package_reaches_torch_xla():
    reaching = {}
    for name, path in _modules().items():
        if name.startswith("tpu_nb.runtime.backend"):
            continue
        found = _reaches_torch_xla(ast.parse(path.read_text()))
        if found:
            reaching[name] = found
    assert reaching == {}, "route these through tpu_nb.runtime.backend.current()"


def test_the_torch_xla_check_sees_each_way_to_reach_it():
    source = (
        "import sys\nimport torch_xla.runtime as xr\nfrom torch_xla.core import xla_model\n"
        "from tpu_nb.runtime.backend import current, xlac\n"
        "a = sys.modules['torch_xla']\nb = sys.modules.get('torch_xla.debug')\n"
        "c = 'torch_xla' in sys.modules\nd = 'torch_xla.sync() ends a step'\n"
    )
    assert _reaches_torch_xla(ast.parse(source)) == [
        "import torch_xla.runtime",
        "from torch_xla.core import ...",
        "backend.xlac",
        "sys.modules['torch_xla']",
        "sys.modules.get('torch_xla.debug')",
        "'torch_xla' in sys.modules",
    ]


def _private_module_imports(name: str, path: Path) -> set[str]:
    """The runtime modules `name` names that are private to their package: `from
    tpu_nb.runtime.pkg._mod import x`, `from tpu_nb.runtime.pkg import _mod`, `import ...`."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            if parts[:2] != ["tpu_nb", "runtime"]:
                continue
            private = [i for i, part in enumerate(parts) if i > 2 and part.startswith("_")]
            if private:  # tpu_nb.runtime.pkg._mod(.name): the module is what counts
                found.add(".".join(parts[: private[0] + 1]))
    return found


def test_display_and_extension_use_runtime_packages_through_their_init():
    """Above the runtime, a runtime package is what its `__init__` names: its modules are
    private. (Inside the runtime, packages import each other's modules in the stack order:
    see CONTRIBUTING.)"""
    reached = {
        (name, target)
        for name, path in _modules().items()
        if name.startswith(("tpu_nb.display", "tpu_nb.ipython"))
        for target in _private_module_imports(name, path)
    }
    assert reached == set()


def test_the_private_module_check_sees_each_import_form(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "from tpu_nb.runtime.tracking._anatomy import current\n"
        "from tpu_nb.runtime.environment import _legacy\n"
        "import tpu_nb.runtime.metrics._counters\n"
        "from tpu_nb.runtime.environment import detect\n"
    )
    assert _private_module_imports("m", module) == {
        "tpu_nb.runtime.tracking._anatomy",
        "tpu_nb.runtime.environment._legacy",
        "tpu_nb.runtime.metrics._counters",
    }
