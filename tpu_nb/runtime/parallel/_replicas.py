"""`launch()`: run a function on every XLA device from a notebook, where xmp.spawn fails.

In replicas mode, one replica per device runs under torch_xla's launcher (on TPU a process per
chip; on XLA:CPU one process with a thread per device). The launcher runs in its own process
group: forked from this process when it has not touched the XLA runtime yet (so
notebook-defined functions and variables just work), or a fresh worker process that receives
the function and its arguments by value (cloudpickle) when it has — never "Runtime is already
initialized". SPMD mode runs in this process (_spmd.py).

On XLA:CPU with several devices, collectives between replicas hang in torch_xla 2.9
(pytorch/xla #5005, #9089): in that case every collective raises CollectiveRefused at once.
"""

from __future__ import annotations

import atexit
import errno
import faulthandler
import glob
import io
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from contextlib import suppress
from typing import cast

from tpu_nb.runtime.backend import current as backend
from tpu_nb.runtime.environment import _private_files as private_files
from tpu_nb.runtime.environment._configure import MAX_CPU_DEVICES, ensure_setup
from tpu_nb.runtime.environment._detect import detect_accelerator, runtime_initialized
from tpu_nb.runtime.errors import (
    WEEK,
    EnvironmentProblem,
    RuntimeStateError,
    TpuNbUsageError,
    check_seconds,
    check_stream,
    check_whole_number,
)
from tpu_nb.runtime.parallel._results import (
    CollectiveRefused,
    LaunchResult,
    Lines,
    ReplicaCrash,
    ReplicaError,
    ReplicaResult,
    ReplicasTimedOut,
    SyncTimes,
    not_sent_back,
    record_of,
    user_traceback,
)
from tpu_nb.runtime.parallel._spmd import run_spmd
from tpu_nb.runtime.probe import Hooks, probe

# -- inside the launcher process --------------------------------------------------------------


class _ReplicaStreams(io.TextIOBase):
    """sys.stdout/sys.stderr that send each replica thread's writes to its own file."""

    def __init__(self, fallback):
        self.fallback = fallback
        self.local = threading.local()

    def write(self, text: str) -> int:
        target = getattr(self.local, "file", None) or self.fallback
        target.write(text)
        target.flush()
        return len(text)

    def flush(self) -> None:
        target = getattr(self.local, "file", None) or self.fallback
        target.flush()


def _refusal(name: str) -> Callable[[Callable], Callable[..., None]]:
    """What replaces xm.`name` (the original is not called)."""

    def collective(*args, **kwargs):
        raise CollectiveRefused(
            f"xm.{name} between XLA:CPU replicas would hang in torch_xla 2.9 "
            "(pytorch/xla #5005, #9089), so tpu_nb stops it. Fix: use SPMD (launch(..., "
            "mode='spmd') or %%on_tpu --spmd), one device, or run on a TPU."
        )

    return lambda original: collective


def _install_refusals(hooks: Hooks) -> None:
    """The probe's "collectives-refused" kind: in a replica, for the rest of its life."""
    for owner, name in backend().launch.collective_functions():
        hooks.patch(owner, name, _refusal(name))


probe().define("collectives-refused", _install_refusals)


# The function and arguments the launcher process runs. torch_xla's launcher pickles what it
# is given (its process pool does, even with fork), and a notebook's function need not be
# picklable: the replicas find it here instead, in memory forked from the launcher.
_work: dict[str, tuple[Callable, tuple]] = {}

# On XLA:CPU the replicas are threads of one process, and torch_xla 2.9 registers a counter at
# its first use without guarding every reader: about one launch in 26 crashed (SIGSEGV in
# Counter::GetData(), a null counter) when four replica threads read counters and ran their
# first ops at the same moment. So the first replica in runs that first use alone — counter
# reads and one tiny graph, which registers the counters every replica touches first — while
# the others wait; and tpu_nb's own counter reads are taken one thread at a time.
# Likewise the CPU fallback's counter of each op (aten_fallback.cpp, `_fallback_counters`: an
# unguarded map, inserted into at an op's first fallback in the process): four replicas' first
# `.item()` (the aten::_local_scalar_dense fallback) inserting at once crashed about one launch
# in 300 (SIGSEGV in that map's operator[] under xla_fallback). The warm-up's `.item()` makes
# that insertion; other ops' first fallbacks can still race there, inside torch_xla.
_first_use = threading.Lock()
_first_use_done = False
_counter_reads = threading.Lock()


