"""MetricsDelta against torch_xla's own counters, for the same work."""

import torch
import torch_xla
import torch_xla.debug.metrics as met

import tpu_nb
from tpu_nb.runtime.metrics import MetricsSnapshot


def _counter(name):
    return met.counter_value(name) or 0


def _samples(name):
    data = met.metric_data(name)
    return data[0] if data else 0


def test_delta_agrees_with_torch_xla_counters():
    dev = tpu_nb.device()
    names = (
        "UncachedCompile",
        "CachedCompile",
        "MarkStep",
        "aten::_local_scalar_dense",
        "aten::histc",
    )
    metric_names = ("ExecuteTime", "TransferToDeviceTime", "TransferFromDeviceTime")
    tpu_nb.sync(wait=True)
    own_before = {n: _counter(n) for n in names} | {n: _samples(n) for n in metric_names}
    before = tpu_nb.snapshot()

    x = torch.arange(12, dtype=torch.float32).reshape(3, 4).to(dev)  # a transfer in
    y = (x @ x.T + 7).relu()
    torch_xla.sync()
    value = y.sum().item()  # a host read
    h = torch.histc(torch.linspace(0, 1, 50, device=dev), bins=5)  # a CPU fallback
    y2 = (x * 3).sum()
    torch_xla.sync()
    print(y2.cpu())  # a transfer out
    tpu_nb.sync(wait=True)

    delta = tpu_nb.snapshot().since(before)
    own = {n: _counter(n) - own_before[n] for n in names}
    own |= {n: _samples(n) - own_before[n] for n in metric_names}
    assert value == float(
        (torch.arange(12.0).reshape(3, 4) @ torch.arange(12.0).reshape(3, 4).T + 7).relu().sum()
    )
    assert delta.compiles == own["UncachedCompile"] >= 2
    assert delta.cache_hits == own["CachedCompile"]
    assert delta.syncs == own["MarkStep"] >= 2
    assert delta.executions == own["ExecuteTime"] >= 2
    assert delta.to_device_transfers == own["TransferToDeviceTime"] >= 1
    assert delta.from_device_transfers == own["TransferFromDeviceTime"] >= 1
    assert delta.host_reads == own["aten::_local_scalar_dense"] >= 1
    assert delta.fallbacks == {"histc": own["aten::histc"]} and own["aten::histc"] == 1
    assert "_local_scalar_dense" not in delta.fallbacks  # reads are not fallbacks
    assert set(met.executed_fallback_ops()) >= {"aten::histc"}
    assert delta.execute_seconds > 0 and delta.compile_seconds > 0
    assert h.shape == (5,)


def test_cached_graph_counts_as_cache_hit_not_compile():
    dev = tpu_nb.device()
    x = torch.ones(7, 5, device=dev)
    tpu_nb.sync()  # x becomes device data, not part of the graph

    def work():
        return (x * 2 + 1).sum(dim=0)

    kept = work()  # compiled once (a live result: a graph)
    tpu_nb.sync(wait=True)
    before = tpu_nb.snapshot()
    kept = work()  # same graph again
    tpu_nb.sync(wait=True)
    delta = tpu_nb.snapshot().since(before)
    assert delta.compiles == 0
    assert delta.cache_hits == 1
    assert delta.executions == 1 and kept.shape == (5,)


def test_absent_counters_are_zero_and_snapshot_is_frozen():
    snap = tpu_nb.snapshot()
    assert snap.counter("NoSuchCounter") == 0
    empty = MetricsSnapshot({}, {}, snap.taken_at)
    delta = snap.since(empty)  # from nothing: every present counter counts
    assert delta.compiles == snap.counter("UncachedCompile")
    try:
        snap.counters["x"] = 1  # read-only mapping
    except TypeError:
        pass
    else:
        raise AssertionError("snapshot counters must be read-only")


def test_reset_between_snapshots_is_not_negative():
    dev = tpu_nb.device()
    before = tpu_nb.snapshot()
    tpu_nb.reset_metrics()
    (torch.ones(3, device=dev) * 5).sum().item()
    delta = tpu_nb.snapshot().since(before)
    assert delta.host_reads == 1
    assert delta.executions >= 1
    assert all(v > 0 for v in delta.counters.values())


def test_full_snapshot_reads_every_counter_and_metric():
    full = tpu_nb.snapshot(full=True)
    assert set(met.counter_names()) <= set(full.counters)
    assert set(met.metric_names()) <= set(full.metrics)
