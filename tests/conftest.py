"""Shared test set-up: every test runs on the real torch_xla runtime, on XLA:CPU.

This process calls `tpu_nb.setup("cpu")` before anything compiles, so compile-cause analysis
is on for in-process tests. Tests that need other latched settings (debug level, IR debug,
device count) run a subprocess with `run_python` — torch_xla reads those once per process.
"""

from __future__ import annotations

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


def run_python(
    code: str, *, env: dict | None = None, timeout: float = 240, check: bool = True
) -> subprocess.CompletedProcess:
    """Run `code` in a fresh Python process (tpu_nb importable, PJRT_DEVICE=CPU unless `env`
    says otherwise; XLA debug variables of this process are not inherited)."""
    full_env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PT_XLA_DEBUG", "XLA_", "CPU_NUM_DEVICES"))
    }
    full_env["PJRT_DEVICE"] = "CPU"
    full_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.environ.get("PYTHONPATH", ""), str(ROOT)) if p
    )
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
