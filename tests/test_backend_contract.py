"""What any backend must deliver: each test is a behaviour a part of tpu_nb relies on, asserted
against every registered backend on the real runtime (torch_xla on XLA:CPU here).

A new backend is registered with `tpu_nb.runtime.backend.register(...)` and runs through
every test below unchanged. Tests that need a fresh process (what holds before the backend
is imported, SPMD, launching replicas, clearing counters) run one with `py`, naming the
backend under test by its name.
"""

from __future__ import annotations

import glob
import json
import os
import threading

import pytest
import torch

from tpu_nb.runtime.backend import Backend, DeviceMemory, MetricSamples, backends

BACKENDS = pytest.mark.parametrize("b", backends(), ids=lambda b: b.name)

# Picks the backend under test in a subprocess.
PICK = (
    "from tpu_nb.runtime.backend import backends\n"
    "b = [b for b in backends() if b.name == {name!r}][0]\n"
)

_unique = [0]
_unique_lock = threading.Lock()


def fresh_size() -> int:
    """A dimension no graph of this process has used: its graphs compile anew."""
    with _unique_lock:
        _unique[0] += 1
        return 1_000 + 7 * _unique[0]


def counts(b: Backend) -> dict[str, int]:
    """The facts a MetricsDelta reports, read through the backend's CounterNames."""
    n = b.counter_names_of
    raw = b.read_counters([n.compiles, n.cache_hits, *n.executions, n.syncs, n.host_read])
    return {
        "compiles": raw[n.compiles],
        "cache_hits": raw[n.cache_hits],
        "executions": sum(raw[name] for name in n.executions),
        "syncs": raw[n.syncs],
        "host_reads": raw[n.host_read],
    }


def moved(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in before}


def new_graph(b: Backend):
    """A tensor whose pending graph this process has never compiled."""
    x = torch.ones(fresh_size(), 3, device=b.device())
    return (x * 2).relu()


# -- loading ---------------------------------------------------------------------------------


@BACKENDS
def test_facts_before_the_backend_loads_never_load_it(b, py):
    # detect(), setup() and the interrupt notice ask these before the first XLA work: answering
    # must not import the backend (nor start its runtime, which latches settings).
    out = py(
        PICK.format(name=b.name)
        + """
        import json, sys
        before = [b.is_loaded(), b.runtime_started(), b.compiled_yet(), b.spmd_active(),
                  b.spmd_locked(), any(p in sys.modules for p in b.packages[:1])]
        b.module()
        imported = [b.is_loaded(), b.runtime_started()]
        import torch
        x = torch.ones(2, device=b.device()) + 1
        b.sync()
        b.wait_device_ops()
        after = [b.runtime_started(), b.compiled_yet(), b.spmd_locked()]
        print(json.dumps([before, imported, after]))
        """.replace("\n        ", "\n")
    ).stdout
    before, imported, after = json.loads(out.splitlines()[-1])
    assert before == [False, False, False, False, False, False]
    assert imported == [True, False]  # importing is not starting the runtime
    assert after == [True, True, True]  # started without SPMD: the choice is locked


# -- counters and metrics --------------------------------------------------------------------


@BACKENDS
def test_a_sync_of_a_new_graph_compiles_once_and_executes_once(b):
    y = new_graph(b)
    b.sync()  # work pending from before is not part of the count
    b.wait_device_ops()
    before = counts(b)
    y = (y + 1).sum()
    b.sync()
    b.wait_device_ops()
    first = counts(b)
    assert moved(before, first) == {
        "compiles": 1,
        "cache_hits": 0,
        "executions": 1,
        "syncs": 1,
        "host_reads": 0,
    }


@BACKENDS
def test_the_same_graph_again_is_a_cache_hit(b):
    size = fresh_size()

    def step():
        return (torch.ones(size, 2, device=b.device()) * 3).sum()

    kept = step()
    b.sync()
    b.wait_device_ops()
    before = counts(b)
    kept = step()
    b.sync()
    b.wait_device_ops()
    assert moved(before, counts(b)) == {
        "compiles": 0,
        "cache_hits": 1,
        "executions": 1,
        "syncs": 1,
        "host_reads": 0,
    }
    del kept


