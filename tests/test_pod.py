"""Launching on the hosts of a TPU pod slice through Ray, on a fake slice on this machine.

As Ray's own TPU tests do, the slice is a `ray.cluster_utils.Cluster` whose nodes carry the
resources and labels of TPU VMs (`{"TPU": 4, "TPU-v4-32-head": 1}` on worker 0, the slice's
name, pod type and topology as labels); each host's actor runs on XLA:CPU. One cluster for the
module (a few seconds to start; tests/fake_slice.py keeps every Ray process on 127.0.0.1
and its files in the run's temp folder); each launch starts one new process per host (importing
torch_xla), so the tests use two hosts where two show the point.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading
import time

import pytest
from conftest import line_of
from fake_slice import LOOPBACK, descendants, listening_addresses
from fake_slice import fake_slice as slice_on_this_machine

ray = pytest.importorskip("ray")

import tpu_nb  # noqa: E402
from tpu_nb.display.pod_view import PodView  # noqa: E402
from tpu_nb.runtime.parallel import HostError, PodResult  # noqa: E402

pytestmark = pytest.mark.timeout(240)
# A host that sleeps this long outlasts the test's timeout: a call that returns at all shows
# that the host was stopped, on a machine of any speed.
_OUTLASTS = 900

# The hosts cannot import this test module, as they could not import a notebook: its
# functions travel by value, as a notebook's do.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

HOSTS = 4  # v4-32: 16 chips, 4 per host


@pytest.fixture(scope="module")
def fake_slice():
    with slice_on_this_machine(HOSTS) as cluster:
        yield cluster


def _run_dirs() -> set[str]:
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("tpu_nb-host-")}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _assert_nothing_left(pids) -> None:
    """No host process, no live placement group, no run directory."""
    from ray.util.placement_group import placement_group_table

    deadline = time.time() + 20
    while time.time() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.2)
    assert not [p for p in pids if _alive(p)]
    groups = placement_group_table().values()
    assert all(g["state"] == "REMOVED" for g in groups), groups
    assert _run_dirs() == set()


def _steps(host, hosts, pause=0.25, n=5):
    # Steps long enough that a loaded machine's noise (a starved host late by tens of ms in
    # a step) stays well below the straggler ratio.
    import time

    import torch
    import torch_xla

    w = torch.ones(8, 8, device=torch_xla.device())
    for _ in range(n):
        w = w * 0.5 + 1
        torch_xla.sync()
        time.sleep(pause)
    print(f"done {host} of {hosts}")
    return float(w.sum().cpu())


def test_function_runs_once_per_host_lined_up_in_one_view(fake_slice):
    lines = []
    result = tpu_nb.launch_hosts(_steps, 2, hosts=2, stream=lines.append)
    assert isinstance(result, PodResult)
    assert [h.host for h in result.hosts] == [0, 1]
    assert sorted(lines) == ["[host 0] done 0 of 2", "[host 1] done 1 of 2"]
    assert result.values == [pytest.approx(64 * 1.96875)] * 2  # 5 steps of w * 0.5 + 1 from 1
    assert len({h.pid for h in result.hosts}) == 2 and os.getpid() not in {
        h.pid for h in result.hosts
    }
    for h in result.hosts:
        assert h.syncs == 5 and len(h.step_seconds) == 5
        assert h.metrics.compiles >= 1 and h.metrics.executions >= 4
        assert h.compile_analysis and any(g.line > 0 for g in h.graphs)
        assert h.step_median >= 0.1
    workers = {n["NodeID"]: n["Labels"]["ray.io/tpu-worker-id"] for n in ray.nodes()}
    assert [workers[h.node] for h in result.hosts] == ["0", "1"]  # the TPU worker ids
    # Must not fire: the same program on every host, steps of the same length.
    assert result.divergences == ()
    assert result.straggler is None and result.straggler_reason.startswith("no straggler")
    assert "ran on 2 of the slice's 4 hosts" in str(result)
    text = PodView(result).text()
    assert "v4-32 (4 hosts)" in text and "step median" in text
    assert all(f"\n  {k}  " in text for k in "01")
    _assert_nothing_left([h.pid for h in result.hosts])


def test_the_cluster_listens_on_the_loopback_only(fake_slice):
    # The fake slice's own processes (GCS, raylets, workers) and the driver's connection.
    addresses = listening_addresses(descendants())
    assert addresses, "found none of the cluster's listening sockets"
    assert all(a.startswith(LOOPBACK + ":") for a in addresses), addresses
    assert fake_slice.address.startswith(LOOPBACK + ":")
    assert all(n["NodeManagerAddress"] == LOOPBACK for n in ray.nodes())


def test_hosts_of_a_tpu_vm_told_pjrt_device_cpu_run_on_the_cpu(fake_slice):
    # Every node carries a TPU VM's environment (TPU_ACCELERATOR_TYPE...) and PJRT_DEVICE=CPU:
    # "auto" on each host follows the PJRT_DEVICE it was given, not the TPU it looks like.
    def where(host):
        import os

        import torch_xla.runtime as xr

        return os.environ["TPU_ACCELERATOR_TYPE"], os.environ["TPU_WORKER_ID"], xr.device_type()

    result = tpu_nb.launch_hosts(where, hosts=2, device="auto", stream=None)
    assert result.values == [("v4-32", "0", "CPU"), ("v4-32", "1", "CPU")]


def test_cell_magic_sets_host_and_prints_prefixed(fake_slice, shell, capsys):
    shell.run_cell("greeting = 'hi <b>'")
    outcome = shell.run_cell(
        "%%on_tpu --hosts 2 -o\nx = torch.ones(2) * (host + 1)\n"
        "print(greeting, host, hosts, x.device.type)\nfloat(x.sum())\n"
    )
    assert outcome.error_in_exec is None, outcome.error_in_exec
    out = capsys.readouterr().out
    assert "[host 0] hi <b> 0 2 xla" in out and "[host 1] hi <b> 1 2 xla" in out
    result = outcome.result
    assert result.values == [2.0, 4.0]
    _assert_nothing_left([h.pid for h in result.hosts])


@pytest.mark.parametrize(
    ("made", "kind"),
    [("threading.Lock()", "lock"), ("(i for i in range(3))", "generator")],
)
def test_a_value_the_hosts_cannot_receive_is_named_in_one_line(fake_slice, shell, made, kind):
    from IPython.core.error import UsageError
    from ray.util.placement_group import placement_group_table

    groups = set(placement_group_table())  # a host starts only in a group reserved for it
    shell.run_cell(f"import threading\nunsendable = {made}\nfine = [1, 2]")
    outcome = shell.run_cell("%%on_tpu --hosts 2\nprint(fine, unsendable)\n")
    error = outcome.error_in_exec
    assert isinstance(error, UsageError), error
    message = str(error)
    assert "\n" not in message  # one line, not Ray's serializer dump
    assert message.startswith("`unsendable` (") and kind in message
    assert "cannot be sent to the hosts" in message and "Fix: create it inside the cell" in message
    assert set(placement_group_table()) == groups  # refused before any host started
    assert _run_dirs() == set()


def _hostile(fn):
    import threading

    made = threading.Lock()
    return [
        ("--hosts 0", "hosts must be 'all' or a whole number"),
        ("--hosts -2", "hosts must be 'all' or a whole number"),
        ("--hosts two", "hosts must be 'all' or a whole number"),
        ("--hosts 2.5", "hosts must be 'all' or a whole number"),
        ("--hosts 9", "hosts=9, "),
        ("--hosts all --sync", "--sync works on this kernel's device"),
        ("--hosts all --live", "--live works on this kernel's device"),
        ("--hosts 2 --max-graphs 2", "--max-graphs works on this kernel's device"),
        ("unsendable lock", "`unsendable` (lock) cannot be sent to the hosts"),
        ("unsendable generator", "`unsendable` (generator) cannot be sent to the hosts"),
        (lambda: tpu_nb.launch_hosts(fn, hosts="all", stream=5), "stream must be a function"),
        (lambda: tpu_nb.launch_hosts(fn, hosts=True), "hosts must be 'all' or a whole number"),
        (lambda: tpu_nb.launch_hosts("fn", hosts=2), "launch_hosts needs a function to run"),
        (lambda: tpu_nb.launch_hosts(fn, hosts=2, device="gpu"), "device must be 'auto'"),
        (lambda: tpu_nb.launch_hosts(fn, stall_seconds=float("nan")), "stall_seconds must be"),
        (lambda: tpu_nb.launch_hosts(fn, made, hosts=2), "argument 1 (lock) cannot be sent"),
    ]


def test_every_hostile_hosts_input_is_one_line_before_any_host_starts(fake_slice, shell):
    """Each mistake with --hosts / launch_hosts: one line saying what and the fix, raised
    before a placement group (so a host process) or a host folder exists: nothing left."""
    from IPython.core.error import UsageError
    from ray.util.placement_group import placement_group_table

    groups = set(placement_group_table())  # a host starts only in a group reserved for it
    for given, expected in _hostile(_steps):
        if callable(given):
            with pytest.raises(tpu_nb.TpuNbError) as caught:
                given()
            error: BaseException = caught.value
        else:
            options, body = given, "print(host)"
            if given.startswith("unsendable"):
                made = "threading.Lock()" if given.endswith("lock") else "(i for i in (1, 2))"
                shell.run_cell(f"import threading\nunsendable = {made}")
                options, body = "--hosts 2", "print(host, unsendable)"
            error = shell.run_cell(f"%%on_tpu {options}\n{body}\n").error_in_exec
            assert isinstance(error, UsageError), (given, error)
        message = str(error)
        assert expected in message and "Fix: " in message, (given, message)
        assert "\n" not in message, (given, message)  # one line, no serializer dump
        assert set(placement_group_table()) == groups, given  # nothing reserved, no host
        assert _run_dirs() == set(), given


def test_exception_on_one_host_stops_the_others_with_its_traceback(fake_slice, shell, capsys):
    outcome = shell.run_cell(  # returns only if host 0's sleep is cut short
        "%%on_tpu --hosts 2\nimport time\nif host == 1:\n"
        f"    raise ValueError(f'bad shard on host {{host}}')\ntime.sleep({_OUTLASTS})\n"
    )
    error = outcome.error_in_exec
    assert isinstance(error, HostError) and error.host == 1 and error.hosts == 2
    assert "host 1 of 2 failed: ValueError: bad shard on host 1" in str(error)
    out = capsys.readouterr().out
    assert "--- host 1 of 2: traceback ---" in out
    assert "line 4" in error.traceback and "raise ValueError(f'bad shard on host {host}')" in (
        error.traceback
    )
    _assert_nothing_left([])
    assert _run_dirs() == set()


def test_host_whose_process_dies_is_named_and_the_others_stopped(fake_slice, tmp_path):
    from tpu_nb.runtime.parallel import HostLost

    seen = tmp_path / "both pids seen"  # the hosts run on this machine: a file reaches them

    def dies(host):
        import os
        import signal
        import time

        import torch
        import torch_xla

        torch.ones(2, device=torch_xla.device()).add_(1)
        torch_xla.sync()
        print("pid", os.getpid(), flush=True)
        waited = 0.0
        while not os.path.exists(seen) and waited < 120:  # until the driver has both lines
            time.sleep(0.05)
            waited += 0.05
        if host == 1:
            os.kill(os.getpid(), signal.SIGKILL)  # as a native crash or the OOM killer
        time.sleep(_OUTLASTS)

    lines = []

    def stream(line):
        lines.append(line)
        if sum(" pid " in x for x in lines) == 2:
            seen.touch()

    with pytest.raises(HostLost) as caught:  # raised only if host 0's sleep is cut short
        tpu_nb.launch_hosts(dies, hosts=2, stream=stream)
    assert caught.value.host == 1 and str(caught.value).startswith("host 1's process died")
    pids = [int(x.split()[-1]) for x in lines if " pid " in x]
    assert len(pids) == 2
    _assert_nothing_left(pids)  # host 1's run directory too, swept on its node


def test_hosts_that_all_stop_syncing_are_said_and_an_interrupt_stops_every_host(fake_slice):
    pids, lines = [], []

    def stream(line):
        lines.append(line)
        if line.startswith("[host") and "running" in line:
            pids.append(int(line.split()[-1]))
        if line.startswith("[tpu_nb] no host has synced"):
            late.cancel()
            threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()

    def stuck(host):
        import os
        import time

        import torch
        import torch_xla

        torch.ones(2, device=torch_xla.device()).add_(1)
        torch_xla.sync()
        print("running", os.getpid(), flush=True)
        time.sleep(_OUTLASTS)  # as hosts stuck in one collective: no more syncs

    # The note never came (a slow start takes well under this): interrupted all the same,
    # so that the assertion below shows the lines the launch printed, not a timeout's stacks.
    late = threading.Timer(
        150, lambda: (lines.append("(no note)"), os.kill(os.getpid(), signal.SIGINT))
    )
    late.start()
    try:
        with pytest.raises(KeyboardInterrupt):  # raised only if both hosts are stopped
            tpu_nb.launch_hosts(stuck, hosts=2, stream=stream, stall_seconds=1)
    finally:
        late.cancel()
    said = [x for x in lines if x.startswith("[tpu_nb] no host has synced")]
    assert len(said) == 1 and "host 0 at line" in said[0] and "host 1 at line" in said[0], lines
    assert len(pids) == 2
    _assert_nothing_left(pids)


def test_host_with_another_batch_shape_is_named_with_the_shape(fake_slice):
    def train(host):
        import torch
        import torch_xla

        dev = torch_xla.device()
        w = torch.ones(8, 4, device=dev)
        batch = 3 if host == 2 else 2
        for _ in range(3):
            x = torch.ones(batch, 8, device=dev)
            loss = (x @ w).sum()
            torch_xla.sync()  # the line whose graph differs
        return float(loss.cpu())

    lines = []
    result = tpu_nb.launch_hosts(train, hosts=3, stream=lines.append)
    line = line_of("the line whose graph differs", train)
    # Said while the hosts ran, from their compile logs: on a real slice the run would hang.
    live = [x for x in lines if x.startswith("[tpu_nb] host 2 compiled a different graph")]
    assert len(live) == 1 and f"at line {line} " in live[0], lines
    graph = [d for d in result.divergences if d.kind == "graph"]
    assert len(graph) == 1, result.divergences
    d = graph[0]
    assert d.hosts == (2,) and d.others == (0, 1) and d.line == line
    assert "host 2 compiled a different graph at line" in d.what and "than hosts 0 and 1" in (
        d.what
    )
    assert any(
        "[2,8]" in fact.replace(" ", "") and "[3,8]" in fact.replace(" ", "") for fact in d.changed
    ), d.changed
    view = PodView(result)
    assert "DIVERGED: host 2" in view.text()
    assert "DIVERGED" in view._repr_html_()


def test_straggler_and_host_that_stops_syncing_are_named(fake_slice):
    lines = []

    def loop(host):
        import time

        import torch
        import torch_xla

        w = torch.ones(4, device=torch_xla.device())
        for step in range(40):  # host 0: 1.6 s of steps, on after host 1 stopped at 0.8 s
            if host == 1 and step == 4:
                time.sleep(4)  # stops syncing while host 0 goes on
                break
            w = w + 1
            torch_xla.sync()
            time.sleep(0.2 if host == 1 else 0.04)  # host 1: slower steps
        return step

    result = tpu_nb.launch_hosts(loop, hosts=2, stream=lines.append, stall_seconds=1.5)
    live = [line for line in lines if line.startswith("[tpu_nb] host 1 has not synced")]
    assert live and "while host 0 went on syncing" in live[0], lines
    assert not [line for line in lines if "no host has synced" in line]  # host 0 went on
    assert [h.syncs for h in result.hosts] == [40, 4]
    syncs = [(d.hosts, d.others) for d in result.divergences if d.kind == "syncs"]
    assert syncs == [((1,), (0,))], result.divergences
    assert "host 1 synced 4 times, host 0 40" in str(result)
    assert result.straggler == 1
    assert result.straggler_reason.startswith("straggler: host 1, median step")


def test_nodes_without_tpu_labels_get_one_bundle_per_host(fake_slice, monkeypatch):
    """A cluster started by hand (`ray start --resources`) has the resources, not the labels:
    a placement group with one bundle per host, the head resource on the first."""
    from ray.util.placement_group import placement_group_table

    from tpu_nb.runtime.parallel import _hosts

    real = ray.nodes
    monkeypatch.setattr(ray, "nodes", lambda: [dict(n, Labels={}) for n in real()])
    reserved = _hosts._reserve(ray, 2, 30)
    try:
        table = placement_group_table(reserved.group)
        assert table["strategy"] == "STRICT_SPREAD" and table["state"] == "CREATED"
        assert len(table["bundles"]) == HOSTS
        assert table["bundles"][0] == {"TPU": 4.0, "TPU-v4-32-head": 1.0}
        assert [h for h, _, _ in reserved.placements] == [0, 1]
        assert len({node for _, _, node in reserved.placements}) == 2
        assert reserved.description == "v4-32 (4 hosts)"
    finally:
        reserved.release()
    assert placement_group_table(reserved.group)["state"] == "REMOVED"


def test_a_reservation_that_fails_after_the_group_is_ready_is_released(fake_slice, monkeypatch):
    """Reading where the group's bundles landed can fail (Ray's state service busy): the
    group reserved the hosts by then, and holding them would block every later launch."""
    from ray.util.placement_group import placement_group_table

    from tpu_nb.runtime.parallel import _hosts

    before = set(placement_group_table())

    def unreadable(ray, group, nodes):
        raise RuntimeError("the placement group table could not be read")

    monkeypatch.setattr(_hosts, "_placements", unreadable)
    with pytest.raises(RuntimeError, match="could not be read"):
        _hosts._reserve(ray, 2, 30)
    table = placement_group_table()
    new = [g for g in table if g not in before]
    assert new and all(table[g]["state"] == "REMOVED" for g in new), table


def test_more_hosts_than_the_slice_has_is_one_line_with_the_fix(fake_slice):
    with pytest.raises(tpu_nb.TpuNbError, match=r"hosts=9, .* has 4 hosts\. Fix: hosts='all'"):
        tpu_nb.launch_hosts(_steps, hosts=9)
    with pytest.raises(tpu_nb.TpuNbError, match="Fix: hosts='all'"):
        tpu_nb.launch_hosts(_steps, hosts=0)


@pytest.mark.stack
def test_without_a_cluster_or_without_ray_one_line_and_no_hang(py):
    out = py(
        """
        import sys, time
        import tpu_nb
        print("imported ray:", "ray" in sys.modules)
        start = time.monotonic()
        try:
            tpu_nb.launch_hosts(lambda host: host, hosts="all")
        except tpu_nb.TpuNbError as exc:
            print("no cluster:", exc)
        sys.modules["ray"] = None  # as if not installed
        try:
            tpu_nb.launch_hosts(lambda host: host, hosts=2)
        except tpu_nb.TpuNbError as exc:
            print("no ray:", exc)
        print("seconds", time.monotonic() - start)
        from IPython.testing.globalipapp import start_ipython
        ip = start_ipython()
        ip.run_line_magic("load_ext", "tpu_nb")
        r = ip.run_cell("%%on_tpu --hosts\\n1")
        print("magic:", type(r.error_in_exec).__name__)
        r = ip.run_cell("%%on_tpu --hosts 2 --live\\n1")
        print("magic live:", type(r.error_in_exec).__name__)
        r = ip.run_cell("%%on_tpu --hosts all --sync\\n1")  # not dropped in silence
        print("magic sync:", type(r.error_in_exec).__name__, r.error_in_exec)
        """
    ).stdout
    assert "imported ray: False" in out
    assert "no cluster: this process is not connected to a Ray cluster" in out
    assert "Fix: ray.init(address=...)" in out
    assert "no ray: launching on a slice's hosts needs Ray" in out
    assert 'Fix: pip install "tpu_nb[pod]"' in out
    assert float(out.split("seconds")[1].split()[0]) < 10
    assert "magic: UsageError" in out and "magic live: UsageError" in out
    sync = out.split("magic sync: ")[1].splitlines()[0]
    assert sync.startswith("UsageError %on_tpu: --sync works on this kernel's device")
    assert sync.endswith("Fix: drop --sync (each host reports to the view of every host)")


def test_view_escapes_what_comes_from_user_code():
    from tpu_nb.runtime.parallel import Divergence, HostResult

    result = PodResult(
        hosts=(HostResult(host=0, address="<a>"), HostResult(host=1)),
        wall_seconds=1.0,
        started_seconds=0.5,
        slice="v4-16 (2 hosts)",
        source="x = '<script>'\n",
        divergences=(Divergence("graph", (1,), (0,), 1, "host 1 <i>", ("op <b>",)),),
        notes=("note <u>",),
    )
    html = PodView(result)._repr_html_()
    for raw in ("<script>", "<a>", "<i>", "<b>op", "<u>"):
        assert raw not in html
    assert "&lt;script&gt;" in html and "&lt;u&gt;" in html
    assert "line 1: x = '<script>'" in PodView(result).text()


def test_view_groups_the_hosts_verdicts_by_kind():
    from tpu_nb.runtime.parallel import HostResult

    def host(k, kind, share):
        return HostResult(host=k, verdict=f"{kind}: x took {share}%", verdict_kind=kind)

    result = PodResult(
        hosts=(host(0, "host-bound", 60), host(1, "host-bound", 70), host(2, "read-bound", 50)),
        wall_seconds=1.0,
        started_seconds=0.5,
        slice="v4-32 (4 hosts)",
    )
    assert result.verdicts() == [
        ("hosts 0 and 1; figures of host 0", "host-bound: x took 60%"),
        ("host 2", "read-bound: x took 50%"),
    ]
    text = PodView(result).text()
    assert "verdict (hosts 0 and 1; figures of host 0): host-bound: x took 60%" in text
    assert "verdict (host 2): read-bound" in text


def test_a_straggler_is_measured_against_the_median_of_the_other_hosts():
    """Constructed hosts: an even number of steps has the mean of its two middle ones as
    its median, and the slowest host is compared with the median of the others."""
    from tpu_nb.runtime.parallel._pod import HostResult, find_straggler

    hosts = tuple(
        HostResult(host=i, step_seconds=steps)
        for i, steps in enumerate([(1.0, 1.0, 2.0, 2.0), (1.0, 1.2, 1.2, 1.0), (3.5, 3.5, 3.5)])
    )
    assert hosts[0].step_median == 1.5 and hosts[1].step_median == 1.1
    slowest, why = find_straggler(hosts)
    assert slowest == 2, why
    assert "median step 3.50 s vs 1.30 s on the other hosts (2.7×)" in why, why
    # within the ratio of the others' median: no straggler, though above the faster one
    close = (*hosts[:2], HostResult(host=2, step_seconds=(1.6, 1.6, 1.6)))
    assert find_straggler(close)[0] is None
