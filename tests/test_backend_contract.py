"""What any backend must deliver, protocol by protocol (Process, Counters, Graphs, Syncs,
Devices, Launch, Profiler): each test is a behaviour a part of tpu_nb relies on, asserted
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

from tpu_nb.runtime.backend import (
    Backend,
    Counters,
    DeviceMemory,
    Devices,
    Graphs,
    Launch,
    MetricSamples,
    Process,
    Profiler,
    Syncs,
    backends,
)

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
    n = b.counters.facts
    raw = b.counters.read([n.compiles, n.cache_hits, *n.executions, n.syncs, n.host_read])
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
    x = torch.ones(fresh_size(), 3, device=b.devices.device())
    return (x * 2).relu()


# -- The protocols themselves ------------------------------------------------------------------


PROTOCOLS = {
    "process": Process,
    "counters": Counters,
    "graphs": Graphs,
    "syncs": Syncs,
    "devices": Devices,
    "launch": Launch,
    "profiler": Profiler,
}


@BACKENDS
def test_each_protocol_is_implemented_and_small(b):
    # A protocol that grows past a dozen methods is two protocols: split it, do not let it grow.
    for attribute, protocol in PROTOCOLS.items():
        implementation = getattr(b, attribute)
        assert isinstance(implementation, protocol), attribute
        methods = [n for n, v in vars(protocol).items() if getattr(v, "__isabstractmethod__", 0)]
        assert 1 <= len(methods) < 12, (attribute, methods)


# -- Process: loading, settings, the compile log, source lines ---------------------------------


@BACKENDS
def test_facts_before_the_backend_loads_never_load_it(b, py):
    # detect(), setup() and the interrupt notice ask these before the first XLA work: answering
    # must not import the backend (nor start its runtime, which latches settings).
    out = py(
        PICK.format(name=b.name)
        + """
        import json, sys
        before = [b.process.is_loaded(), b.process.started(), b.process.compiled_yet(),
                  b.launch.spmd_active(), b.launch.spmd_locked(),
                  any(p in sys.modules for p in b.packages[:1])]
        b.process.load()
        imported = [b.process.is_loaded(), b.process.started()]
        import torch
        x = torch.ones(2, device=b.devices.device()) + 1
        b.syncs.sync()
        b.syncs.wait()
        after = [b.process.started(), b.process.compiled_yet(), b.launch.spmd_locked()]
        print(json.dumps([before, imported, after]))
        """.replace("\n        ", "\n")
    ).stdout
    before, imported, after = json.loads(out.splitlines()[-1])
    assert before == [False, False, False, False, False, False]
    assert imported == [True, False]  # importing is not starting the runtime
    assert after == [True, True, True]  # started without SPMD: the choice is locked


@BACKENDS
def test_compile_log_settings_leave_the_environment_once_latched(b, py):
    # A child process must not append its compiles to this process's log: once the backend
    # has read its settings (the first compile) they leave os.environ, and stay in effect.
    out = py(
        PICK.format(name=b.name)
        + """
        import json, os, subprocess, sys, tpu_nb, torch
        tpu_nb.setup("cpu")
        before = b.process.hide_latched_settings()  # nothing compiled: they must stay for the latch
        (torch.ones(2, device=b.devices.device()) + 1).sum().item()
        after = b.process.hide_latched_settings()
        child = subprocess.run([sys.executable, "-c", "import os; print(sorted(k for k in "
            "os.environ if k.startswith('PT_XLA_DEBUG')))"], capture_output=True, text=True)
        print(json.dumps([before, after, b.process.compile_log_path() is not None,
            b.process.settings().get("PT_XLA_DEBUG_LEVEL"), child.stdout.strip()]))
        """.replace("\n        ", "\n")
    ).stdout
    assert json.loads(out.splitlines()[-1]) == [False, True, True, "1", "[]"]


@BACKENDS
def test_each_uncached_compile_appends_one_cause_block(b):
    path = b.process.compile_log_path()
    assert path is not None  # tests/conftest.py: setup("cpu") switches the analysis on
    before_size, before = os.path.getsize(path), counts(b)
    y = new_graph(b)
    b.syncs.sync()
    b.syncs.wait()
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
        PICK.format(name=b.name) + "print(b.process.compile_log_path())\n",
        env={"PT_XLA_DEBUG_LEVEL": None, "PT_XLA_DEBUG_FILE": None},
    ).stdout
    assert out.splitlines()[-1] == "None"


@BACKENDS
def test_every_compiled_graph_has_a_32_digit_hash(b):
    from tpu_nb.runtime.metrics import CompileLog

    path = b.process.compile_log_path()
    log = CompileLog(path)
    start = log.size()
    # 40 new graphs: the chance that none of their hashes starts with a zero nibble (which
    # the log's text drops) is under 8 %.
    for n in range(1, 41):
        x = torch.full((n, 3), 1.0, device=b.devices.device()) * 2
        b.syncs.sync()
    del x
    events = log.events_since(start)
    assert events and all(len(e.graph_hash) == 32 for e in events)
    assert all(all(c in "0123456789abcdef" for c in e.graph_hash) for e in events)


@BACKENDS
def test_source_lines_are_recorded_while_on(b):
    was = b.process.source_lines()
    x = torch.ones(fresh_size(), 2, device=b.devices.device())
    try:
        b.process.set_source_lines(True)
        assert b.process.source_lines()
        located = x.exp()
        b.process.set_source_lines(False)
        assert not b.process.source_lines()
        plain = x.log()
    finally:
        b.process.set_source_lines(was)
    assert "test_backend_contract.py" in b.graphs.text([located])
    assert "test_backend_contract.py" not in b.graphs.text([plain])


# -- Counters: counters, time metrics, CPU fallbacks, resets -----------------------------------


@BACKENDS
def test_a_sync_of_a_new_graph_compiles_once_and_executes_once(b):
    y = new_graph(b)
    b.syncs.sync()  # work pending from before is not part of the count
    b.syncs.wait()
    before = counts(b)
    y = (y + 1).sum()
    b.syncs.sync()
    b.syncs.wait()
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
        return (torch.ones(size, 2, device=b.devices.device()) * 3).sum()

    kept = step()
    b.syncs.sync()
    b.syncs.wait()
    before = counts(b)
    kept = step()
    b.syncs.sync()
    b.syncs.wait()
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
    names = list(b.counters.names())
    previous = b.counters.read(names)
    for _ in range(3):
        y = new_graph(b)
        y.sum().item()
        b.syncs.sync()
        now = b.counters.read(names)
        assert all(now[n] >= previous[n] for n in names)
        assert any(now[n] > previous[n] for n in names)
        previous = now


@BACKENDS
def test_a_device_read_is_counted_and_is_not_a_cpu_fallback(b):
    size = fresh_size()
    y = (torch.ones(size, 3, device=b.devices.device()) * 2).sum()
    b.syncs.sync()
    b.syncs.wait()
    before = counts(b)
    value = y.item()
    assert moved(before, counts(b))["host_reads"] == 1
    assert value == 6 * size
    host_read = b.counters.facts.host_read
    assert host_read.startswith(b.counters.facts.fallback_prefix)  # so tpu_nb must skip it


@BACKENDS
def test_a_cpu_fallback_is_named_and_counted(b):
    prefix = b.counters.facts.fallback_prefix
    name = prefix + "histc"
    before = b.counters.read([name])[name]
    h = torch.histc(torch.linspace(0, 1, 50, device=b.devices.device()), bins=5)  # no XLA lowering
    b.syncs.sync()
    assert b.counters.read([name])[name] == before + 1
    assert name in b.counters.fallbacks()
    listed = b.counters.fallbacks_reader()  # what the hooks call at every sync
    assert listed() == b.counters.fallbacks()
    assert h.cpu().sum().item() == 50


@BACKENDS
def test_unknown_counters_read_zero_and_unknown_metrics_none(b):
    assert b.counters.read(["NoSuchCounterAnywhere"]) == {"NoSuchCounterAnywhere": 0}
    assert b.counters.metric("NoSuchMetricAnywhere") is None


@BACKENDS
def test_compile_and_execute_times_are_recorded_per_event(b):
    n = b.counters.facts
    names = (n.compile_time, n.execute_times[0])
    b.syncs.wait()  # an earlier execution's time, recorded late, is not this one's
    before = {name: b.counters.metric(name) or MetricSamples(0, 0.0) for name in names}
    y = new_graph(b)
    b.syncs.sync()
    b.syncs.wait()  # an execution's time is recorded when it finishes
    compiled = b.counters.metric(n.compile_time)
    executed = b.counters.metric(n.execute_times[0])
    assert isinstance(compiled, MetricSamples) and isinstance(executed, MetricSamples)
    assert compiled.count == before[n.compile_time].count + 1
    assert compiled.total > before[n.compile_time].total  # nanoseconds spent compiling
    assert executed.count == before[n.execute_times[0]].count + 1
    assert n.compile_time in b.counters.metric_names()
    assert 1 <= len(compiled.samples) <= compiled.count
    assert compiled.samples[-1][0] > 0 and compiled.samples[-1][1] > 0  # (timestamp, value)
    del y


@BACKENDS
def test_transfers_are_timed_both_ways(b):
    n = b.counters.facts

    def count(name: str) -> int:
        timed = b.counters.metric(name)
        return timed.count if timed else 0

    to_before = count(n.to_device_time)
    x = torch.arange(fresh_size(), dtype=torch.float32).to(b.devices.device())
    assert count(n.to_device_time) > to_before
    b.syncs.sync()
    from_before = count(n.from_device_time)
    x.cpu()
    assert count(n.from_device_time) > from_before


@BACKENDS
def test_the_reader_reads_what_read_reads(b):
    read = b.counters.reader()
    n = b.counters.facts
    y = new_graph(b)
    b.syncs.sync()
    b.syncs.wait()
    names = [n.compiles, n.cache_hits, n.syncs, *n.executions]
    assert {name: read(name) or 0 for name in names} == b.counters.read(names)
    assert not read("NoSuchCounterAnywhere")  # 0 or None: never counted
    del y


@BACKENDS
def test_tensors_created_moves_with_each_op_and_only_then(b):
    # track() knows whether a block left work pending, without a sync, by this counter.
    name = b.counters.facts.tensors_created
    read = b.counters.reader()
    y = new_graph(b)
    b.syncs.sync()
    synced = read(name)
    b.syncs.sync()  # nothing pending: nothing created
    assert read(name) == synced
    y.add_(1)  # in place: still a new device tensor under it
    assert read(name) > synced
    del y


@BACKENDS
def test_live_tensors_are_created_less_destroyed(b):
    # A step that keeps one more device tensor each time (a list of losses) is named by how
    # the live count grows: created - destroyed.
    n = b.counters.facts
    read = b.counters.reader()

    def live():
        return (read(n.tensors_created) or 0) - (read(n.tensors_destroyed) or 0)

    y = new_graph(b)
    b.syncs.sync()
    before, kept = live(), []
    for _ in range(5):
        y = y * 2
        b.syncs.sync()
        kept.append(y)
    assert live() - before == 4  # five kept; the first y is no longer held
    del kept[:]
    assert live() - before == 0  # only y, the last one, is held
    del y


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
            seen.append((sorted(restored), b.counters.read([names.syncs])[names.syncs]))
            clear()

        names = b.counters.facts
        x = torch.ones(2, device=b.devices.device()) + 1
        b.syncs.sync()
        assert b.counters.watch_clears(hook)
        from torch_xla.debug import metrics  # the backend's own reset, as its bridge calls it
        metrics.clear_counters()
        after = b.counters.read([names.syncs])[names.syncs]
        b.counters.clear()  # tpu_nb's own reset: not routed through the hook
        x = x + 1
        b.syncs.sync()
        synced = b.counters.read([names.syncs])[names.syncs]
        b.counters.unwatch_clears()
        metrics.clear_counters()  # the backend's own again: no hook, yet a reset
        released = b.counters.read([names.syncs])[names.syncs]
        timed = b.counters.metric(names.compile_time) is not None
        b.counters.clear_metrics()
        print(json.dumps([seen, after, synced, released, timed,
                          b.counters.metric(names.compile_time) is None]))
        """.replace("\n        ", "\n")
    ).stdout
    seen, after, synced, released, timed, cleared = json.loads(out.splitlines()[-1])
    assert seen == [[[], 1]]  # called once, before the reset: the sync was still counted
    assert (after, synced, released) == (0, 1, 0)
    assert timed and cleared


