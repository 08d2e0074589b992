"""tpu_nb.launch on XLA:CPU with 4 devices: fork and worker paths, failures, refusals, SPMD.

Each scenario runs in a fresh process (the device count is latched when the runtime starts);
every test has a timeout, since a collective on several XLA:CPU devices would hang.
"""

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
from conftest import wait_until

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(180)

PRELUDE = """
import json, os, sys, time
import tpu_nb
from tpu_nb.runtime.parallel import launch, ReplicaError, CollectiveRefused
tpu_nb.setup("cpu", num_devices=4)
"""


def _run(py, code, **kw):
    return py(PRELUDE + textwrap.dedent(code), env={"PJRT_DEVICE": None}, **kw)


def test_fork_path_runs_notebook_style_closures_with_prefixed_output(py):
    out = _run(
        py,
        """
        scale = 2.5
        def make(offset):
            def replica(index):                       # a closure over notebook variables
                import torch, torch_xla
                t = torch.ones(3, device=torch_xla.device()) * scale + offset + index
                torch_xla.sync()
                print(f"value {t.sum().item()}")
                return index * index
            return replica
        result = launch(make(1.0))
        print("RESULT", json.dumps([result.path, result.devices, result.values,
                                    [len(r.step_seconds) > 0 for r in result.replicas]]))
        import threading
        kept = launch(lambda index: threading.Lock(), devices=2)   # cannot be pickled
        print("UNSENT", json.dumps([kept.values, list(kept.notes)]))
        quiet = launch(lambda index: print("not shown") or index, devices=2, stream=None)
        print("QUIET", json.dumps(quiet.values))
    """,
    ).stdout
    path, devices, values, stepped = json.loads(out.split("RESULT")[1].split("UNSENT")[0])
    assert (path, devices, values) == ("fork", 4, [0, 1, 4, 9]) and all(stepped)
    for i in range(4):
        assert f"[{i}] value {3 * (2.5 + 1.0 + i)}" in out
    assert json.loads(out.split("QUIET")[1]) == [0, 1] and "not shown" not in out
    values, notes = json.loads(out.split("UNSENT")[1].split("QUIET")[0])
    assert values == [None, None]
    assert [n.split(" could not")[0] for n in notes] == [
        "Replica 0's return value",
        "Replica 1's return value",
    ]
    assert all("lock" in n and "Fix: return plain data" in n for n in notes), notes


def test_replica_steps_are_its_own_syncs_not_the_launchs(py):
    out = _run(
        py,
        """
        def replica(index):
            import torch, torch_xla
            t = torch.ones(3, device=torch_xla.device())
            for _ in range(3):
                t = t * 2
                torch_xla.sync()
        result = launch(replica, devices=2)
        print("STEPS", json.dumps([len(r.step_seconds) for r in result.replicas]))
    """,
    ).stdout
    assert json.loads(out.split("STEPS")[1]) == [3, 3]  # tpu_nb's final sync is no step


def test_merged_counters_hold_every_replicas_work_not_the_first_to_end(py):
    out = _run(
        py,
        """
        def replica(index):
            import torch, torch_xla
            time.sleep(0.5 * index)  # replica 0 ends first, replica 3 last
            t = torch.ones(3 + index, device=torch_xla.device()) * 2  # a shape of its own
            torch_xla.sync()
        merged = launch(replica).merged()
        print("MERGED", json.dumps([merged.compiles, merged.executions]))
    """,
    ).stdout
    compiles, executions = json.loads(out.split("MERGED")[1])
    assert compiles >= 4 and executions >= 4  # four graphs of four shapes, each run


def test_worker_path_after_the_kernel_used_the_device(py):
    out = _run(
        py,
        """
        import torch, torch_xla
        (torch.ones(2, device=torch_xla.device()) * 2).sum().item()   # the runtime is in use
        factor = 7
        def replica(index):
            import torch, torch_xla
            print("replica", index, "of", torch_xla.runtime.world_size())
            return (torch.ones(2, device=torch_xla.device()) * factor * index).sum().item()
        result = launch(replica)
        print("RESULT", json.dumps([result.path, result.values, result.notes]))
    """,
    ).stdout
    path, values, notes = json.loads(out.split("RESULT")[1])
    assert path == "worker" and values == [0.0, 14.0, 28.0, 42.0]
    assert "fresh worker process" in notes[0]
    assert "[3] replica 3 of 4" in out
    assert "Runtime is already initialized" not in out