@BACKENDS
def test_counters_only_move_forward(b):
    names = list(b.counter_names())
    previous = b.read_counters(names)
    for _ in range(3):
        y = new_graph(b)
        y.sum().item()
        b.sync()
        now = b.read_counters(names)
        assert all(now[n] >= previous[n] for n in names)
        assert any(now[n] > previous[n] for n in names)
        previous = now


@BACKENDS
def test_a_device_read_is_counted_and_is_not_a_cpu_fallback(b):
    size = fresh_size()
    y = (torch.ones(size, 3, device=b.device()) * 2).sum()
    b.sync()
    b.wait_device_ops()
    before = counts(b)
    value = y.item()
    assert moved(before, counts(b))["host_reads"] == 1
    assert value == 6 * size
    host_read = b.counter_names_of.host_read
    assert host_read.startswith(b.counter_names_of.fallback_prefix)  # so tpu_nb must skip it


@BACKENDS
def test_a_cpu_fallback_is_named_and_counted(b):
    prefix = b.counter_names_of.fallback_prefix
    name = prefix + "histc"
    before = b.read_counters([name])[name]
    h = torch.histc(torch.linspace(0, 1, 50, device=b.device()), bins=5)  # no XLA lowering
    b.sync()
    assert b.read_counters([name])[name] == before + 1
    assert name in b.fallback_ops()
    assert h.cpu().sum().item() == 50


@BACKENDS
def test_unknown_counters_read_zero_and_unknown_metrics_none(b):
    assert b.read_counters(["NoSuchCounterAnywhere"]) == {"NoSuchCounterAnywhere": 0}
    assert b.metric("NoSuchMetricAnywhere") is None
    assert b.metric_samples("NoSuchMetricAnywhere") is None


@BACKENDS
def test_compile_and_execute_times_are_recorded_per_event(b):
    n = b.counter_names_of
    before = {name: b.metric(name) or (0, 0.0) for name in (n.compile_time, n.execute_times[0])}
    y = new_graph(b)
    b.sync()
    b.wait_device_ops()  # an execution's time is recorded when it finishes
    compile_after = b.metric(n.compile_time)
    execute_after = b.metric(n.execute_times[0])
    assert compile_after is not None and execute_after is not None
    assert compile_after[0] == before[n.compile_time][0] + 1
    assert compile_after[1] > before[n.compile_time][1]  # nanoseconds spent compiling
    assert execute_after[0] == before[n.execute_times[0]][0] + 1
    assert n.compile_time in b.metric_names()
    samples = b.metric_samples(n.compile_time)
    assert isinstance(samples, MetricSamples)
    assert (samples.count, samples.total) == compile_after
    assert 1 <= len(samples.samples) <= samples.count
    assert samples.samples[-1][0] > 0 and samples.samples[-1][1] > 0  # (timestamp, value)
    del y


@BACKENDS
def test_transfers_are_timed_both_ways(b):
    n = b.counter_names_of
    to_before = (b.metric(n.to_device_time) or (0, 0.0))[0]
    x = torch.arange(fresh_size(), dtype=torch.float32).to(b.device())
    assert b.metric(n.to_device_time)[0] > to_before
    b.sync()
    from_before = (b.metric(n.from_device_time) or (0, 0.0))[0]
    x.cpu()
    assert b.metric(n.from_device_time)[0] > from_before


@BACKENDS
def test_the_backends_own_counter_reset_goes_through_the_hook(b, py):
    # tpu_nb carries counts across resets it did not ask for (torch_xla's Dynamo bridge
    # clears them mid-compile); it needs to run just before such a reset.
    out = py(
        PICK.format(name=b.name)
        + """
        import json, torch
        seen = []

        def hook(restored, clear):
            seen.append((sorted(restored), b.read_counters([names.syncs])[names.syncs]))
            clear()

        names = b.counter_names_of
        x = torch.ones(2, device=b.device()) + 1
        b.sync()
        assert b.intercept_counter_clears(hook)
        from torch_xla.debug import metrics  # the backend's own reset, as its bridge calls it
        metrics.clear_counters()
        after = b.read_counters([names.syncs])[names.syncs]
        b.clear_counters()  # tpu_nb's own reset: not routed through the hook
        print(json.dumps([seen, after]))
        """.replace("\n        ", "\n")
    ).stdout
    seen, after = json.loads(out.splitlines()[-1])
    assert seen == [[[], 1]]  # called once, before the reset: the sync was still counted
    assert after == 0


