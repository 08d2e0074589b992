"""The compile log deleted, replaced, truncated or unwritable, and bounded: reports never show
another run's events, and say when causes are unknown.

torch_xla writes the log of the process it runs in, latched at the first compile: every
scenario with real compiles runs in a fresh process.
"""

from __future__ import annotations

import json

import pytest

from tpu_nb.runtime.metrics import CompileLog
from tpu_nb.runtime.metrics._compile_log import MAX_EVENTS

pytestmark = pytest.mark.timeout(240)

# A "cell": compiles `n` graphs never seen before (a new shape each), tracked like %%on_tpu.
PRELUDE = """
import json, os, shutil, stat, tpu_nb, torch, torch_xla
from tpu_nb.runtime.metrics import compile_log
tpu_nb.setup("cpu")
dev = torch_xla.device()
shape = [2]
def cell(n, midway=None):
    log = compile_log()
    offset = log.size()
    with tpu_nb.track() as report:
        for i in range(n):
            if i == n // 2 and midway:
                midway()
            shape[0] += 1
            (torch.ones(shape[0], device=dev) * 2).sum().item()
    events = report.compile_events
    return {"compiles": report.metrics.compiles, "events": len(events),
            "sizes": sorted({e.inputs for e in events}),
            "problem": log.problem_since(offset, report.metrics.compiles)}
"""


@pytest.fixture
def own_tmp(tmp_path):
    """The scenarios delete the log's directory: never the real $TMPDIR/tpu_nb-<uid>, which
    other kernels on this machine use."""
    folder = tmp_path / "tmp"
    folder.mkdir()
    return str(folder)


def _results(py, code: str, tmp: str, env: dict | None = None, prelude: str = "") -> dict:
    out = py("import os\n" + prelude + PRELUDE + code, env={"TMPDIR": tmp, **(env or {})}).stdout
    return json.loads(out.split("RESULT", 1)[1].splitlines()[0])


# Without /proc/<pid>/fd torch_xla gets the log's name (simulated here by not pinning it).
BY_NAME = """
from tpu_nb.runtime.environment import _private_files as private_files
private_files._pin = lambda fd, path: (os.close(fd), path)[1]
"""


@pytest.mark.parametrize("given", ["held", "by name"])
def test_deleted_truncated_replaced_log_reports_only_each_cells_own_events(py, own_tmp, given):
    """Held open (torch_xla given /proc/<pid>/fd/<n>), the name's fate changes nothing; given
    by name, the log is re-created and a run that lost its causes says so."""
    got = _results(
        py,
        """
path = compile_log().path                         # what torch_xla opens
name = tpu_nb.detect().debug_file                 # the file's name in the temp directory
assert name.startswith(os.environ["TMPDIR"] + os.sep), name    # never the shared directory
out = {"held": path != name, "first": cell(1)}
os.unlink(name)                                   # a user clearing /tmp between cells
out["after delete"] = cell(1)
out["mode after delete"] = oct(stat.S_IMODE(os.stat(path).st_mode))
open(path, "w").close()                           # truncated between cells
out["after truncate"] = cell(1)
if os.path.exists(name):
    shutil.copy(name, name + ".new"); os.replace(name + ".new", name)  # replaced, same content
out["after replace"] = cell(1)
shutil.rmtree(os.path.dirname(name))              # a tmp cleaner took the whole directory
out["after rmtree"] = cell(1)
out["dir after rmtree"] = os.path.isdir(os.path.dirname(name)) and oct(
    stat.S_IMODE(os.stat(os.path.dirname(name)).st_mode))
out["deleted midway"] = cell(2, midway=lambda: os.path.exists(name) and os.unlink(name))
out["next"] = cell(1)
print("RESULT", json.dumps(out))
""",
        own_tmp,
        prelude=BY_NAME if given == "by name" else "",
    )
    assert got["held"] == (given == "held")
    for name in (
        "first",
        "after delete",
        "after truncate",
        "after replace",
        "after rmtree",
        "next",
    ):
        assert got[name]["compiles"] == 1 and got[name]["events"] == 1, (name, got[name])
        assert got[name]["problem"] is None, (name, got[name])
    assert got["mode after delete"] == "0o600"
    midway = got["deleted midway"]
    assert midway["compiles"] == 2
    if given == "held":  # nothing to re-create, nothing lost
        assert got["dir after rmtree"] is False
        assert midway["events"] == 2 and midway["problem"] is None
    else:
        assert got["dir after rmtree"] == "0o700"
        assert midway["events"] <= 2
        assert "deleted, replaced or truncated during this run" in midway["problem"]


