"""Shared test set-up: every test runs on the real torch_xla runtime, on XLA:CPU.

This process calls `tpu_nb.setup("cpu")` before anything compiles, so compile-cause analysis
is on for in-process tests. Tests that need other latched settings (debug level, IR debug,
device count) run a subprocess with `run_python` — torch_xla reads those once per process.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

os.environ["PJRT_DEVICE"] = "CPU"
ROOT = Path(__file__).resolve().parents[1]

from _env import without_xla_settings  # noqa: E402  (before torch_xla's import: its flags)

import tpu_nb  # noqa: E402

tpu_nb.setup("cpu")


def wait_until(condition, *, timeout: float = 60.0, what: str = "the condition"):
    """Poll `condition()` until it is true and return its value; fail after `timeout` seconds.

    Tests wait for the event they check, never for a fixed time: a sleep long enough on an idle
    machine is too short on a loaded one, and a long one slows every run."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:g} s for {what}")
        time.sleep(0.02)


def execute_when_ready(kc, code: str, *, timeout: float = 120.0) -> dict:
    """Run `code` in a kernel (jupyter_client) and return the reply's content, resending it
    while the kernel answers "aborted": ipykernel aborts the requests that arrive while it
    handles an interrupt or an error, as a frontend cancels the queued cells."""
    deadline = time.monotonic() + timeout
    while True:
        reply = kc.execute_interactive(code, timeout=timeout)["content"]
        if reply["status"] != "aborted" or time.monotonic() > deadline:
            return reply
        time.sleep(0.05)


class _Zygote:
    """The warm start of run_python's processes (tests/_zygote.py): started at the first
    call, in this process's environment; None when it cannot start (then every call is a
    plain subprocess)."""

    proc: subprocess.Popen | None = None
    env: dict = {}  # the zygote's environment
    failed = False

    @classmethod
    def get(cls, env: dict) -> subprocess.Popen | None:
        if cls.failed or os.environ.get("TPU_NB_TEST_ZYGOTE") == "0":
            return None
        if cls.proc is None or cls.proc.poll() is not None:
            cls.env, cls.unread = env, b""
            cls.proc = subprocess.Popen(
                [sys.executable, str(ROOT / "tests" / "_zygote.py")],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                bufsize=1,
                env=env,
                cwd=str(ROOT),
            )
            if not cls._reply(cls.proc, 300).get("ready"):
                cls.stop()
                cls.failed = True
                return None
        return cls.proc

    unread = b""  # what the zygote wrote past the last whole line read

    @classmethod
    def _reply(cls, proc: subprocess.Popen, timeout: float) -> dict:
        """The zygote's next line, within `timeout` ({} if none): read from the pipe with a
        buffer of this class's own, so that a line already read in stays found (the fork's
        pid and the script's exit may come in one read)."""
        import json
        import select

        assert proc.stdout is not None
        fd, deadline = proc.stdout.fileno(), time.monotonic() + timeout
        while b"\n" not in cls.unread:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return {}
            chunk = os.read(fd, 1 << 16)
            if not chunk:  # the zygote is gone
                return {}
            cls.unread += chunk
        line, cls.unread = cls.unread.split(b"\n", 1)
        return json.loads(line)

    @classmethod
    def run(cls, script: str, env: dict, base: dict, timeout: float) -> subprocess.CompletedProcess:
        """`python script` forked from the zygote (started in `base`, the environment every
        script gets before its own changes); raises subprocess.TimeoutExpired as
        subprocess.run does."""
        import json
        import signal

        proc = cls.get(base)
        if proc is None:
            raise LookupError("no zygote")
        if any(  # a variable read as those modules were imported, other than the zygote's
            name.startswith(_IMPORT_TIME) and env.get(name) != cls.env.get(name)
            for name in {*env, *cls.env}
        ):
            raise LookupError("a variable the zygote's imports read differs")
        assert proc.stdin is not None
        with tempfile.TemporaryDirectory(prefix="tpu_nb_test_out_") as out:
            request = dict(
                script=script,
                env=env,
                cwd=str(ROOT),
                out=os.path.join(out, "stdout"),
                err=os.path.join(out, "stderr"),
            )
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
            pid = cls._reply(proc, 60).get("pid")
            if pid is None:
                cls.stop()
                raise LookupError("the zygote did not fork")
            try:
                reply = cls._reply(proc, timeout)
            except BaseException:  # pytest-timeout, ^C: the script goes, as with subprocess
                os.kill(pid, signal.SIGKILL)
                cls.stop()
                raise
            if "code" not in reply:
                os.kill(pid, signal.SIGKILL)
                cls._reply(proc, 60)
                raise subprocess.TimeoutExpired([sys.executable, script], timeout)

            def read(name: str) -> str:
                with open(os.path.join(out, name), encoding="utf-8", errors="replace") as f:
                    return f.read()

            return subprocess.CompletedProcess(
                [sys.executable, script], reply["code"], read("stdout"), read("stderr")
            )

    @classmethod
    def stop(cls) -> None:
        if cls.proc is not None:
            try:
                cls.proc.stdin.close()  # type: ignore[union-attr]
                cls.proc.wait(timeout=30)
            except Exception:
                cls.proc.kill()
            cls.proc = None