# -- Graphs: the pending graph, its hash, distinct graphs counted per name ---------------------


@BACKENDS
def test_the_pending_graph_of_a_tensor_names_its_ops(b):
    x = torch.ones(fresh_size(), 4, device=b.devices.device())
    y = (x * 2).relu()
    assert b.graphs.pending(y) == "new"
    text = b.graphs.text([y])
    assert "aten::mul" in text and "aten::relu" in text
    assert "aten::relu" not in b.graphs.text([x * 2])
    hlo = b.graphs.hlo([y])
    assert "HloModule" in hlo and "multiply" in hlo
    proto = b.graphs.hlo_proto([y])
    assert isinstance(proto, bytes) and len(proto) > 0
    b.syncs.sync()
    assert b.graphs.pending(y) == ""  # after the sync it is device data
    y.mul_(2)  # an update in place: the next graph writes over y's buffer
    assert b.graphs.pending(y) == "in place"
    z = y * 1  # a new tensor: a buffer of its own
    assert b.graphs.pending(z) == "new"
    b.syncs.sync()


@BACKENDS
def test_an_open_scope_names_the_nodes_traced_in_it_and_leaves_the_hash(b):
    x = torch.ones(fresh_size(), 4, device=b.devices.device())
    b.syncs.sync()
    plain = (x * 2).relu()
    before = b.process.source_lines()
    b.process.set_source_lines(True)
    try:
        scope = b.graphs.open_scope("encoder")
        named = (x * 2).relu()
        del scope  # closed: what follows is outside it
        after = named.tanh()
    finally:
        b.process.set_source_lines(before)
    text = b.graphs.text([after])
    relu = next(line for line in text.splitlines() if "aten::relu" in line)
    tanh = next(line for line in text.splitlines() if "aten::tanh" in line)
    assert "scope=encoder" in relu and "scope=" not in tanh
    assert b.graphs.hash([named]) == b.graphs.hash([plain])


