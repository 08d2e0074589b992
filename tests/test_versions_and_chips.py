"""Version strings parsed as PEP 440 (packaging), TPU chips named by tpu-info's table when it is
installed, and the silent fallbacks leaving a trace under the `tpu_nb` logger."""

import pytest

from tpu_nb.runtime.environment import chip_generation
from tpu_nb.runtime.environment._detect import _release, _same_release


@pytest.mark.parametrize(
    "version, release",
    [
        ("2.9.0", (2, 9, 0)),
        ("2.9.0+cu128", (2, 9, 0)),
        ("2.10.0rc1", (2, 10, 0)),
        ("2.9.0.dev20250101+cpu", (2, 9, 0)),
        ("2.9", (2, 9)),
        ("custom-build", None),
        ("", None),
        (None, None),
    ],
)
def test_release_reads_pep440_versions(version, release):
    assert _release(version) == release


def test_same_release_compares_major_minor_and_odd_versions_as_written():
    assert _same_release("2.9.0+cu128", "2.9.1")
    assert not _same_release("2.10.0", "2.9.0")
    assert not _same_release("custom-build", "2.9.0")
    assert _same_release("custom-build", "custom-build")


def _fake_torch(tmp_path, version):
    # Metadata of another torch, put in front of the real one (as test_environment.py does).
    dist = tmp_path / f"torch-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch\nVersion: {version}\n")


def test_a_torch_version_that_is_not_pep440_is_a_mismatch_not_a_crash(py, tmp_path):
    # Before: _release() returned None for it and detect() failed with a TypeError.
    _fake_torch(tmp_path, "local.build")
    out = py(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        import tpu_nb
        env = tpu_nb.detect()
        p = [p for p in env.problems if p.code == "version-mismatch"][0]
        print(env.ok, "|", p.message, "|", p.fix)
    """).stdout
    ok, message, fix = out.strip().split(" | ")
    assert ok == "False"
    assert message.startswith("torch local.build does not match torch_xla 2.9.0")
    assert fix.startswith("pip install torch==2.9.0 torch-xla==2.9.0")


def test_chip_names_come_from_tpu_info_when_installed():
    pytest.importorskip("tpu_info.device", reason="tpu-info is in the test extra")
    assert chip_generation("0x0062") == "v5p"  # tpu_nb's own table had no name for it
    assert chip_generation("0x0027", "0x004f") == "v3"  # tpu-info reads the subsystem id
    assert chip_generation("0x0027", "0x004e") == "v2"
    assert chip_generation("0x005e") == "v4"
    assert chip_generation("0x0056") is None  # a chip torch_xla counts, unnamed


def test_without_tpu_info_our_table_names_the_chips(py):
    out = py("""
        import sys
        sys.modules["tpu_info"] = None          # as on a machine without tpu-info
        from tpu_nb.runtime.environment import chip_generation
        print(chip_generation("0x0062"), chip_generation("0x0027", "0x004f"))
    """).stdout.split()
    assert out == ["v5p", "v2/v3"]


def test_a_broken_tpu_info_falls_back_and_leaves_a_debug_trace(py, tmp_path):
    broken = tmp_path / "tpu_info"
    broken.mkdir()
    (broken / "__init__.py").write_text("")
    (broken / "device.py").write_text("raise RuntimeError('protobuf gencode mismatch')\n")
    out = py(f"""
        import logging, sys
        sys.path.insert(0, {str(tmp_path)!r})
        logging.basicConfig(level=logging.DEBUG, format="%(name)s %(levelname)s %(message)s",
                            stream=sys.stdout)
        from tpu_nb.runtime.environment import chip_generation
        print("NAME", chip_generation("0x0063"))
    """).stdout
    assert "NAME v5e" in out
    trace = [line for line in out.splitlines() if line.startswith("tpu_nb.")]
    assert trace == [
        "tpu_nb.runtime.environment DEBUG tpu-info failed to import "
        "(RuntimeError('protobuf gencode mismatch')); using tpu_nb's chip table"
    ]


def test_nothing_is_logged_at_the_default_level(py):
    out = py("""
        import logging, sys
        logging.basicConfig(stream=sys.stdout, format="%(name)s %(message)s")
        import tpu_nb
        tpu_nb.detect()
        print("done")
    """).stdout
    assert out.strip() == "done"