def _first_use_alone() -> None:
    """Counter reads, a transfer, a compile, an execution and read backs (`.cpu()` and
    `.item()`, a CPU fallback) where replica threads share the runtime: the first use of the
    counters a replica's first ops touch, made from one thread while the others wait."""
    global _first_use_done
    with _first_use:
        runtime = backend()
        if not _first_use_done and len(runtime.devices.names()) > 1:
            import torch

            _snapshot()
            warm = torch.ones(1, device=runtime.devices.device()) + 1
            runtime.syncs.sync()
            runtime.syncs.wait()
            warm.cpu()
            warm.item()
            _snapshot()
        _first_use_done = True


def _snapshot():
    from tpu_nb.runtime.metrics import snapshot

    with _counter_reads:
        return snapshot()


# The first snapshot of each process's replicas. Replica threads of one process share its
# counters, so each replica's are its process's from there: the last replica to end holds
# the work of all (LaunchResult.merged), not only what ran before the first one ended.
_process_before: dict[int, object] = {}


def _process_start():
    with _first_use:
        if os.getpid() not in _process_before:
            _process_before[os.getpid()] = _snapshot()
        return _process_before[os.getpid()]


def _replica(index: int, rundir: str) -> None:
    """One replica: its prints to its own file; its result (value or error, timings,
    counters) to a pickle."""
    runtime = backend()
    _first_use_alone()
    ordinal = runtime.launch.ordinal()
    # The ordinals each process ran, for a process that ends abruptly (abrupt_ends).
    with open(os.path.join(rundir, f"proc-{os.getpid()}"), "a") as f:
        f.write(f"{ordinal}\n")
    with open(os.path.join(rundir, f"out-{ordinal}.txt"), "w", buffering=1) as out:
        for stream in (sys.stdout, sys.stderr):  # as _launcher installed them
            cast(_ReplicaStreams, stream).local.file = out
        syncs = SyncTimes(runtime)
        before, start = _process_start(), time.perf_counter()
        result: dict[str, object] = {"ordinal": ordinal, "pid": os.getpid()}
        fn, args = _work[rundir]
        try:
            value = fn(index, *args)
            syncs.counting = False  # tpu_nb's own sync below is no step of the replica
            runtime.syncs.sync()
            runtime.syncs.wait()
            result["value"] = value
        except BaseException as exc:  # the replica's own error: reported, then the group ends
            result["error"] = f"{type(exc).__name__}: {exc}"
            result["traceback"] = user_traceback(exc, __file__)
        result["wall_seconds"] = time.perf_counter() - start
        result["metrics"] = _snapshot().since(before)
        result["step_seconds"] = syncs.steps(start)
        _write_result(rundir, ordinal, result)
    if "error" in result:
        os.killpg(os.getpgrp(), signal.SIGTERM)  # stop the other replicas and the launcher


def _write_result(rundir: str, ordinal: int, result: dict) -> None:
    path = os.path.join(rundir, f"result-{ordinal}.pkl")
    try:
        data = pickle.dumps(result)
    except Exception as exc:  # the value cannot travel back: None, and the launch says why
        result["value"] = None
        result["value_error"] = f"{type(exc).__name__}: {exc}"
        data = pickle.dumps(result)
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)


def _end_group(signum, frame) -> None:
    """SIGTERM in the launcher: its replica processes got it too; reap them, then exit, so
    none is left behind (not even as a zombie where PID 1 does not reap)."""
    import multiprocessing

    for child in multiprocessing.active_children():
        child.kill()
        child.join(timeout=5)
    os._exit(1)