@BACKENDS
def test_the_graph_hash_is_the_same_for_the_same_graph_only(b):
    size = fresh_size()
    x = torch.ones(size, 4, device=b.devices.device())
    b.syncs.sync()
    one, two = (x * 2).relu(), (x * 2).relu()
    other = (x * 3).sigmoid()
    assert b.graphs.hash([one]) == b.graphs.hash([two])
    assert b.graphs.hash([one]) != b.graphs.hash([other])
    assert all(c in "0123456789abcdef" for c in b.graphs.hash([one]))


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
def test_a_name_over_its_graph_limit_raises_at_the_trace(b):
    # max_graphs(N) falls back on this where the compile log is off.
    saved = b.graphs.limit()
    name = f"contract-{fresh_size()}"
    sizes = [fresh_size(), fresh_size()]
    outcomes = []
    b.graphs.set_limit(1)
    try:
        assert b.graphs.limit() == 1
        for size in (sizes[0], sizes[0], sizes[1]):
            b.graphs.start_counting(name)
            try:
                y = torch.ones(size, device=b.devices.device()) * 2
                b.syncs.sync()
                outcomes.append("ok")
            except RuntimeError:
                outcomes.append("raised")
            finally:
                b.graphs.stop_counting()
    finally:
        b.graphs.forget_counted(name)
        b.graphs.set_limit(saved)
    assert outcomes == ["ok", "ok", "raised"]  # the same graph again is not a new one
    assert b.graphs.limit() == saved
    del y