@BACKENDS
def test_compile_log_settings_leave_the_environment_once_latched(b, py):
    # A child process must not append its compiles to this process's log: once the backend
    # has read its settings (the first compile) they leave os.environ, and stay in effect.
    out = py(
        PICK.format(name=b.name)
        + """
        import json, os, subprocess, sys, tpu_nb, torch
        tpu_nb.setup("cpu")
        before = b.hide_latched_settings()  # nothing compiled: they must stay for the latch
        (torch.ones(2, device=b.device()) + 1).sum().item()
        after = b.hide_latched_settings()
        child = subprocess.run([sys.executable, "-c", "import os; print(sorted(k for k in "
            "os.environ if k.startswith('PT_XLA_DEBUG')))"], capture_output=True, text=True)
        print(json.dumps([before, after, b.compile_log_path() is not None,
            b.settings().get("PT_XLA_DEBUG_LEVEL"), child.stdout.strip()]))
        """.replace("\n        ", "\n")
    ).stdout
    assert json.loads(out.splitlines()[-1]) == [False, True, True, "1", "[]"]


# -- compile events --------------------------------------------------------------------------


@BACKENDS
def test_each_uncached_compile_appends_one_cause_block(b):
    path = b.compile_log_path()
    assert path is not None  # tests/conftest.py: setup("cpu") switches the analysis on
    before_size, before = os.path.getsize(path), counts(b)
    y = new_graph(b)
    b.sync()
    b.wait_device_ops()
    with open(path, errors="replace") as f:
        f.seek(before_size)
        written = f.read()
    assert moved(before, counts(b))["compiles"] == 1
    prefix = "Compilation Analysis: "  # every line of a block starts with it
    body = [line[len(prefix) :].strip() for line in written.splitlines() if line.startswith(prefix)]
    assert body.count("Compilation Cause") == 1  # one block
    assert "sync" in body[body.index("Compilation Cause") + 1]  # its cause names the sync
    del y


@BACKENDS
def test_no_cause_file_without_the_analysis(b, py):
    out = py(
        PICK.format(name=b.name) + "print(b.compile_log_path())\n",
        env={"PT_XLA_DEBUG_LEVEL": None, "PT_XLA_DEBUG_FILE": None},
    ).stdout
    assert out.splitlines()[-1] == "None"


# -- the pending graph -----------------------------------------------------------------------


@BACKENDS
def test_the_pending_graph_of_a_tensor_names_its_ops(b):
    x = torch.ones(fresh_size(), 4, device=b.device())
    y = (x * 2).relu()
    assert b.is_pending(y)
    text = b.graph_text([y])
    assert "aten::mul" in text and "aten::relu" in text
    assert "aten::relu" not in b.graph_text([x * 2])
    hlo = b.graph_hlo([y])
    assert "HloModule" in hlo and "multiply" in hlo
    proto = b.graph_hlo_proto([y])
    assert isinstance(proto, bytes) and len(proto) > 0
    b.sync()
    assert not b.is_pending(y)  # after the sync it is device data


@BACKENDS
def test_the_graph_hash_is_the_same_for_the_same_graph_only(b):
    size = fresh_size()
    x = torch.ones(size, 4, device=b.device())
    b.sync()
    one, two = (x * 2).relu(), (x * 2).relu()
    other = (x * 3).sigmoid()
    assert b.graph_hash([one]) == b.graph_hash([two])
    assert b.graph_hash([one]) != b.graph_hash([other])
    assert all(c in "0123456789abcdef" for c in b.graph_hash([one]))


@BACKENDS
def test_ir_debug_records_the_python_line_while_on(b):
    was = b.ir_debug()
    x = torch.ones(fresh_size(), 2, device=b.device())
    try:
        b.set_ir_debug(True)
        assert b.ir_debug()
        located = x.exp()
        b.set_ir_debug(False)
        assert not b.ir_debug()
        plain = x.log()
    finally:
        b.set_ir_debug(was)
    assert "test_backend_contract.py" in b.graph_text([located])
    assert "test_backend_contract.py" not in b.graph_text([plain])


