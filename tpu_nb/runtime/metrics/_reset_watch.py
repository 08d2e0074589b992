"""Counters that survive torch_xla's own resets.

While `torch.compile(backend="openxla")` compiles a graph, torch_xla 2.9's Dynamo bridge
(`UnsupportedNodesCollector.run_node`) calls `torch_xla.debug.metrics.clear_counters()` before
each FX node it checks, and puts back only `UncachedCompile` and `DynamoExtractCompiledGraph`.
Executions, cache hits, syncs, CPU fallbacks and host reads counted so far are wiped mid-cell.
Time metrics are not touched (ExecuteTime keeps its samples).

A reset is noticed in one of two ways:
- seen: the backend's reset itself is wrapped (`counters.watch_clears`: torch_xla's
  `_XLAC._clear_xla_counters`, which `torch_xla.debug.metrics.clear_counters` calls), so
  that the counters' values are carried just before it clears them. The wrapper then calls
  the original: torch_xla's own readers see exactly what they saw before. An execution
  that ends between the read and the clear is lost to the counter (executions end in the
  runtime's threads), not to its time samples: across any reset, executions are counted
  from those (see _counters.py). Installed when the
  extension loads or at the first snapshot, removed by `uninstall()` (`%unload_ext`).
- unseen (a reference to the reset taken before the wrapper was installed): a counter read
  smaller than at the previous read, or fewer counter names listed (a reset drops them all).
  What the previous read saw is carried; executions and compiles are recovered from their
  time samples (see _counters.py); the other counts made between that read and the reset
  are lost, and a delta across it names them (`MetricsDelta.unknown`).

`carry(raw)` adds what was carried to a fresh read, so `snapshot()` counts only move forward.
Everything here runs under `lock`: a snapshot on the live monitor's thread must not read
between the carry and the clear (it would count those values twice).
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable

from tpu_nb.runtime.backend import current as backend
from tpu_nb.runtime.probe import Hooks, Subscription, probe

lock = threading.RLock()
# Counts torch_xla cleared outside reset_metrics(), per counter, to add back to every read.
_carried: Counter[str] = Counter()
# The raw values of the previous read, to notice a reset nobody told us about.
_last_raw: dict[str, int] = {}
_last_names = 0  # how many counters the backend listed at the previous read
unseen_resets = 0  # resets noticed by a counter going down
seen_resets = 0  # resets carried by _on_clear


def _install(hooks: Hooks) -> None:
    """The probe's "counter-resets" kind."""
    counters = backend().counters
    counters.watch_clears(_on_clear)
    hooks.undo(counters.unwatch_clears, "counter reset watch")


probe().define("counter-resets", _install)
_held: list[Subscription] = []  # held from the first snapshot until uninstall()


def ensure_installed() -> None:
    """Carry counts across the backend's own counter resets from now on, through `_on_clear`
    (the extension calls it when it loads; the first snapshot does too; cheap to call
    again). Without it, resets are noticed as unseen ones."""
    if _held:
        return
    with lock:
        if not _held:
            _held.append(probe().subscribe(_on_clear, ("counter-resets",), of_run=False))


def uninstall() -> None:
    """Give the backend its own counter resets back (what `%unload_ext tpu_nb` does)."""
    with lock:
        while _held:
            _held.pop().close()


def _on_clear(restored: frozenset[str], clear: Callable[[], None]) -> None:
    # The backend is about to clear its counters: carry their values first, under the lock,
    # then clear; its own readers see exactly what they saw before. `restored`: counters the
    # backend puts back after clearing (carrying them too would count them twice).
    global _last_raw, _last_names, seen_resets
    with lock:
        seen_resets += 1
        counters = backend().counters
        counts = counters.read(counters.names())
        _carried.update({n: c for n, c in counts.items() if n not in restored and c})
        _last_raw, _last_names = {}, 0
        clear()


def carry(raw: dict[str, int], n_names: int) -> dict[str, int]:
    """`raw` (a fresh read of counters, under `lock`) plus what earlier resets cleared.
    `n_names`: how many counters the backend lists now."""
    global _last_raw, _last_names, unseen_resets
    last = _last_raw
    previous = last.get
    # Counter names only accumulate until a reset drops them all, and some never count
    # again (torch_xla's RegisterXLAFunctions counts once, at import): fewer names than at
    # the previous read is a reset even when every counter read has climbed back as high.
    cleared = n_names < _last_names
    _last_names = n_names
    for name, count in raw.items():  # a plain loop: ~2x cheaper than any() over a generator
        if cleared or count < previous(name, 0):
            cleared = True
            break
    if cleared:
        _carried.update(last)
        _last_raw = dict(raw)
        unseen_resets += 1
        logging.getLogger("tpu_nb").debug(
            "XLA counters were reset where tpu_nb could not see it; counts since the previous "
            "read are lost"
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
    global _last_raw, _last_names
    _carried.clear()
    _last_raw, _last_names = {}, 0