# -- Syncs: sync, wait, after the next sync, where the probe sees them -------------------------


@BACKENDS
def test_after_next_sync_runs_once_after_the_next_sync(b):
    calls = []
    y = new_graph(b)
    b.syncs.after_next(lambda: calls.append(counts(b)["syncs"]))
    assert calls == []
    before = counts(b)["syncs"]
    b.syncs.sync()
    b.syncs.sync()
    assert calls == [before + 1]
    del y


@BACKENDS
def test_wait_waits_for_every_execution(b):
    n = b.counters.facts
    executions = n.executions[0]
    b.syncs.wait()

    def counts():  # a counter clear (Dynamo's bridge) resets counters, not metrics: deltas
        timed = b.counters.metric(n.execute_times[0])
        return (timed.count if timed else 0), b.counters.read([executions])[executions]

    timed_before, ran_before = counts()
    y = new_graph(b)
    for _ in range(3):
        y = y + 1
        b.syncs.sync()
    b.syncs.wait()
    timed_after, ran_after = counts()
    assert ran_after - ran_before == 3
    assert timed_after - timed_before == ran_after - ran_before  # each one timed: finished


@BACKENDS
def test_every_sync_goes_through_an_entry_point(b):
    # The probe wraps each entry point once per tracked run; the user's syncs, the backend's
    # own and tpu_nb's (`syncs.function()`) must each pass through one of them.
    seen: list[bool] = []
    entries = b.syncs.entry_points()
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
        b.syncs.sync()
        assert seen == [False]
        b.syncs.function()()  # looked up as it is now: the wrapper
        assert seen == [False, False]
    finally:
        for (owner, name, _), original in zip(entries, originals, strict=True):
            setattr(owner, name, original)