def test_exception_in_replica_two_stops_the_others(py):
    out = _run(
        py,
        """
        import tempfile
        marks = tempfile.mkdtemp()
        def replica(index):
            import os, time
            if index == 2:
                raise ValueError("bad shard")   # REPLICA-LINE
            time.sleep(600)
            open(os.path.join(marks, str(index)), "w").close()  # only if it ran on
        try:
            launch(replica)
        except ReplicaError as err:
            print("RESULT", json.dumps([err.ordinal, str(err), err.traceback,
                                        os.listdir(marks)]))
    """,
    ).stdout
    ordinal, message, trace, ran_on = json.loads(out.split("RESULT")[1])
    assert ordinal == 2 and message.startswith("replica 2 of 4 failed: ValueError: bad shard")
    assert "REPLICA-LINE" in trace and "tpu_nb/runtime/parallel.py" not in trace
    # The launch raised while the others slept (none finished its sleep), not after them.
    assert ran_on == []


def test_collective_on_multi_device_cpu_is_refused_at_once(py):
    out = _run(
        py,
        """
        def replica(index):
            import torch, torch_xla, torch_xla.core.xla_model as xm
            return xm.all_reduce(xm.REDUCE_SUM, torch.ones(2, device=torch_xla.device()))
        try:
            launch(replica)
        except ReplicaError as err:
            print("RESULT", json.dumps(str(err)))
    """,
    ).stdout
    # Refused, not hung: a collective that ran would hang until the test's timeout.
    message = json.loads(out.split("RESULT")[1])
    assert "CollectiveRefused: xm.all_reduce between XLA:CPU replicas would hang" in message
    assert "SPMD" in message


def _spmd_losses(py, devices):
    code = """
        import numpy as np, torch, torch_xla
        def train(spmd):
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                        torch.nn.Linear(32, 4)).to(torch_xla.device())
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            g = torch.Generator().manual_seed(1)
            data, labels = torch.randn(64, 16, generator=g), torch.randint(0, 4, (64,), generator=g)
            losses = []
            for _ in range(4):
                x = spmd.shard_batch(data.to(torch_xla.device()))
                y = spmd.shard_batch(labels.to(torch_xla.device()))
                opt.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                opt.step()
                torch_xla.sync()
                losses.append(loss.item())
            return losses
        result = launch(train, mode="spmd")
        steps = result.replicas[0].step_seconds
        print("RESULT", json.dumps([result.devices, result.values[0], steps, result.summary()]))
    """
    prelude = PRELUDE.replace("num_devices=4", f"num_devices={devices}")
    out = py(prelude + textwrap.dedent(code), env={"PJRT_DEVICE": None}).stdout
    return json.loads(out.split("RESULT")[1])


def test_spmd_data_parallel_loss_matches_one_device(py):
    n4, losses4, steps4, summary4 = _spmd_losses(py, 4)
    n1, losses1, _, _ = _spmd_losses(py, 1)
    assert (n4, n1) == (4, 1)
    # one time per sync of the loop, as a replica's: the summary's median step is measured
    assert len(steps4) == 4 and all(s > 0 for s in steps4), steps4
    median = summary4.rsplit("median step [0] ", 1)[1]
    assert median[0].isdigit(), summary4
    assert losses4[-1] < losses4[0]
    for a, b in zip(losses4, losses1, strict=True):
        assert abs(a - b) <= 1e-5 * max(1.0, abs(b)), (losses4, losses1)


def test_interrupt_during_launch_leaves_no_orphans():
    code = (
        PRELUDE
        + """
def replica(index):
    import os, time
    print("group", os.getpgrp(), flush=True)
    time.sleep(120)
launch(replica)
"""
    )
    env = without_xla_settings(os.environ)
    env.pop("PJRT_DEVICE", None)
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=str(ROOT),
    )
    group = None
    deadline = time.time() + 120
    while group is None and time.time() < deadline:
        line = proc.stdout.readline()
        if "group" in line:
            group = int(line.split("group")[1])
    assert group is not None and group != os.getpgrp()
    proc.send_signal(signal.SIGINT)  # what a kernel interrupt delivers
    proc.wait(timeout=30)

    def group_gone() -> bool:
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return True
        return False

    wait_until(group_gone, timeout=30, what="no process of the launch to be left")
    leftover = subprocess.run(["pgrep", "-g", str(group)], capture_output=True, text=True)
    assert leftover.stdout.strip() == ""
