"""The public surface: pinned, resolvable, one list with the runtime's, one version, one error
family, and the command line that names itself `tpu-nb`."""

import ast
import builtins
import inspect
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import tomllib

import tpu_nb
import tpu_nb.runtime

ROOT = Path(__file__).resolve().parents[1]
DISPLAY_NAMES = {"Dashboard", "GraphView", "dashboard"}
GRAPH_PARTS = {"Edge", "Group", "GroupEdge", "GroupedGraph", "Node", "NodeChange"}


def test_public_names_are_pinned():
    assert sorted(tpu_nb.__all__) == sorted(
        [
            "Accelerator",
            "Anatomy",
            "Chip",
            "CollectiveRefused",
            "CompileEvent",
            "Divergence",
            "HostError",
            "HostLost",
            "HostResult",
            "PodResult",
            "Dashboard",
            "DeviceTiming",
            "Environment",
            "EnvironmentProblem",
            "Frame",
            "Graph",
            "GraphDiff",
            "GraphView",
            "LaunchResult",
            "LineFinding",
            "LiveState",
            "MetricsDelta",
            "MetricsSnapshot",
            "OutOfMemory",
            "FusedOptimizer",
            "Problem",
            "RecompilationError",
            "ReplicaCrash",
            "ReplicaError",
            "ReplicaResult",
            "RunReport",
            "StepCost",
            "StepRecord",
            "RuntimeStateError",
            "TpuNbError",
            "TpuNbUsageError",
            "Verdict",
            "__version__",
            "dashboard",
            "default_device",
            "detect",
            "device",
            "graph",
            "last_report",
            "launch",
            "launch_hosts",
            "max_graphs",
            "on_tpu",
            "pending_graph",
            "reset_metrics",
            "setup",
            "snapshot",
            "sync",
            "time_device",
            "track",
        ]
    )
    assert len(set(tpu_nb.__all__)) == len(tpu_nb.__all__)
    for name in tpu_nb.__all__:
        assert getattr(tpu_nb, name) is not None
    assert callable(tpu_nb.load_ipython_extension)


def test_the_package_lists_the_user_concepts_and_keeps_every_runtime_name():
    # tpu_nb.__all__ is the runtime's list without the graph's parts, plus the display layer's
    # names and graph() (tpu_nb.runtime.graph is its package): a name added to runtime.__all__
    # must be given a group in tpu_nb/__init__.py.
    runtime = set(tpu_nb.runtime.__all__)
    assert set(tpu_nb.__all__) - runtime == DISPLAY_NAMES | {"__version__", "graph"}
    assert runtime - set(tpu_nb.__all__) == GRAPH_PARTS
    for name in runtime:  # the graph's parts too: tpu_nb.Node still works
        assert getattr(tpu_nb, name) is getattr(tpu_nb.runtime, name), name
    assert set(dir(tpu_nb)) >= DISPLAY_NAMES


def test_no_runtime_attribute_hides_its_subpackage():
    # `import tpu_nb.runtime.graph as g` and `tpu_nb.runtime.graph` are the same package.
    import tpu_nb.runtime.graph as graph_package

    for name in ("backend", "environment", "metrics", "graph", "tracking", "live", "parallel"):
        assert inspect.ismodule(getattr(tpu_nb.runtime, name)), name
    assert tpu_nb.runtime.graph is graph_package
    assert tpu_nb.graph is graph_package.graph and callable(tpu_nb.runtime.launch)


def test_launch_and_launch_hosts_name_their_options_and_return_one_type():
    for fn, returns in ((tpu_nb.launch, "LaunchResult"), (tpu_nb.launch_hosts, "PodResult")):
        signature = inspect.signature(fn)
        assert signature.return_annotation == returns
        kinds = {p.kind for p in signature.parameters.values()}
        assert inspect.Parameter.VAR_KEYWORD not in kinds
    assert "hosts" not in inspect.signature(tpu_nb.launch).parameters
    assert "devices" not in inspect.signature(tpu_nb.launch_hosts).parameters


def test_import_alone_leaves_the_display_layer_unloaded(py):
    out = py("""
        import sys
        import tpu_nb
        before = sorted(m for m in sys.modules if m.startswith("tpu_nb.display"))
        view = tpu_nb.GraphView
        print(before, view.__module__)
    """).stdout.strip()
    assert out == "[] tpu_nb.display.graph_view"


def _classes_in(annotation):
    if isinstance(annotation, type):
        yield annotation
    for arg in typing.get_args(annotation):
        yield from _classes_in(arg)


def _public_callables():
    for name in dict.fromkeys([*tpu_nb.__all__, *tpu_nb.runtime.__all__]):
        value = getattr(tpu_nb, name)
        if inspect.isfunction(value):
            yield name, value
        elif isinstance(value, type) and not issubclass(value, BaseException):
            for attr, member in vars(value).items():
                if attr.startswith("_"):
                    continue
                member = getattr(member, "__func__", member)  # classmethod, staticmethod
                member = getattr(member, "fget", member)  # property
                member = getattr(member, "func", member)  # cached_property
                if inspect.isfunction(member):
                    yield f"{name}.{attr}", member