@BACKENDS
def test_loader_iterators_are_looked_up_never_imported(b, py):
    out = py(
        PICK.format(name=b.name)
        + """
        import json, sys
        b.process.load()
        before = set(sys.modules)
        found = b.syncs.loader_iterators()
        print(json.dumps([sorted(set(sys.modules) - before),
                          all(isinstance(c, type) and hasattr(c, "__next__") for c in found)]))
        """.replace("\n        ", "\n")
    ).stdout
    assert json.loads(out.splitlines()[-1]) == [[], True]


@BACKENDS
def test_the_backends_own_code_is_where_it_says(b):
    # Syncs from these callers are plumbing, frames under these paths are compiling, time in
    # these files is input: a release that moved them would count its plumbing as steps.
    root = os.path.dirname(os.path.dirname(os.path.abspath(b.process.load().__file__)))
    for suffix, function in b.syncs.plumbing_callers:
        path = os.path.join(root, *suffix.split("/"))
        assert os.path.isfile(path), path
        if function:
            with open(path, encoding="utf-8") as f:
                assert f"def {function}(" in f.read(), (path, function)
    for fragment in (*b.syncs.compiler_paths, *b.syncs.loader_paths):
        assert glob.glob(os.path.join(root, *fragment.split("/")) + "*"), fragment


def test_torch_xla_device_loader_batches_go_through_its_iterator():
    import torch_xla.distributed.parallel_loader as pl

    b = next(b for b in backends() if b.name == "torch_xla")
    (cls,) = b.syncs.loader_iterators()
    batches = []
    original = cls.__next__

    def counting(iterator):
        batch = original(iterator)
        batches.append(batch)
        return batch

    cls.__next__ = counting
    try:
        data = [torch.full((2,), float(i)) for i in range(3)]
        got = list(pl.MpDeviceLoader(data, b.devices.device()))
    finally:
        cls.__next__ = original
    assert len(got) == 3 and [t.device.type for t in batches] == [b.device_type] * 3


# -- Devices -----------------------------------------------------------------------------------