def _watch_parent(rundir: str, parent: int) -> None:
    """End the launch when the process that launched it is gone (a kernel killed or exited
    mid-launch): remove the run directory, stop the replicas."""

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        shutil.rmtree(rundir, ignore_errors=True)
        os.killpg(os.getpgrp(), signal.SIGTERM)

    threading.Thread(target=watch, name="tpu_nb-launch-watch", daemon=True).start()


def _record_processes() -> list:
    """The replica processes torch_xla's process pool starts in this (launcher) process, as
    they start: their exit codes say how they ended."""
    import multiprocessing.process

    started: list = []
    original = multiprocessing.process.BaseProcess.start

    def start(self):
        original(self)
        started.append(self)

    multiprocessing.process.BaseProcess.start = start  # type: ignore[method-assign]
    return started


def _write_ends(rundir: str, processes: list) -> None:
    """`ended-<pid>` ('exit N' or 'signal N') for each replica process that ended abnormally:
    a SIGKILL (the out-of-memory killer) or an os._exit leaves no other trace than the
    pool's bare BrokenProcessPool."""
    for proc in processes:
        code = proc.exitcode
        if code:
            how = f"signal {-code}" if code < 0 else f"exit {code}"
            with suppress(OSError), open(os.path.join(rundir, f"ended-{proc.pid}"), "w") as f:
                f.write(how)


def _launcher(rundir: str, fn: Callable, args: tuple, env: dict, refuse: bool, parent: int) -> None:
    """The launcher process: torch_xla's launcher, replicas' output routed per replica."""
    # A native crash of a replica process (forked from this one, so it inherits this) leaves
    # every thread's Python stack in launcher.err instead of a bare BrokenProcessPool.
    faulthandler.enable(file=2, all_threads=True)  # fd 2 is launcher.err here
    signal.signal(signal.SIGTERM, _end_group)
    _watch_parent(rundir, parent)
    os.environ.update(env)
    # Temp files of the launcher and the replicas (torch's own among them: importing
    # torch.distributed makes a directory it removes only at a normal exit, which the
    # launcher's os._exit skips) go into the run directory and are removed with it.
    os.environ["TMPDIR"] = tempfile.tempdir = rundir
    sys.stdout = _ReplicaStreams(sys.__stdout__)
    sys.stderr = _ReplicaStreams(sys.__stderr__)
    runtime = backend()
    runtime.process.load()
    if refuse:
        probe().subscribe(_refusal, ("collectives-refused",), of_run=False)
    _work[rundir] = (fn, args)
    processes = _record_processes()
    try:
        runtime.launch.spawn(_replica, (rundir,))
    except BaseException:
        _write_ends(rundir, processes)
        raise
    finally:
        _work.pop(rundir, None)


def worker_main(rundir: str) -> None:
    import cloudpickle

    payload = os.path.join(rundir, "payload.pkl")
    with open(payload, "rb") as f:
        fn, args, env, refuse, parent = cloudpickle.load(f)
    os.unlink(payload)  # the user's function and variables, by value: not kept on disk
    _launcher(rundir, fn, args, env, refuse, parent)


# -- in the calling process -------------------------------------------------------------------