def test_unwritable_log_says_so_instead_of_zero_events(py, own_tmp):
    """/dev/full fails every write with ENOSPC, as a full disk does."""
    got = _results(
        py,
        """
print("RESULT", json.dumps(cell(2)))
""",
        own_tmp,
        env={"PT_XLA_DEBUG_FILE": "/dev/full"},
    )
    assert got["compiles"] == 2 and got["events"] == 0
    assert got["problem"].startswith(
        "torch_xla compiled 2 graphs but the compile log /dev/full holds the causes of 0: "
    )


def test_reset_metrics_forgets_events_and_reading_goes_on(py, own_tmp):
    got = _results(
        py,
        """
from tpu_nb.runtime.metrics import reset_metrics
cell(2)
before = len(compile_log().events_since(0))
reset_metrics()
after = len(compile_log().events_since(0))
print("RESULT", json.dumps({"before": before, "after": after, "next": cell(1)}))
""",
        own_tmp,
    )
    assert got["before"] >= 2 and got["after"] == 0
    assert got["next"]["events"] == 1 and got["next"]["problem"] is None


@pytest.fixture(scope="module")
def real_blocks(tmp_path_factory):
    """One compile's blocks exactly as torch_xla 2.9 wrote them (from this test process's
    log, which conftest's setup() switched on)."""
    import torch
    import torch_xla

    from tpu_nb.runtime.metrics import compile_log

    log = compile_log()
    start = log.size()
    (torch.ones(41, device=torch_xla.device()) * 5).sum().item()
    with open(log.path, "rb") as f:
        f.seek(start)
        data = f.read()
    assert b"Compilation Analysis: " in data and b"Post Compilation Analysis: " in data
    return data


def test_events_kept_in_memory_are_bounded(tmp_path, real_blocks):
    path = tmp_path / "long-session.log"
    path.write_bytes(real_blocks * (MAX_EVENTS + 100))
    log = CompileLog(str(path))
    events = log.events_since(0)
    assert len(events) == MAX_EVENTS and log.parsed == MAX_EVENTS + 100 and log.dropped == 100
    assert log.events_from(MAX_EVENTS + 99) == events[-1:]
    assert "only the causes of the last" in log.problem_since(0, MAX_EVENTS + 100)
    assert log.problem_since(events[0].offset, MAX_EVENTS) is None


def test_block_cut_short_by_a_failed_write_is_skipped(tmp_path, real_blocks):
    cut = real_blocks[: real_blocks.index(b"Number of Graph Inputs")]
    path = tmp_path / "cut.log"
    path.write_bytes(cut + real_blocks)
    log = CompileLog(str(path))
    (event,) = log.events_since(0)
    assert log.cut_blocks == 1 and event.inputs is not None and event.offset == len(cut) + 1
    assert event.sizes_gb  # its post-compilation block too


def test_log_rewritten_in_place_with_the_same_head_is_seen_as_replaced(tmp_path, real_blocks):
    """Same inode, same first kilobyte, a larger size: reading on at the old offset gave
    events of the new file's middle as this run's, with no note."""
    other = real_blocks.replace(b"Graph Hash: ", b"Graph Hash: f", 1)  # another graph
    path = tmp_path / "rewritten.log"
    path.write_bytes(real_blocks + other)
    log = CompileLog(str(path))
    assert len(log.events_since(0)) == 2
    offset = log.size()
    inode = path.stat().st_ino
    with open(path, "r+b") as f:  # rewritten in place: the first block kept, then others
        f.write(real_blocks + real_blocks + real_blocks + other)
    assert path.stat().st_ino == inode and path.read_bytes()[:1024] == real_blocks[:1024]
    assert "deleted, replaced or truncated during this run" in log.problem_since(offset, 2)
    # Appends alone are never taken for a replacement.
    log = CompileLog(str(path))
    log.events_since(0)
    with open(path, "ab") as f:
        f.write(other)
    offset = log.size() - len(other)
    assert len(log.events_since(offset)) == 1 and not log.breaks
