"""The pins agree everywhere they are written, and the package builds."""

import re
import tomllib
from pathlib import Path

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