@BACKENDS
def test_device_facts_on_this_machine(b):
    devices = b.devices.names()
    assert b.devices.device().type == b.device_type
    assert devices and all(d.startswith(b.device_type) for d in devices)
    assert b.devices.count() == len(devices)
    assert b.devices.global_count() >= b.devices.count()
    assert b.devices.device(len(devices) - 1).index == len(devices) - 1
    assert b.launch.ordinal() == 0  # outside a launch
    kind = b.devices.kind()
    assert kind == os.environ["PJRT_DEVICE"].upper()
    if kind == "CPU":  # XLA:CPU reports no memory figures: the live view says so instead
        with pytest.raises(RuntimeError, match="UNIMPLEMENTED"):
            b.devices.memory(devices[0])
    else:
        memory = b.devices.memory(devices[0])
        assert isinstance(memory, DeviceMemory) and memory.limit


def test_torch_xla_memory_figures_from_each_info_shape():
    from tpu_nb.runtime.backend._torch_xla import memory_from_info

    full = memory_from_info({"bytes_used": 10, "bytes_limit": 100, "peak_bytes_used": 50})
    assert full == DeviceMemory(10, 100, 50)
    assert memory_from_info({"kb_total": 4, "kb_free": 1}) == DeviceMemory(3072, 4096, None)
    assert memory_from_info({}) == DeviceMemory(None, None, None)


# -- Launch: replicas and SPMD -----------------------------------------------------------------


@BACKENDS
def test_spawn_runs_the_function_once_per_device(b, py, tmp_path):
    out = py(
        PICK.format(name=b.name)
        + f"""
        import json
        path = {str(tmp_path / "seen")!r}

        def replica(index, path):
            with open(path, "a") as f:
                f.write(json.dumps([index, b.launch.ordinal()]) + "\\n")

        b.launch.spawn(replica, (path,))
        print(sorted(json.loads(line) for line in open(path)))
        """.replace("\n        ", "\n"),
        env={"CPU_NUM_DEVICES": "2"},
        timeout=300,
    ).stdout
    assert out.splitlines()[-1] == "[[0, 0], [1, 1]]"


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

        for owner, name in b.launch.collective_functions():
            setattr(owner, name, refusal(name))
        from torch_xla.core import xla_model
        refused = []
        for name in b.launch.collectives:
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
        before = b.launch.spmd_active()
        b.launch.use_spmd()
        n = b.devices.global_count()
        mesh = b.launch.mesh(n, (n, 1), ("data", "model"))
        x = torch.arange(8 * 3, dtype=torch.float32).reshape(8, 3).to(b.devices.device())
        same = b.launch.shard(x, mesh, ("data", None)) is x
        total = (x * 2).sum().item()
        print(json.dumps([before, b.launch.spmd_active(), n, b.devices.count(), same,
                          total]))
        """.replace("\n        ", "\n"),
        env={"CPU_NUM_DEVICES": "4"},
    ).stdout
    assert json.loads(out.splitlines()[-1]) == [False, True, 4, 1, True, 2 * sum(range(24))]


# -- Profiler ----------------------------------------------------------------------------------


@BACKENDS
def test_the_profiler_writes_a_chrome_trace(b, py, tmp_path):
    out = py(
        PICK.format(name=b.name)
        + f"""
        import glob, json, torch
        logdir = {str(tmp_path)!r}
        b.profiler.start(logdir)
        try:
            b.profiler.start(logdir)
            second = "started"
        except Exception:
            second = "refused"
        x = torch.ones(64, 64, device=b.devices.device())
        for _ in range(3):
            x = torch.tanh(x @ x)
            b.syncs.sync()
        b.syncs.wait()
        b.profiler.stop()
        print(json.dumps([second, len(glob.glob(logdir + "/**/*.trace.json.gz",
                                                recursive=True))]))
        """.replace("\n        ", "\n"),
        timeout=300,
    ).stdout
    assert json.loads(out.splitlines()[-1]) == ["refused", 1]