def test_what_public_functions_return_is_exported():
    # Exported: in tpu_nb.__all__ or, for the graph's parts, in tpu_nb.runtime.__all__.
    names = [*tpu_nb.__all__, *tpu_nb.runtime.__all__]
    namespace = {name: getattr(tpu_nb, name) for name in names}
    missing = {}
    for where, fn in _public_callables():
        hints = typing.get_type_hints(fn, localns=namespace)
        for cls in _classes_in(hints.get("return")):
            if cls.__module__.startswith("tpu_nb") and cls.__name__ not in namespace:
                missing.setdefault(cls.__name__, where)
    assert missing == {}, f"returned by the public API but not exported: {missing}"


def _annotation_names(tree: ast.AST):
    """Names used in annotations, including inside string (postponed) annotations."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            args = [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
            found = [x.annotation for x in args if x is not None and x.annotation is not None]
            found += [node.returns] if node.returns is not None else []
        elif isinstance(node, ast.AnnAssign):
            found = [node.annotation]
        else:
            continue
        for annotation in found:
            for sub in ast.walk(annotation):
                if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                    yield from (
                        n.id
                        for n in ast.walk(ast.parse(sub.value, mode="eval"))
                        if isinstance(n, ast.Name)
                    )
                elif isinstance(sub, ast.Name):
                    yield sub.id


def _bound_names(tree: ast.AST) -> set[str]:
    """Everything a module binds anywhere: imports (also under TYPE_CHECKING), defs, targets."""
    bound = set(dir(builtins))
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            bound.add(node.id)
    return bound


def test_every_name_in_an_annotation_is_bound_in_its_module():
    # What type checkers and IDEs need to resolve a signature (Graph.diff -> GraphDiff).
    unresolved = {}
    for path in sorted((ROOT / "tpu_nb").rglob("*.py")):
        tree = ast.parse(path.read_text())
        missing = set(_annotation_names(tree)) - _bound_names(tree)
        if missing:
            unresolved[str(path.relative_to(ROOT))] = sorted(missing)
    assert unresolved == {}


def test_every_error_kind_is_a_tpu_nb_error():
    kinds = (tpu_nb.TpuNbUsageError, tpu_nb.EnvironmentProblem, tpu_nb.RuntimeStateError)
    for kind in kinds:
        assert issubclass(kind, tpu_nb.TpuNbError)
        with pytest.raises(tpu_nb.TpuNbError, match="Fix: x"):
            raise kind("wrong. Fix: x")
    for name in tpu_nb.__all__:
        value = getattr(tpu_nb, name)
        if isinstance(value, type) and issubclass(value, BaseException):
            assert issubclass(value, tpu_nb.TpuNbError), f"{name} is not a TpuNbError"


def test_a_wrong_argument_is_a_usage_error_caught_as_tpu_nb_error():
    with pytest.raises(tpu_nb.TpuNbUsageError, match="Fix: "):
        tpu_nb.Graph.from_ir_text("not IR at all")
    with pytest.raises(tpu_nb.TpuNbError, match="unknown grouping"):
        tpu_nb.Graph.from_ir_text(_SMALL_IR).groups(by="colour")


_SMALL_IR = """IR {
  %0 = f32[2]{0} xla::device_data(), xla_shape=f32[2]{0}
  %1 = f32[2]{0} aten::mul(%0, %0), xla_shape=f32[2]{0}, ROOT=0
}
"""


def test_version_is_written_once():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"]
    assert "version" in project["project"]["dynamic"]
    attr = project["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    module, _, name = attr.rpartition(".")
    assert getattr(__import__(module, fromlist=[name]), name) == tpu_nb.__version__
    assert tpu_nb.__version__.count(".") == 2
    written = [p for p in (ROOT / "tpu_nb").rglob("*.py") if "__version__ = " in p.read_text()]
    assert written == [ROOT / "tpu_nb" / "_version.py"]


def _cli(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "tpu_nb", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )


def test_cli_version_and_usage_name_tpu_nb():
    version = _cli("--version")
    assert version.returncode == 0 and version.stdout.strip() == f"tpu-nb {tpu_nb.__version__}"
    usage = _cli()
    assert usage.returncode == 2
    assert usage.stderr.startswith("usage: tpu-nb ")
    assert "the following arguments are required: command" in usage.stderr
    wrong = _cli("doctr")
    assert wrong.returncode == 2 and "invalid choice: 'doctr'" in wrong.stderr


def test_doctor_prints_tpu_nb_version_first():
    out = _cli("doctor", env={"PJRT_DEVICE": "CPU"})
    assert out.stdout.splitlines()[0] == f"tpu_nb {tpu_nb.__version__}"
    assert "tpu_nb environment" in out.stdout
