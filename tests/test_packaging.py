"""The pins agree everywhere they are written, and the package builds."""

import re
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]


def _pins(lines):
    out = {}
    for line in lines:
        m = re.match(r"^\s*([A-Za-z0-9_.-]+)(\[[^\]]*\])?==([^\s;#]+)", line)
        if m:
            out[m.group(1).lower().replace("_", "-")] = m.group(3)
    return out


def test_binder_pins_agree_with_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    ours = _pins(project["dependencies"])
    binder = _pins((ROOT / "binder/requirements.txt").read_text().splitlines())
    assert ours["torch"] == binder["torch"] == "2.9.0"
    assert ours["torch-xla"] == binder["torch-xla"] == "2.9.0"
    assert "PJRT_DEVICE=CPU" in (ROOT / "binder/start").read_text()


def test_tpu_extra_pins_the_same_torch_xla():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    tpu = _pins(project["optional-dependencies"]["tpu"])
    assert tpu["torch-xla"] == _pins(project["dependencies"])["torch-xla"]


def test_pair_constant_matches_the_pins():
    from tpu_nb.runtime.environment import TORCH_PAIR

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert _pins(project["dependencies"])["torch"] == TORCH_PAIR


# -- the locked test environment (uv.lock) ----------------------------------------------------


def _project():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _lock():
    return tomllib.loads((ROOT / "uv.lock").read_text())


def _locked_versions(name):
    return {p["version"] for p in _lock()["package"] if p["name"] == name}


def _normalized(name):
    return name.lower().replace("_", "-")


def _wanted(requirements):
    from packaging.requirements import Requirement

    out = set()
    for text in requirements:
        req = Requirement(text)
        out.add((_normalized(req.name), tuple(sorted(req.extras)), str(req.specifier)))
    return out


def _recorded(entries, extra=None):
    from packaging.specifiers import SpecifierSet

    return {
        (
            _normalized(r["name"]),
            tuple(sorted(r.get("extras", []))),
            str(SpecifierSet(r.get("specifier", ""))),
        )
        for r in entries
        if r.get("marker", "").replace('"', "'") == (f"extra == '{extra}'" if extra else "")
    }


def test_lock_was_made_from_these_dependencies():
    # What uv recorded for the project is what pyproject.toml asks for now (else someone edited
    # the dependencies without `tools/setup-env --lock`, and setup-env refuses to build).
    project = _project()["project"]
    own = next(p for p in _lock()["package"] if p["name"] == "tpu-nb")["metadata"]
    assert _recorded(own["requires-dist"]) == _wanted(project["dependencies"])
    for extra, requirements in project["optional-dependencies"].items():
        assert _recorded(own["requires-dist"], extra) == _wanted(requirements), extra
    for group, requirements in _project()["dependency-groups"].items():
        assert _recorded(own["requires-dev"][group]) == _wanted(requirements), group


def test_lock_pins_the_torch_stack_and_both_notebook_stacks():
    assert _locked_versions("torch") == {"2.9.0"}
    assert _locked_versions("torch-xla") == {"2.9.0"}
    assert _locked_versions("torchvision") == {"0.24.0"}
    (transformers,) = _locked_versions("transformers")
    assert transformers.startswith("4.57.")
    colab = _pins(_project()["dependency-groups"]["colab"])
    assert colab == {"ipython": "7.34.0", "ipykernel": "6.17.1", "ipywidgets": "7.7.1"}
    for name, version in colab.items():
        current = _locked_versions(name) - {version}
        assert version in _locked_versions(name) and current, name  # both stacks are locked
        assert all(int(v.split(".")[0]) > int(version.split(".")[0]) for v in current)


def test_setup_env_is_keyed_on_the_lock(tmp_path):
    import os
    import subprocess

    def path(root=ROOT):
        return subprocess.run(
            [str(root / "tools/setup-env"), "--path"],
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "TPU_NB_ENV_ROOT": str(tmp_path)},
        ).stdout.strip()

    here = path()
    assert os.path.dirname(here) == str(tmp_path)
    assert not os.path.exists(here)  # --path never builds
    # A fresh clone with the same lock names the same environment.
    clone = tmp_path / "clone"
    (clone / "tools").mkdir(parents=True)
    for name in ("uv.lock", "tools/setup-env", "tools/diffusers-layer.txt"):
        (clone / name).write_bytes((ROOT / name).read_bytes())
    (clone / "tools/setup-env").chmod(0o755)
    assert path(clone) == here
    (clone / "uv.lock").write_text((ROOT / "uv.lock").read_text() + "\n# changed\n")
    changed = path(clone)
    assert changed != here
    # The diffusers layer's pins are part of the key too.
    (clone / "uv.lock").write_bytes((ROOT / "uv.lock").read_bytes())
    pins = clone / "tools/diffusers-layer.txt"
    pins.write_text(pins.read_text() + "\n# changed\n")
    assert path(clone) not in (here, changed)


# -- what is declared and what ships ----------------------------------------------------------

# Import names of the distributions tpu_nb uses directly.
_DISTRIBUTION_OF = {"IPython": "ipython", "torch_xla": "torch-xla"}
# used when installed, never required: tpu_info (TPU VMs, Colab); ray (the `pod` extra)
_OPTIONAL = {"tpu_info", "ray"}


def _third_party_imports():
    import ast
    import sys

    names = set()
    for path in (ROOT / "tpu_nb").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != "tpu_nb"}


def test_every_package_imported_directly_is_declared():
    from packaging.requirements import Requirement

    declared = {Requirement(r).name.lower() for r in _project()["project"]["dependencies"]}
    for module in sorted(_third_party_imports() - _OPTIONAL):
        dist = _DISTRIBUTION_OF.get(module, module).lower()
        assert dist in declared, f"tpu_nb imports {module} but does not declare {dist}"


def test_sdist_ships_the_package_licence_and_no_unrunnable_tests(tmp_path):
    import subprocess
    import sys
    import tarfile

    build = "import sys, setuptools.build_meta as b; print(b.build_sdist(sys.argv[1]))"
    name = subprocess.run(
        [sys.executable, "-c", build, str(tmp_path)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout.split()[-1]
    with tarfile.open(tmp_path / name) as sdist:
        files = {m.name.split("/", 1)[1] for m in sdist.getmembers() if "/" in m.name}
        info = sdist.extractfile(f"{name.removesuffix('.tar.gz')}/PKG-INFO").read().decode()
    import tpu_nb

    assert {"LICENSE", "tpu_nb/py.typed", "tpu_nb/__init__.py", "tpu_nb/_version.py"} <= files
    assert not [f for f in files if f.startswith("tests/")]
    assert "License-Expression: Apache-2.0" in info
    assert f"\nVersion: {tpu_nb.__version__}\n" in info
    for dist in ("numpy", "packaging", "traitlets"):
        assert f"Requires-Dist: {dist}\n" in info


def test_pre_commit_hooks_are_valid_and_use_the_locked_tools():
    import subprocess
    import sys

    bin_dir = Path(sys.executable).parent
    config = ROOT / ".pre-commit-config.yaml"
    check = subprocess.run(
        [str(bin_dir / "pre-commit"), "validate-config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert check.returncode == 0, check.stdout + check.stderr
    text = config.read_text()
    assert "repo: local" in text and "repo: https" not in text  # nothing to download
    for tool in ("ruff", "mypy"):
        assert f'"$(tools/setup-env)/bin/{tool}"' in text
        assert (bin_dir / tool).exists(), f"{tool} is not in the test environment"
