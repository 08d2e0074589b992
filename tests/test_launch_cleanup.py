"""launch() leaves nothing behind and explains what it refuses (issue 13, items 2, 5, 10).

Each scenario runs in a fresh process with its own TMPDIR, so the run directories counted are
this test's alone (other kernels on the machine launch too).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tpu_nb.runtime.environment import MAX_CPU_DEVICES
from tpu_nb.runtime.errors import TpuNbError
from tpu_nb.runtime.launch import launch

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(240)

PRELUDE = """
import glob, json, os, sys, tempfile, time
import tpu_nb
from tpu_nb.runtime.launch import launch, ReplicaError, ReplicaCrash
tpu_nb.setup("cpu", num_devices=4)
def runs():
    return sorted(glob.glob(os.path.join(tempfile.gettempdir(), "tpu_nb-launch-*")))
"""


@pytest.fixture
def tmpdir_env(tmp_path):
    folder = tmp_path / "tmp"
    folder.mkdir()
    return str(folder), {"PJRT_DEVICE": None, "TMPDIR": str(folder)}


def _result(out: str):
    return json.loads(out.split("RESULT", 1)[1].splitlines()[0])


def test_run_directories_removed_after_success_failure_and_worker_launches(py, tmpdir_env):
    folder, env = tmpdir_env
    out = py(
        PRELUDE
        + textwrap.dedent("""
        secret = "s3cr3t-token"
        def ok(index):
            return len(secret) + index
        def fails(index):
            if index == 2:
                raise ValueError("replica two")
            return index
        seen = {}
        seen["fork"] = launch(ok, stream=lambda line: None).values
        try:
            launch(fails, stream=lambda line: None)
        except ReplicaError as exc:
            seen["failure"] = str(exc)
        seen["after fork"] = runs()
        import torch, torch_xla
        (torch.ones(2, device=torch_xla.device()) * 2).sum().item()   # worker path from now
        launch(ok, stream=lambda line: None)
        fds = len(os.listdir("/proc/self/fd"))
        for _ in range(3):
            result = launch(ok, stream=lambda line: None)
        seen["worker"] = [result.path, result.values]
        seen["fds gained"] = len(os.listdir("/proc/self/fd")) - fds
        seen["after worker"] = runs()
        print("RESULT", json.dumps(seen))
    """),
        env=env,
    ).stdout
    seen = _result(out)
    assert seen["fork"] == [12, 13, 14, 15]
    assert "replica 2 of 4 failed: ValueError: replica two" in seen["failure"]
    assert seen["worker"] == ["worker", [12, 13, 14, 15]]
    assert seen["after fork"] == [] and seen["after worker"] == []
    assert seen["fds gained"] == 0  # no descriptor kept per worker launch
    # Nor anything else (torch's temp files included): the private log directory, empty.
    assert os.listdir(folder) == [f"tpu_nb-{os.getuid()}"]
    assert os.listdir(os.path.join(folder, f"tpu_nb-{os.getuid()}")) == []


def _start(code: str, env: dict) -> subprocess.Popen:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("PT_XLA", "XLA_"))}
    full.pop("PJRT_DEVICE", None)
    full.update({k: v for k, v in env.items() if v is not None}, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, "-c", PRELUDE + textwrap.dedent(code)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=full,
        cwd=str(ROOT),
    )


def _wait_for(proc: subprocess.Popen, word: str) -> str:
    deadline = time.time() + 150
    while time.time() < deadline:
        line = proc.stdout.readline()
        if word in line:
            return line
        if not line and proc.poll() is not None:
            break
    raise AssertionError(f"{word!r} never printed")


SLEEPER = """
def replica(index):
    import os, time
    print("group", os.getpgrp(), flush=True)
    time.sleep(120)
