"""Counters that survive torch_xla's own resets.

While `torch.compile(backend="openxla")` compiles a graph, torch_xla 2.9's Dynamo bridge
(`UnsupportedNodesCollector.run_node`) calls `torch_xla.debug.metrics.clear_counters()` before
each FX node it checks, and puts back only `UncachedCompile` and `DynamoExtractCompiledGraph`.
Executions, cache hits, syncs, CPU fallbacks and host reads counted so far are wiped mid-cell.
Time metrics are not touched (ExecuteTime keeps its samples).

A reset is noticed in one of two ways:
- seen: `clear_counters` is wrapped, once per process, so that the counters' values are carried
  just before it clears them. The wrapper then calls the original: torch_xla's own readers
  see exactly what they saw before.
- unseen (a direct `torch_xla._XLAC._clear_xla_counters()`): a counter read smaller than at
  the previous read. What was counted between that read and the reset is lost; what the
  previous read saw is carried.

`carry(raw)` adds what was carried to a fresh read, so `snapshot()` counts only move forward.
Everything here runs under `lock`: a snapshot on the live monitor's thread must not read
between the carry and the clear (it would count those values twice).
"""

from __future__ import annotations

import functools
import logging
import sys
import threading

from tpu_nb.runtime.environment._xla import wait_device_ops, xlac

lock = threading.RLock()
# Counts torch_xla cleared outside reset_metrics(), per counter, to add back to every read.
_carried: dict[str, int] = {}
# The raw values of the previous read, to notice a reset nobody told us about.
_last_raw: dict[str, int] = {}
_installed = False
_BRIDGE = "torch_xla._dynamo.dynamo_bridge"
# The bridge reads these two before it clears and increments them back after: carrying them
# too would count them twice.
_RESTORED_BY_BRIDGE = frozenset({"UncachedCompile", "DynamoExtractCompiledGraph"})


class _Resets:
    seen = 0  # clear_counters() calls carried across
    unseen = 0  # resets noticed by a counter going down


resets = _Resets()


def ensure_installed() -> None:
    """Wrap torch_xla's `clear_counters` (once per process; cheap to call again)."""
    global _installed
    if _installed:
        return
    _installed = True
    try:
        from torch_xla.debug import metrics
    except Exception:  # an old or broken torch_xla: resets are then noticed as unseen ones
        logging.getLogger("tpu_nb").debug("cannot watch clear_counters", exc_info=True)
        return
    original = metrics.clear_counters
    if getattr(original, "_carries_counts", False):
        return

    @functools.wraps(original)
    def clear_counters():
        caller = sys._getframe(1).f_globals.get("__name__")
        if caller == _BRIDGE:
            # torch_xla counts an execution on its execution thread once it has run: one
            # still running (an earlier step) would count after the read and be cleared
            # with the rest. Waiting for launched work first makes the carry exact; it adds
            # no sync or execution, and the bridge is compiling (host-bound) meanwhile.
            wait_device_ops()
        with lock:
            _carry_now(_RESTORED_BY_BRIDGE if caller == _BRIDGE else frozenset())
            return original()

    clear_counters._carries_counts = True  # type: ignore[attr-defined]
    metrics.clear_counters = clear_counters


def _carry_now(restored: frozenset[str]) -> None:
    global _last_raw
    xc = xlac()
    value = xc._xla_counter_value
    for name in xc._xla_counter_names():
        if name not in restored:
            count = value(name) or 0
            if count:
                _carried[name] = _carried.get(name, 0) + count
    _last_raw = {}
    resets.seen += 1


def carry(raw: dict[str, int]) -> dict[str, int]:
    """`raw` (a fresh read of counters, under `lock`) plus what earlier resets cleared."""
    global _last_raw
    last = _last_raw
    previous, cleared = last.get, False
    for name, count in raw.items():  # a plain loop: ~2x cheaper than any() over a generator
        if count < previous(name, 0):
            cleared = True
            break
    if cleared:
        for name, count in last.items():
            _carried[name] = _carried.get(name, 0) + count
        _last_raw = dict(raw)
        resets.unseen += 1
        logging.getLogger("tpu_nb").debug(
            "XLA counters were cleared outside tpu_nb; counts since the previous read are lost"
        )
    else:
        last.update(raw)
    if not _carried:
        return raw
    out = dict(raw)
    for name, count in _carried.items():
        out[name] = out.get(name, 0) + count
    return out


def forget() -> None:
    """reset_metrics() cleared the counters on purpose: nothing is carried (under `lock`)."""
    global _last_raw
    _carried.clear()
    _last_raw = {}