# -- device, memory, sync --------------------------------------------------------------------


@BACKENDS
def test_device_facts_on_this_machine(b):
    devices = b.supported_devices()
    assert b.device().type == b.device_type
    assert devices and all(d.startswith(b.device_type) for d in devices)
    assert b.addressable_device_count() == len(devices)
    assert b.global_device_count() >= b.addressable_device_count()
    assert b.device(len(devices) - 1).index == len(devices) - 1
    assert (b.global_ordinal(), b.world_size()) == (0, 1)  # outside a launch
    kind = b.device_kind()
    assert kind == os.environ["PJRT_DEVICE"].upper()
    if kind == "CPU":  # XLA:CPU reports no memory figures: the live view says so instead
        with pytest.raises(RuntimeError, match="UNIMPLEMENTED"):
            b.memory(devices[0])
    else:
        memory = b.memory(devices[0])
        assert isinstance(memory, DeviceMemory) and memory.limit


@BACKENDS
def test_after_next_sync_runs_once_after_the_next_sync(b):
    calls = []
    y = new_graph(b)
    b.after_next_sync(lambda: calls.append(counts(b)["syncs"]))
    assert calls == []
    before = counts(b)["syncs"]
    b.sync()
    b.sync()
    assert calls == [before + 1]
    del y


@BACKENDS
def test_wait_device_ops_waits_for_every_execution(b):
    n = b.counter_names_of
    executions = n.executions[0]
    b.wait_device_ops()

    def counts():  # a counter clear (Dynamo's bridge) resets counters, not metrics: deltas
        timed = b.metric(n.execute_times[0])
        return (timed[0] if timed else 0), b.read_counters([executions])[executions]

    timed_before, ran_before = counts()
    y = new_graph(b)
    for _ in range(3):
        y = y + 1
        b.sync()
    b.wait_device_ops()
    timed_after, ran_after = counts()
    assert ran_after - ran_before == 3
    assert timed_after - timed_before == ran_after - ran_before  # each one timed: finished


# -- where tpu_nb's interception layer looks ----------------------------------------------


@BACKENDS
def test_the_counter_reader_reads_what_read_counters_reads(b):
    read = b.counter_reader()
    n = b.counter_names_of
    y = new_graph(b)
    b.sync()
    b.wait_device_ops()
    names = [n.compiles, n.cache_hits, n.syncs, *n.executions]
    assert {name: read(name) or 0 for name in names} == b.read_counters(names)
    assert not read("NoSuchCounterAnywhere")  # 0 or None: never counted
    del y


@BACKENDS
def test_tensors_created_moves_with_each_op_and_only_then(b):
    # track() knows whether a block left work pending, without a sync, by this counter.
    name = b.counter_names_of.tensors_created
    read = b.counter_reader()
    y = new_graph(b)
    b.sync()
    synced = read(name)
    b.sync()  # nothing pending: nothing created
    assert read(name) == synced
    y.add_(1)  # in place: still a new device tensor under it
    assert read(name) > synced
    del y


@BACKENDS
def test_live_tensors_are_created_less_destroyed(b):
    # A step that keeps one more device tensor each time (a list of losses) is named by how
    # the live count grows: created - destroyed.
    n = b.counter_names_of
    read = b.counter_reader()

    def live():
        return (read(n.tensors_created) or 0) - (read(n.tensors_destroyed) or 0)

    y = new_graph(b)
    b.sync()
    before, kept = live(), []
    for _ in range(5):
        y = y * 2
        b.sync()
        kept.append(y)
    assert live() - before == 4  # five kept; the first y is no longer held
    del kept[:]
    assert live() - before == 0  # only y, the last one, is held
    del y


@BACKENDS
def test_every_sync_goes_through_an_entry_point(b):
    # The probe wraps each entry point once per tracked run; the user's syncs, the backend's
    # own and tpu_nb's (`sync_function()`) must each pass through one of them.
    seen: list[bool] = []
    entries = b.sync_entry_points()
    originals = [getattr(owner, name) for owner, name, _ in entries]
    assert entries and any(not inner for _, _, inner in entries)

    def counting(original, inner):
        def sync(*args, **kwargs):
            seen.append(inner)
            return original(*args, **kwargs)

        return sync

    try:
        for (owner, name, inner), original in zip(entries, originals, strict=True):
            setattr(owner, name, counting(original, inner))
        b.sync()
        assert seen == [False]
        b.sync_function()()  # looked up as it is now: the wrapper
        assert seen == [False, False]
    finally:
        for (owner, name, _), original in zip(entries, originals, strict=True):
            setattr(owner, name, original)
    assert [getattr(owner, name) for owner, name, _ in entries] == originals


