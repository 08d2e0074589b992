"""Compiled code: torch.compile(backend="openxla") and torch_xla.compile under tpu_nb.

Counts stay right across torch_xla's own counter resets (its Dynamo bridge clears every
counter while Dynamo compiles); Dynamo's facts (frames compiled, the guard that failed, graph
breaks) reach the report.
"""

from __future__ import annotations

import torch
import torch_xla
import torch_xla.debug.metrics as met

import tpu_nb
from tpu_nb.runtime.metrics import snapshot

X = torch_xla._XLAC


def _raw(name: str) -> int:
    return X._xla_counter_value(name) or 0


def _executions_then_clear(dev, n: int) -> int:
    before = _raw("ExecuteComputation")
    for i in range(n):
        (torch.ones(3, 3, device=dev) * (i + 2)).sum().item()
    return _raw("ExecuteComputation") - before


def test_a_clear_by_torch_xla_is_carried_across():
    dev = tpu_nb.device()
    _executions_then_clear(dev, 1)  # compiled once: later rounds only execute
    start = snapshot()
    first = _executions_then_clear(dev, 3)
    met.clear_counters()  # what torch_xla's Dynamo bridge does while Dynamo compiles
    assert _raw("ExecuteComputation") == 0  # torch_xla's own readers still see the clear
    second = _executions_then_clear(dev, 2)
    delta = snapshot().since(start)
    assert first >= 3 and second >= 2
    assert delta.executions == first + second
    assert delta.host_reads == 5


def test_a_clear_nobody_announced_is_noticed():
    dev = tpu_nb.device()
    _executions_then_clear(dev, 1)
    start = snapshot()
    first = _executions_then_clear(dev, 3)
    snapshot()  # a read (the live monitor's) between the work and the clear
    X._clear_xla_counters()
    second = _executions_then_clear(dev, 1)
    assert snapshot().since(start).executions == first + second


def test_reset_metrics_still_starts_from_zero():
    dev = tpu_nb.device()
    _executions_then_clear(dev, 2)
    met.clear_counters()
    tpu_nb.reset_metrics()
    start = snapshot()
    n = _executions_then_clear(dev, 1)
    assert snapshot().since(start).executions == n == _raw("ExecuteComputation")