launch(replica)
"""


@pytest.mark.parametrize("how", ["interrupt", "kill"])
def test_run_directory_removed_when_the_launch_is_cut_short(tmpdir_env, how):
    """An interrupt (what a kernel interrupt delivers) and a kernel killed outright: no run
    directory and no replica process are left."""
    folder, env = tmpdir_env
    proc = _start(SLEEPER, env)
    group = int(_wait_for(proc, "group").split("group")[1])
    assert [n for n in os.listdir(folder) if n.startswith("tpu_nb-launch-")]
    proc.send_signal(signal.SIGINT if how == "interrupt" else signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.time() + 15  # a killed kernel: the launcher notices
    while time.time() < deadline and (_alive(group) or _runs(folder)):
        time.sleep(0.2)
    assert not _alive(group)
    assert _runs(folder) == []


def _alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


def _runs(folder: str) -> list[str]:
    return [n for n in os.listdir(folder) if n.startswith("tpu_nb-launch-")]


def test_run_directories_of_dead_processes_are_swept(py, tmpdir_env):
    folder, env = tmpdir_env
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = Path(folder, f"tpu_nb-launch-{dead.pid}-abc123")
    stale.mkdir()
    (stale / "payload.pkl").write_bytes(b"old secret")
    alive = Path(folder, f"tpu_nb-launch-{os.getpid()}-def456")  # this process runs: kept
    alive.mkdir()
    # Older tpu_nb named them without a pid: swept once untouched for a day.
    old, recent = Path(folder, "tpu_nb-launch-k2j4h1x9"), Path(folder, "tpu_nb-launch-p0q9w8e7")
    for path in (old, recent):
        path.mkdir()
        (path / "payload.pkl").write_bytes(b"old secret")
    two_days_ago = time.time() - 2 * 24 * 3600
    for path in (old / "payload.pkl", old):
        os.utime(path, (two_days_ago, two_days_ago))
    py(PRELUDE + "launch(lambda index: index, stream=lambda line: None)\n", env=env)
    assert not stale.exists() and alive.exists()
    assert not old.exists() and recent.exists()


def test_native_crash_in_a_replica_is_reported_as_such(py, tmpdir_env):
    _, env = tmpdir_env
    out = py(
        PRELUDE
        + textwrap.dedent("""
        def replica(index):
            import ctypes, time
            if index == 1:
                ctypes.string_at(0)          # a read of address 0: SIGSEGV in native code
            time.sleep(30)
        try:
            launch(replica, stream=lambda line: None)
        except ReplicaCrash as exc:
            print("RESULT", json.dumps([str(exc), exc.signal, exc.where, exc.stack[:2000]]))
    """),
        env=env,
    ).stdout
    message, signal_name, where, stack = _result(out)
    assert signal_name == "Segmentation fault, SIGSEGV"
    assert "string_at" in where and "replica" in stack
    assert (
        message.startswith(
            "a replica process crashed in native code (Segmentation fault, "
            "SIGSEGV) while running string_at"
        )
        and "Fix:" in message
    )
    assert "\n" not in message and "BrokenProcessPool" not in message


@pytest.mark.parametrize("devices", [0, -3, 2.5, "4", True, MAX_CPU_DEVICES + 1, 10**11])
def test_device_count_out_of_bounds_is_one_line(devices):
    with pytest.raises(TpuNbError) as info:
        launch(lambda index: index, devices=devices)
    message = str(info.value)
    assert "Fix:" in message and "\n" not in message
    if isinstance(devices, int) and devices > MAX_CPU_DEVICES:
        assert f"more than the {MAX_CPU_DEVICES} virtual XLA:CPU devices" in message


@pytest.mark.stack
def test_replicas_option_out_of_bounds_is_a_usage_error(shell):
    result = shell.run_cell("%%on_tpu --replicas 100000000000\nprint(index)")
    assert result.error_in_exec is not None
    assert type(result.error_in_exec).__name__ == "UsageError"
    message = str(result.error_in_exec)
    assert f"more than the {MAX_CPU_DEVICES} virtual XLA:CPU devices" in message
    assert "Fix:" in message and "\n" not in message