@BACKENDS
def test_loader_iterators_are_looked_up_never_imported(b, py):
    out = py(
        PICK.format(name=b.name)
        + """
        import json, sys
        b.module()
        before = set(sys.modules)
        found = b.loader_iterators()
        print(json.dumps([sorted(set(sys.modules) - before),
                          all(isinstance(c, type) and hasattr(c, "__next__") for c in found)]))
        """.replace("\n        ", "\n")
    ).stdout
    assert json.loads(out.splitlines()[-1]) == [[], True]


@BACKENDS
def test_the_backends_own_code_is_where_it_says(b):
    # Syncs from these callers are plumbing, frames under these paths are compiling, time in
    # these files is input: a release that moved them would count its plumbing as steps.
    root = os.path.dirname(os.path.dirname(os.path.abspath(b.module().__file__)))
    for suffix, function in b.plumbing_sync_callers:
        path = os.path.join(root, *suffix.split("/"))
        assert os.path.isfile(path), path
        if function:
            with open(path, encoding="utf-8") as f:
                assert f"def {function}(" in f.read(), (path, function)
    for fragment in (*b.compiler_paths, *b.loader_paths):
        assert glob.glob(os.path.join(root, *fragment.split("/")) + "*"), fragment


def test_torch_xla_device_loader_batches_go_through_its_iterator():
    import torch_xla.distributed.parallel_loader as pl

    b = next(b for b in backends() if b.name == "torch_xla")
    (cls,) = b.loader_iterators()
    batches = []
    original = cls.__next__

    def counting(iterator):
        batch = original(iterator)
        batches.append(batch)
        return batch

    cls.__next__ = counting
    try:
        data = [torch.full((2,), float(i)) for i in range(3)]
        got = list(pl.MpDeviceLoader(data, b.device()))
    finally:
        cls.__next__ = original
    assert len(got) == 3 and [t.device.type for t in batches] == [b.device_type] * 3


@BACKENDS
def test_a_graph_session_over_its_limit_raises_at_the_trace(b):
    # max_graphs(N) falls back on this where the compile log is off.
    saved = b.graph_limit()
    name = f"contract-{fresh_size()}"
    sizes = [fresh_size(), fresh_size()]
    outcomes = []
    b.set_graph_limit(1)
    try:
        assert b.graph_limit() == 1
        for size in (sizes[0], sizes[0], sizes[1]):
            b.start_graph_session(name)
            try:
                y = torch.ones(size, device=b.device()) * 2
                b.sync()
                outcomes.append("ok")
            except RuntimeError:
                outcomes.append("raised")
            finally:
                b.end_graph_session()
    finally:
        b.forget_graph_session(name)
        b.set_graph_limit(saved)
    assert outcomes == ["ok", "ok", "raised"]  # the same graph again is not a new one
    assert b.graph_limit() == saved
    del y


@BACKENDS
def test_the_profiler_writes_a_chrome_trace(b, py, tmp_path):
    out = py(
        PICK.format(name=b.name)
        + f"""
        import glob, json, torch
        logdir = {str(tmp_path)!r}
        b.start_trace(logdir)
        try:
            b.start_trace(logdir)
            second = "started"
        except Exception:
            second = "refused"
        x = torch.ones(64, 64, device=b.device())
        for _ in range(3):
            x = torch.tanh(x @ x)
            b.sync()
        b.wait_device_ops()
        b.stop_trace()
        print(json.dumps([second, len(glob.glob(logdir + "/**/*.trace.json.gz",
                                                recursive=True))]))
        """.replace("\n        ", "\n"),
        timeout=300,
    ).stdout
    assert json.loads(out.splitlines()[-1]) == ["refused", 1]