def _device_count(devices, device_type: str) -> int:
    """How many replicas: 'all' the devices, or N — at most the chips of a TPU host, at most
    MAX_CPU_DEVICES virtual XLA:CPU devices (each replica is a thread with its own device)."""
    chips = max(1, detect_accelerator().chips) if device_type == "TPU" else None
    if devices == "all":
        if chips is not None:
            return chips
        configured = os.environ.get("CPU_NUM_DEVICES") or "1"
        if not configured.isdigit() or not 1 <= int(configured) <= MAX_CPU_DEVICES:
            raise EnvironmentProblem(
                f"CPU_NUM_DEVICES={configured!r} is not a device count from 1 "
                f"to {MAX_CPU_DEVICES}. Fix: tpu_nb.setup('cpu', num_devices=4) "
                "(or %tpu_setup --devices 4) in a fresh kernel."
            )
        return int(configured)
    check_whole_number(devices, "devices", alternative="'all'", fix="e.g. devices=4")
    if chips is not None and devices != chips:
        raise TpuNbUsageError(
            f"devices={devices}, but this TPU host has {chips} chip"
            f"{'s' if chips != 1 else ''} and a launch uses all of them. Fix: "
            "devices='all'."
        )
    if devices > MAX_CPU_DEVICES:
        raise TpuNbUsageError(
            f"devices={devices} is more than the {MAX_CPU_DEVICES} virtual XLA:CPU "
            f"devices tpu_nb runs (each is a thread with its own device). Fix: "
            f"e.g. devices=4."
        )
    return devices


RUN_PREFIX = "tpu_nb-launch-"


# Run directories of older tpu_nb versions carry no pid: swept once untouched for this long.
STALE_UNNAMED_SECONDS = 24 * 3600


# Run directories of launches in progress -> the process that made them: removed at its exit
# if that cuts a launch short (not at the exit of a child forked meanwhile).
_active_runs: dict[str, int] = {}


@atexit.register
def _remove_active_runs() -> None:
    for rundir, owner in list(_active_runs.items()):
        if owner == os.getpid():
            shutil.rmtree(rundir, ignore_errors=True)


class _Run:
    """A launcher process and its run directory, watched from the calling process."""

    def __init__(self, fn, args, n: int, device_type: str, stream):
        # 0700 (mkdtemp); named after this process so that a later launch can sweep it if
        # this process dies without removing it.
        self.rundir = tempfile.mkdtemp(prefix=f"{RUN_PREFIX}{os.getpid()}-")
        _active_runs[self.rundir] = os.getpid()
        self.n = n
        self.lines = [Lines(stream, f"[{i}] ") for i in range(n)]
        env = {"PJRT_DEVICE": device_type}
        level = backend().process.settings().get("PT_XLA_DEBUG_LEVEL")
        if level:  # the replicas' compile log, not ours
            env["PT_XLA_DEBUG_LEVEL"] = level
            env["PT_XLA_DEBUG_FILE"] = os.path.join(self.rundir, "compile-analysis.log")
        if device_type == "CPU":
            env["CPU_NUM_DEVICES"] = str(n)
        refuse = device_type == "CPU" and n > 1
        self.offsets = [0] * n
        self.path = "worker" if runtime_initialized() else "fork"
        start = _spawn_worker if self.path == "worker" else _fork
        try:
            self.proc: _ForkedProcess | subprocess.Popen = start(self.rundir, fn, args, env, refuse)
        except BaseException:
            self.remove()
            raise

    def remove(self) -> None:
        """Remove the run directory: the payload (the user's function and variables, by
        value), outputs and results are not left in the temp directory."""
        shutil.rmtree(self.rundir, ignore_errors=True)
        _active_runs.pop(self.rundir, None)

    def pump(self) -> None:
        """Print what the replicas wrote since the last call, each line with its ordinal."""
        for i in range(self.n):
            path = os.path.join(self.rundir, f"out-{i}.txt")
            try:
                with open(path, encoding="utf-8", errors="replace") as f:
                    f.seek(self.offsets[i])
                    text = f.read()
                    self.offsets[i] = f.tell()
            except FileNotFoundError:
                continue
            self.lines[i].add(text)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (status := self.proc.poll()) is None:
            self.pump()
            if deadline is not None and time.monotonic() > deadline:
                raise ReplicasTimedOut(cast(float, timeout))
            time.sleep(0.02)
        self.pump()
        for lines in self.lines:
            lines.end()
        return status

    def kill(self) -> None:
        if self._stop(3.0, lambda: self.proc.poll() is None):
            self.proc.wait()  # killed: reaped at once

    def end_group(self) -> None:
        """After the launcher ended: stop whatever the replicas started and left running
        (their process group is the launcher's): SIGTERM, then SIGKILL after a second."""
        self._stop(1.0, self._group_alive)

    def _group_alive(self) -> bool:
        try:
            os.killpg(self.proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def _stop(self, grace: float, running: Callable[[], bool]) -> bool:
        """SIGTERM to the launcher's process group; SIGKILL if still `running()` after `grace`
        seconds. Whether SIGKILL was sent."""
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGTERM)
            deadline = time.time() + grace
            while running() and time.time() < deadline:
                time.sleep(0.02)
            if running():
                os.killpg(self.proc.pid, signal.SIGKILL)
                return True
        return False

    def results(self) -> list[dict]:
        out = []
        for i in range(self.n):
            try:
                with open(os.path.join(self.rundir, f"result-{i}.pkl"), "rb") as f:
                    out.append(pickle.load(f))
            except (FileNotFoundError, EOFError, pickle.UnpicklingError):
                out.append(None)
        return out

    def abrupt_ends(self) -> list[tuple[int, str, list[int]]]:
        """Replica processes that ended other than by exiting 0: (pid, 'exit N' or 'signal
        N', the ordinals it ran)."""
        out: list[tuple[int, str, list[int]]] = []
        for name in sorted(glob.glob("ended-*", root_dir=self.rundir)):
            pid = int(name[6:])
            with open(os.path.join(self.rundir, name)) as f:
                how = f.read().strip()
            try:
                with open(os.path.join(self.rundir, f"proc-{pid}")) as f:
                    ordinals = sorted(int(line) for line in f.read().split())
            except (OSError, ValueError):
                ordinals = []
            out.append((pid, how, ordinals))
        # The process that ended first by itself, before those the pool then stopped (SIGTERM).
        return sorted(out, key=lambda end: end[1] == f"signal {int(signal.SIGTERM)}")

    def launcher_errors(self) -> str:
        try:
            with open(os.path.join(self.rundir, "launcher.err"), errors="replace") as f:
                return f.read()[-30000:]
        except FileNotFoundError:
            return ""