def pytest_sessionfinish(session, exitstatus):
    _Zygote.stop()


# What a fresh interpreter reads as it imports torch and the modules the zygote holds
# already imported: a script given another of these runs as a plain subprocess.
_IMPORT_TIME = ("PYTHON", "TORCH", "OMP_", "MKL_", "KMP_", "CUDA", "LD_")


def run_python(
    code: str,
    *,
    env: dict | None = None,
    timeout: float = 240,
    check: bool = True,
    cold: bool = False,
) -> subprocess.CompletedProcess:
    """Run `code` in a fresh Python process (tpu_nb importable, PJRT_DEVICE=CPU unless `env`
    says otherwise; XLA debug variables of this process are not inherited).

    The process is forked from a zygote that has imported torch and what torch_xla imports
    of other libraries, but not torch_xla nor tpu_nb (tests/_zygote.py): ~0.5 s instead of
    ~10. A variable read while those import (`_IMPORT_TIME`) changed by `env` runs a plain
    `python script` instead; so does `cold=True` (a test of what gets imported) and every call
    with TPU_NB_TEST_ZYGOTE=0."""
    full_env = without_xla_settings(os.environ, ("PT_XLA_DEBUG", "XLA_", "CPU_NUM_DEVICES"))
    full_env["PJRT_DEVICE"] = "CPU"
    full_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.environ.get("PYTHONPATH", ""), str(ROOT)) if p
    )
    base = dict(full_env)
    for name, value in (env or {}).items():  # a value of None removes the variable
        if value is None:
            full_env.pop(name, None)
        else:
            full_env[name] = value
    with tempfile.NamedTemporaryFile(
        "w", suffix=".py", prefix="tpu_nb_test_", delete=False
    ) as script:  # a file: tracebacks quote it
        script.write(textwrap.dedent(code))
    try:
        proc = None
        if not cold:
            with contextlib.suppress(LookupError):
                proc = _Zygote.run(script.name, full_env, base, timeout)
        if proc is None:
            proc = subprocess.run(
                [sys.executable, script.name],
                capture_output=True,
                text=True,
                env=full_env,
                timeout=timeout,
                cwd=str(ROOT),
            )
    finally:
        os.unlink(script.name)
    if check and proc.returncode != 0:
        raise AssertionError(
            f"subprocess failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr[-4000:]}"
        )
    return proc


@pytest.fixture
def py():
    return run_python


def line_of(marker: str, fn) -> int:
    """The line number, in its file, of the line of `fn`'s source that contains `marker`."""
    source, start = inspect.getsourcelines(fn)
    for i, line in enumerate(source):
        if marker in line:
            return start + i
    raise AssertionError(f"{marker!r} not in {fn.__name__}")


@pytest.fixture(scope="module")
def shell():
    """A real IPython shell with the extension loaded (one per process: start_ipython() makes
    it once and answers None afterwards)."""
    from IPython import get_ipython
    from IPython.testing.globalipapp import start_ipython

    ip = start_ipython() or get_ipython()
    ip.run_line_magic("load_ext", "tpu_nb")
    ip.run_cell("import torch, torch_xla, tpu_nb")
    yield ip
    ip.run_line_magic("unload_ext", "tpu_nb")


def sgd_step(model, width: int):
    """A training step for `model` (already on the device): SGD on a fixed random batch of 8
    rows of `width`, a square-mean loss, one sync."""
    import torch
    import torch_xla

    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, width, device=tpu_nb.device())

    def step():
        opt.zero_grad()
        model(x).square().mean().backward()
        opt.step()
        torch_xla.sync()

    return step