def test_torch_xla_memory_figures_from_each_info_shape():
    from tpu_nb.runtime.backend._torch_xla import memory_from_info

    full = memory_from_info({"bytes_used": 10, "bytes_limit": 100, "peak_bytes_used": 50})
    assert full == DeviceMemory(10, 100, 50)
    assert memory_from_info({"kb_total": 4, "kb_free": 1}) == DeviceMemory(3072, 4096, None)
    assert memory_from_info({}) == DeviceMemory(None, None, None)


# -- multi-device ----------------------------------------------------------------------------


@BACKENDS
def test_spawn_runs_the_function_once_per_device(b, py, tmp_path):
    out = py(
        PICK.format(name=b.name)
        + f"""
        import json
        path = {str(tmp_path / "seen")!r}

        def replica(index, path):
            with open(path, "a") as f:
                f.write(json.dumps([index, b.global_ordinal(), b.world_size()]) + "\\n")

        b.spawn(replica, (path,))
        print(sorted(json.loads(line) for line in open(path)))
        """.replace("\n        ", "\n"),
        env={"CPU_NUM_DEVICES": "2"},
        timeout=300,
    ).stdout
    assert out.splitlines()[-1] == "[[0, 0, 2], [1, 1, 2]]"


@BACKENDS
def test_blocked_collectives_raise_instead_of_running(b, py):
    out = py(
        PICK.format(name=b.name)
        + """
        class Refused(Exception):
            pass

        def refusal(name):
            def refuse(*args, **kwargs):
                raise Refused(name)
            return refuse

        b.block_collectives(refusal)
        from torch_xla.core import xla_model
        refused = []
        for name in b.collectives:
            if hasattr(xla_model, name):
                try:
                    getattr(xla_model, name)(None)
                except Refused as exc:
                    refused.append(str(exc))
        print(refused[0], len(refused))
        """.replace("\n        ", "\n")
    ).stdout
    first, count = out.splitlines()[-1].split()
    assert first == "all_reduce" and int(count) >= 8


@BACKENDS
def test_spmd_over_four_devices(b, py):
    out = py(
        PICK.format(name=b.name)
        + """
        import json, torch
        before = b.spmd_active()
        b.use_spmd()
        n = b.global_device_count()
        mesh = b.mesh(n, (n, 1), ("data", "model"))
        x = torch.arange(8 * 3, dtype=torch.float32).reshape(8, 3).to(b.device())
        same = b.shard(x, mesh, ("data", None)) is x
        total = (x * 2).sum().item()
        print(json.dumps([before, b.spmd_active(), n, b.addressable_device_count(), same,
                          total]))
        """.replace("\n        ", "\n"),
        env={"CPU_NUM_DEVICES": "4"},
    ).stdout
    assert json.loads(out.splitlines()[-1]) == [False, True, 4, 1, True, 2 * sum(range(24))]


def test_a_hash_with_leading_zeros_keeps_all_32_hex_digits():
    from tpu_nb.runtime.backend import hash_hex, normal_hash
    from tpu_nb.runtime.metrics._compile_log import parse_block

    # The high 64 bits start with zero nibbles: torch's HashToString drops them in the log.
    low, high = 0x0123456789ABCDEF, 0x00000ABC00000001
    raw = low.to_bytes(8, "little") + high.to_bytes(8, "little")
    assert hash_hex(raw) == "00000abc000000010123456789abcdef"
    logged = f"{high:x}{low:016x}"  # as the compile log prints it: 27 digits
    assert len(logged) == 27 and normal_hash(logged) == hash_hex(raw)
    event = parse_block(["Graph Info: ", f"  Graph Hash: {logged}"])
    assert event.graph_hash == hash_hex(raw)
    assert normal_hash("") == ""


@BACKENDS
def test_every_compiled_graph_has_a_32_digit_hash(b):
    from tpu_nb.runtime.metrics import CompileLog

    path = b.compile_log_path()
    log = CompileLog(path)
    start = log.size()
    # 40 new graphs: the chance that none of their hashes starts with a zero nibble (which
    # the log's text drops) is under 8 %.
    for n in range(1, 41):
        x = torch.full((n, 3), 1.0, device=b.device()) * 2
        b.sync()
    del x
    events = log.events_since(start)
    assert events and all(len(e.graph_hash) == 32 for e in events)
    assert all(all(c in "0123456789abcdef" for c in e.graph_hash) for e in events)