class _ForkedProcess:
    """A forked launcher with the small Popen interface _Run uses."""

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        while (status := self.poll()) is None:
            time.sleep(0.02)
        return status


def _fork(rundir, fn, args, env, refuse) -> _ForkedProcess:
    err = os.open(os.path.join(rundir, "launcher.err"), os.O_WRONLY | os.O_CREAT, 0o600)
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the launcher: C-level output to its own file
        os.dup2(err, 1)
        os.dup2(err, 2)
        os.setpgid(0, 0)
        try:
            _launcher(rundir, fn, args, env, refuse, os.getppid())
        except BaseException:
            traceback.print_exc(file=sys.__stderr__)
            os._exit(1)
        os._exit(0)
    os.close(err)
    with suppress(PermissionError, ProcessLookupError):
        os.setpgid(pid, pid)  # both sides set it: no race with killpg
    return _ForkedProcess(pid)


def _spawn_worker(rundir, fn, args, env, refuse) -> subprocess.Popen:
    import cloudpickle

    try:
        payload = cloudpickle.dumps((fn, args, env, refuse, os.getpid()))
    except Exception as exc:
        raise RuntimeStateError(
            f"cannot send the function to a fresh worker process ({exc}). Fix: "
            "restart the kernel and launch before using the XLA device, so the "
            "replicas can be forked instead."
        ) from None
    fd = os.open(os.path.join(rundir, "payload.pkl"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with open(fd, "wb") as f:
        f.write(payload)
    package_parent = os.path.abspath(os.path.join(__file__, "../../../.."))  # holds tpu_nb/
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("PT_XLA_DEBUG")}
    child_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (package_parent, os.getcwd(), os.environ.get("PYTHONPATH")) if p
    )
    with open(os.path.join(rundir, "launcher.err"), "w") as err:  # the child keeps its copy
        return subprocess.Popen(
            [sys.executable, "-m", "tpu_nb.runtime.parallel", rundir],
            stdout=err,
            stderr=err,
            env=child_env,
            start_new_session=True,
        )


