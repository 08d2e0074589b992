"""launch() leaves nothing behind and explains what it refuses.

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
from _env import without_xla_settings

from tpu_nb.runtime.environment import MAX_CPU_DEVICES
from tpu_nb.runtime.errors import TpuNbError
from tpu_nb.runtime.parallel import launch

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(240)

PRELUDE = """
import glob, json, os, sys, tempfile, time
import tpu_nb
from tpu_nb.runtime.parallel import launch, ReplicaError, ReplicaCrash
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
        result = launch(ok, stream=lambda line: None)  # a descriptor kept would show here
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
    full = without_xla_settings(os.environ)
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


@pytest.mark.stack
def test_native_crash_in_a_replicas_cell_keeps_the_stack_it_points_to(shell):
    result = shell.run_cell(
        "%%on_tpu --replicas 2\nimport ctypes, time\nif index == 1:\n    ctypes.string_at(0)\n"
        "time.sleep(30)"
    )
    error = result.error_in_exec
    assert "the stacks are in this error's .stack attribute" in str(error)
    assert "string_at" in error.stack  # the attribute the message sends the user to


@pytest.mark.parametrize("devices", [0, -3, 2.5, "4", True, MAX_CPU_DEVICES + 1, 10**11])
def test_device_count_out_of_bounds_is_one_line(devices):
    with pytest.raises(TpuNbError) as info:
        launch(lambda index: index, devices=devices)
    message = str(info.value)
    assert "Fix:" in message and "\n" not in message
    if isinstance(devices, int) and devices > MAX_CPU_DEVICES:
        assert f"more than the {MAX_CPU_DEVICES} virtual XLA:CPU devices" in message


@pytest.mark.parametrize("stream", [5, "print", [print]])
def test_a_stream_that_is_not_a_function_is_refused_before_any_replica_starts(stream):
    import tempfile

    before = set(_runs(tempfile.gettempdir()))
    with pytest.raises(TpuNbError) as info:
        launch(lambda index: index, devices=2, stream=stream)
    message = str(info.value)
    assert "\n" not in message and message.startswith("stream must be a function")
    assert "Fix: launch(..., stream=print) (the default), or stream=None" in message
    assert set(_runs(tempfile.gettempdir())) == before  # refused before any run or replica


@pytest.mark.stack
def test_replicas_option_out_of_bounds_is_a_usage_error(shell):
    result = shell.run_cell("%%on_tpu --replicas 100000000000\nprint(index)")
    assert result.error_in_exec is not None
    assert type(result.error_in_exec).__name__ == "UsageError"
    message = str(result.error_in_exec)
    assert f"more than the {MAX_CPU_DEVICES} virtual XLA:CPU devices" in message
    assert "Fix:" in message and "\n" not in message


def test_replica_killed_or_exiting_names_the_signal_and_the_replica(py, tmpdir_env):
    """A SIGKILL (what the out-of-memory killer sends) or os._exit left only a bare
    BrokenProcessPool: no signal, no replica, no fix."""
    _, env = tmpdir_env
    out = py(
        PRELUDE
        + textwrap.dedent("""
        import signal
        def killed(index):
            if index == 1:
                time.sleep(0.3)
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(30)
        def exits(index):
            if index == 0:
                os._exit(3)
            time.sleep(30)
        got = []
        for fn in (killed, exits):
            try:
                launch(fn, devices=2, stream=lambda line: None)
            except ReplicaCrash as exc:
                got.append([exc.signal, str(exc)])
        print("RESULT", json.dumps(got))
    """),
        env=env,
    ).stdout
    (killed, killed_message), (exited, exited_message) = _result(out)
    assert killed == "SIGKILL" and exited == "exit status 3"
    assert killed_message.startswith("replicas 0, 1 (process ")
    assert "were killed by SIGKILL (what the out-of-memory killer sends)" in killed_message
    assert "exited with status 3 before finishing (os._exit" in exited_message
    for message in (killed_message, exited_message):
        assert "Fix:" in message and "\n" not in message and "BrokenProcessPool" not in message


def test_processes_a_replica_started_are_stopped_when_the_launch_ends(py, tmpdir_env, tmp_path):
    _, env = tmpdir_env
    out = py(
        PRELUDE
        + textwrap.dedent(f"""
        import subprocess
        def starts_a_child(index):
            child = subprocess.Popen(["sleep", "300"])
            with open(os.path.join({str(tmp_path)!r}, f"child-{{index}}"), "w") as f:
                f.write(str(child.pid))
            return index
        values = launch(starts_a_child, devices=2, stream=lambda line: None).values
        pids = [int(open(os.path.join({str(tmp_path)!r}, f"child-{{i}}")).read())
                for i in range(2)]
        def running(pid):
            try:
                with open(f"/proc/{{pid}}/stat") as f:
                    return f.read().split()[2] != "Z"
            except OSError:
                return False
        print("RESULT", json.dumps([values, [running(pid) for pid in pids]]))
    """),
        env=env,
    ).stdout
    values, running = _result(out)
    assert values == [0, 1] and running == [False, False]


def test_timeout_option_of_the_replicas_cell(shell):
    result = shell.run_cell("%%on_tpu --replicas 2 --timeout 2\nimport time\ntime.sleep(300)")
    assert type(result.error_in_exec).__name__ == "UsageError"
    assert str(result.error_in_exec).startswith(
        "the replicas did not finish within --timeout 2 s and were stopped. Fix: a larger "
        "--timeout, or"
    )


def test_timeout_stops_replicas_that_hang(py, tmpdir_env):
    _, env = tmpdir_env
    out = py(
        PRELUDE
        + textwrap.dedent("""
        from tpu_nb.runtime.errors import TpuNbError
        def hangs(index):
            time.sleep(300)
        start = time.monotonic()
        try:
            launch(hangs, devices=2, timeout=3, stream=lambda line: None)
        except TpuNbError as exc:
            print("RESULT", json.dumps([str(exc), time.monotonic() - start, runs()]))
    """),
        env=env,
    ).stdout
    message, seconds, left = _result(out)
    assert message.startswith("the replicas did not finish within timeout=3 s and were stopped")
    assert "Fix:" in message and 3 <= seconds < 30 and left == []


def test_full_temp_directory_is_one_line_with_a_fix(py, tmp_path):
    """A real full disk: a 256 KB tmpfs as TMPDIR, filled after setup()."""
    folder = tmp_path / "full"
    folder.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(folder)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs to fill: {mounted.stderr.strip()}")
    try:
        out = py(
            PRELUDE
            + textwrap.dedent("""
            from IPython.testing.globalipapp import start_ipython
            from IPython.core.error import UsageError
            ip = start_ipython()
            ip.run_line_magic("load_ext", "tpu_nb")
            try:
                with open(os.path.join(tempfile.gettempdir(), "fill"), "wb") as f:
                    while True:
                        f.write(b"0" * 4096)
                        f.flush()
            except OSError:
                pass
            try:
                ip.run_cell_magic("on_tpu", "--replicas 2", "x = index")
            except UsageError as exc:
                print("RESULT", json.dumps(str(exc)))
        """),
            env={"PJRT_DEVICE": None, "TMPDIR": str(folder)},
            check=False,  # IPython's own history cannot be saved at exit on the full disk
        ).stdout
    finally:
        subprocess.run(["umount", str(folder)], check=False)
    message = _result(out)
    assert "is full (No space left on device)" in message
    assert "Fix:" in message and "\n" not in message
