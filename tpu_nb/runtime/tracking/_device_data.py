"""A dataset on the XLA device, indexed sample by sample by a DataLoader.

`%%on_tpu` moves what the cell builds without placing it to the device, so
`TensorDataset(torch.randn(60, 16), ...)` built in the cell holds device tensors. A
DataLoader then indexes them one sample at a time: each sample is a slice of a device
tensor, each batch's graph stacks a batch of slices whose indices are constants of the graph
(a new graph for each batch of shuffled indices), and torch_xla's device loader
(MpDeviceLoader, which accelerate's prepared loader is on XLA) copies the batches back to the
host from its worker thread to send them to the device — where it can also fail in C++
("Check failed: data()->tensor_data", or "Check failed: tensor_data"). Data belongs on the
host; the loader moves batches.

While a run is tracked, the map-style fetcher of torch.utils.data (`_MapDatasetFetcher.fetch`,
called once per batch, in whatever thread iterates the loader) is wrapped: the first batch of
each fetcher looks at its dataset (a TensorDataset's tensors, or the tensors a dataset holds
as attributes, through Subset and ConcatDataset) and notes a dataset holding XLA tensors,
with the line that built them when `%%on_tpu` did (environment._defaults.built_at).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

from tpu_nb.runtime.environment._defaults import built_at
from tpu_nb.runtime.probe import probe

log = logging.getLogger("tpu_nb")

# The error torch_xla's device loader raises when a batch it copies to the host is device
# data (its worker thread's copy.copy of an XLA tensor): "Check failed: data()->tensor_data"
# or "Check failed: tensor_data: ", by the path the copy took.
LOADER_COPY_ERROR = ("Check failed:", "tensor_data")


def loader_copy_failed(error: BaseException | None) -> str:
    """The first line of `error` when it is that failure ("" when not)."""
    text = str(error) if error is not None else ""
    if not all(part in text for part in LOADER_COPY_ERROR):
        return ""
    return next((line.strip() for line in text.splitlines() if "Check failed" in line), "")


FIX = (
    'build the dataset on the host — torch.randn(..., device="cpu"), or in a cell without '
    "%%on_tpu, or from files — and let the loader move each batch (accelerate's prepared "
    "loader, MpDeviceLoader, or batch.to(device) in the step)"
)

# A loop recompiling while its DataLoader indexes device data: the indices are the change
RECOMPILE_FIX = (
    "the DataLoader indexes a dataset on the device sample by sample, and each batch's "
    "indices are constants of its graph, so each batch compiles a new one: " + FIX
)


@dataclass(frozen=True)
class DeviceDataset:
    """A dataset holding XLA tensors that a DataLoader indexed per sample."""

    kind: str  # the dataset's class name, "TensorDataset"
    shapes: tuple[tuple[int, ...], ...]  # of the device tensors it holds (the first few)
    built: tuple[tuple[str, int], ...]  # (file, line) that built them, when %%on_tpu did

    def describe(self) -> str:
        shapes = ", ".join("[" + ", ".join(map(str, s)) + "]" for s in self.shapes)
        return f"a {self.kind} of device tensors ({shapes})"


class DeviceDataWatch:
    """Subscribed to the probe's "datasets" kind while a run is tracked; `found` lists the
    device-resident datasets its DataLoaders indexed per sample."""

    def __init__(self) -> None:
        self.found: list[DeviceDataset] = []
        self._seen: set[int] = set()  # ids of the datasets looked at
        self._lock = threading.Lock()
        self._subscription: Any = None

    def start(self) -> DeviceDataWatch:
        try:
            self._subscription = probe().subscribe(self, ("datasets",), of_run=False)
        except Exception:
            log.debug("tpu_nb: the dataset watch could not start", exc_info=True)
        return self

    def stop(self) -> tuple[DeviceDataset, ...]:
        subscription, self._subscription = self._subscription, None
        if subscription is not None:
            subscription.close()
        return tuple(self.found)

    def look(self, dataset) -> None:
        key = id(dataset)
        if key in self._seen:
            return
        with self._lock:
            if key in self._seen or len(self._seen) > 1024:
                return
            self._seen.add(key)
        found = describe(dataset)
        if found is not None:
            self.found.append(found)


def describe(dataset) -> DeviceDataset | None:
    """The dataset's device tensors, when it holds some (None: it holds none we can see)."""
    tensors = [t for t in _tensors(dataset, depth=0) if getattr(t, "is_xla", False)]
    if not tensors:
        return None
    built = tuple(dict.fromkeys(b for b in map(built_at, tensors) if b is not None))
    shapes = tuple(tuple(t.shape) for t in tensors[:4])
    return DeviceDataset(type(dataset).__name__, shapes, built)


def _tensors(value, depth: int) -> list:
    """The tensors a dataset holds: its attributes' (and those of the datasets it wraps)."""
    import torch

    if depth > 2:
        return []
    try:
        attributes = list(vars(value).values())
    except TypeError:
        return []
    out: list = []
    for item in attributes:
        if isinstance(item, dict):
            out += [x for x in list(item.values())[:8] if isinstance(x, torch.Tensor)]
            continue
        for x in item[:8] if isinstance(item, (list, tuple)) else (item,):
            if isinstance(x, torch.Tensor):
                out.append(x)
            elif isinstance(x, torch.utils.data.Dataset):
                out += _tensors(x, depth + 1)
    return out


def _wrap(original):
    def fetch(self, possibly_batched_index):
        watchers = probe().listeners.get("datasets", ())
        if watchers and self.auto_collation:  # a batch of samples, indexed one by one
            for watcher in watchers:
                try:
                    watcher.look(self.dataset)
                except Exception:
                    log.debug("tpu_nb: looking at a dataset failed", exc_info=True)
        return original(self, possibly_batched_index)

    fetch.__wrapped__ = original
    return fetch


def _install(hooks) -> None:
    from torch.utils.data._utils import fetch

    hooks.patch(fetch._MapDatasetFetcher, "fetch", _wrap)


probe().define("datasets", _install)