def _collect(run: _Run, status: int, start: float) -> LaunchResult:
    __tracebackhide__ = True  # noqa: F841  (IPython: the error is the replica's, not ours)
    raw = run.results()
    failed = [r for r in raw if r is not None and r.get("error")]
    if failed:
        first = min(failed, key=lambda r: r["ordinal"])
        raise ReplicaError(first["ordinal"], run.n, first["error"], first["traceback"])
    if status != 0 or any(r is None for r in raw):
        errors = run.launcher_errors()
        crash = native_crash(errors) or _abrupt_end(run, errors)
        if crash is not None:
            raise crash
        if _no_room(os.path.dirname(run.rundir)):
            raise EnvironmentProblem(_full_disk(os.path.dirname(run.rundir)))
        detail = errors.strip().splitlines()
        raise RuntimeStateError(
            "the replicas did not finish (launcher exit status "
            f"{status}): {detail[-1] if detail else 'no message'}"
        )
    replicas = tuple(record_of(ReplicaResult, r) for r in raw)
    notes: tuple[str, ...] = ()
    if run.path == "worker":
        notes = (
            "This kernel had already used the XLA device, so the replicas ran in a fresh "
            "worker process that received the function and its variables by value.",
        )
    notes += tuple(
        not_sent_back(f"Replica {r['ordinal']}", r["value_error"])
        for r in raw
        if r.get("value_error")
    )
    return LaunchResult("replicas", run.path, run.n, replicas, time.perf_counter() - start, notes)


_FATAL = re.compile(r"^Fatal Python error: (.+)$", re.M)
_FRAME_LINE = re.compile(r'^\s+File "(.+)", line (\d+) in (.+)$')


def native_crash(errors: str) -> ReplicaCrash | None:
    """A ReplicaCrash from faulthandler's report in the launcher's output, if there is one."""
    found = list(_FATAL.finditer(errors))
    if not found:
        return None
    stack = errors[found[-1].start() :]
    reason = found[-1].group(1).strip()
    name = {
        "Segmentation fault": "SIGSEGV",
        "Bus error": "SIGBUS",
        "Aborted": "SIGABRT",
        "Floating-point exception": "SIGFPE",
        "Illegal instruction": "SIGILL",
    }.get(reason)
    signal_name = f"{reason}, {name}" if name else reason
    current = stack.find("Current thread")
    where = ""
    for line in stack[current if current >= 0 else 0 :].splitlines():
        if m := _FRAME_LINE.match(line):
            where = f"{m.group(3)} ({m.group(1)}:{m.group(2)})"
            break
    return ReplicaCrash(signal_name, where, stack)


def _ordinals(ordinals: list[int]) -> str:
    if not ordinals:
        return "a replica process"
    if len(ordinals) > 2 and ordinals == list(range(ordinals[0], ordinals[-1] + 1)):
        return f"replicas {ordinals[0]}-{ordinals[-1]}"
    return f"replica{'s' if len(ordinals) > 1 else ''} {', '.join(map(str, ordinals))}"


def _abrupt_end(run: _Run, errors: str) -> ReplicaCrash | None:
    """A ReplicaCrash naming the signal or exit status of a replica process that ended
    without a Python error (SIGKILL from the out-of-memory killer, os._exit), if one did."""
    ends = run.abrupt_ends()
    if not ends:
        return None
    pid, how, ordinals = ends[0]
    who = f"{_ordinals(ordinals)} (process {pid})"
    kind, number = how.split()
    others = "; the other replicas were stopped" if len(ordinals) < run.n else ""
    if kind == "signal":
        name = signal.Signals(int(number)).name if int(number) in signal.valid_signals() else how
        why = " (what the out-of-memory killer sends)" if name == "SIGKILL" else ""
        verb = "were" if len(ordinals) > 1 else "was"
        message = (
            f"{who} {verb} killed by {name}{why} before finishing{others}. Fix: if it "
            "ran out of memory, use smaller batches or fewer replicas (devices=N); "
            "otherwise find what sent the signal."
        )
        return ReplicaCrash(name, "", errors, message=message)
    message = (
        f"{who} exited with status {number} before finishing (os._exit, or exit() in native "
        f"code){others}. Fix: return from the function, or raise, instead of ending the "
        "process."
    )
    return ReplicaCrash(f"exit status {number}", "", errors, message=message)


def _no_room(folder: str) -> bool:
    try:
        fs = os.statvfs(folder)
    except OSError:
        return False
    return fs.f_bavail * fs.f_frsize < 64 * 1024


def _full_disk(folder: str) -> str:
    return (
        f"the launch cannot write its files: {folder} is full (No space left on device). "
        "Fix: free space there, or point TMPDIR at a disk with room before launching "
        "(os.environ['TMPDIR'] = '/path'; tempfile.tempdir = None)."
    )


def launch(
    fn: Callable,
    *args,
    devices: int | str = "all",
    mode: str = "replicas",
    stream: Callable[[str], None] | None = print,
    timeout: float | None = None,
) -> LaunchResult:
    """Run `fn` on every XLA device, from a notebook or a script.

    replicas: `fn(index, *args)` runs once per device; prints come back prefixed with the
        replica's ordinal, through `stream` (None: not shown); an exception in one replica
        stops the others (ReplicaError).
    spmd: `fn(spmd, *args)` runs once over all devices; `spmd.mesh` is a 1-D data mesh and
        `spmd.shard_batch(tensor)` shards a tensor's first dimension across the devices.
    timeout: seconds after which unfinished replicas are stopped (a TpuNbError says so);
        None waits for as long as they run (an interrupt stops them too).

    Processes the replicas started are stopped when the launch ends, whatever its outcome.
    """
    __tracebackhide__ = True  # noqa: F841
    if mode not in ("replicas", "spmd"):
        raise TpuNbUsageError(f"unknown mode {mode!r}. Fix: mode='replicas' or mode='spmd'.")
    if not callable(fn):
        raise TpuNbUsageError(
            f"launch needs a function to run; got {type(fn).__name__} "
            f"{fn!r:.40}. Fix: launch(train), with train(index) defined first."
        )
    if timeout is not None and mode == "spmd":
        raise TpuNbUsageError(
            "timeout= bounds a replicas launch; mode='spmd' runs fn in this process, which "
            "nothing stops. Fix: drop timeout=, or use mode='replicas'"
        )
    if timeout is not None:
        check_seconds(
            timeout,
            "timeout",
            low=0,
            above_low=True,
            high=WEEK,
            alternative="None",
            fix="e.g. timeout=600 (at most a week)",
        )
    stream = check_stream(stream, "launch")
    ensure_setup()
    device_type = os.environ.get("PJRT_DEVICE", "CPU").upper()
    if mode == "spmd":
        return run_spmd(fn, args, devices)
    n = _device_count(devices, device_type)
    # Run directories that launches of dead processes left (a kernel killed mid-launch
    # cannot remove its own).
    private_files.sweep_dead_runs(RUN_PREFIX, stale_unnamed=STALE_UNNAMED_SECONDS)
    start = time.perf_counter()
    try:
        run = _Run(fn, args, n, device_type, stream)
    except OSError as exc:
        folder = tempfile.gettempdir()
        if exc.errno == errno.ENOSPC or _no_room(folder):
            raise EnvironmentProblem(_full_disk(folder)) from None
        raise EnvironmentProblem(
            f"the launch cannot write its files in {folder} ({exc.strerror}). Fix: point "
            "TMPDIR at a directory of yours before launching."
        ) from None
    try:
        try:
            status = run.wait(timeout)
        except BaseException:  # KeyboardInterrupt, timeout=: no orphan replicas
            run.kill()
            raise
        run.end_group()  # what the replicas started and left running
        return _collect(run, status, start)
    finally:
        run.remove()
