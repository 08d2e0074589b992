"""What a step costs on the TPU a run is judged for: FLOPs, bytes, memory, and time.

Facts, gathered once per new graph (never on a cached step):
- model FLOPs, counted from the HLO of the pending graph when tpu_nb captures a graph it has
  not seen (graph.hlo_flops: matmuls and convolutions);
- bytes, from the compile log's "Post Compilation Analysis" of that graph: inputs, outputs,
  aliased inputs (updated in place), temporaries and the program;
- resident tensors (parameters, gradients, optimizer state, by module) when a new graph is
  captured: with the graph's temporaries, what the step needs of the chip's HBM.

Per step (`RunReport.cost`, a `StepCost`): the FLOPs and bytes of the graph each syncing line
ran last; on a TPU the MFU (model FLOPs per step / step time / peak) and HBM in use;
elsewhere the target chip's device time as a roofline lower bound, max(FLOPs / peak, bytes /
bandwidth), beside the host time measured here. XLA:CPU's execution time is the CPU's: it
says nothing about a TPU.
"""

from __future__ import annotations

import logging
import warnings
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, replace
from itertools import pairwise
from types import FunctionType, ModuleType
from typing import Any

from tpu_nb.runtime.backend import current as current_backend
from tpu_nb.runtime.environment._chips import Chip, target_chip
from tpu_nb.runtime.environment._detect import detect_accelerator
from tpu_nb.runtime.graph._cost import HloFlops, hlo_flops
from tpu_nb.runtime.sources import user_stacklevel
from tpu_nb.runtime.tracking._store import store
from tpu_nb.runtime.units import format_seconds, percentile

log = logging.getLogger("tpu_nb")

_SIZE_KEYS = {
    "graph input": "input_bytes",
    "graph output": "output_bytes",
    "aliased input": "aliased_bytes",
    "intermediate tensor": "temp_bytes",
    "compiled program": "program_bytes",
}


def _format(n: float | None, unit: str, prefixes: str) -> str:
    if n is None:
        return "-"
    for prefix in prefixes:  # the largest first
        scale = 1000.0 ** ("KMGTP".index(prefix) + 1)
        if n >= scale * 0.9995:  # what rounds to 1 at three digits is 1 of this prefix
            value = n / scale  # past 999 of the largest prefix: whole, not 1.23e+03
            return (
                f"{value:.3g} {prefix}{unit}" if value < 999.5 else f"{value:,.0f} {prefix}{unit}"
            )
    return f"{n:.0f} {unit}"


def format_bytes(n: float | None) -> str:
    """Bytes in B, KB, MB, GB or TB (powers of 1000, as the Cloud TPU pages give HBM)."""
    return _format(n, "B", "TGMK")


def format_flops(n: float | None) -> str:
    return _format(n, "FLOP", "PTGM")


@dataclass(frozen=True)
class Residency:
    """XLA tensors the tracked code holds: parameters, their gradients, optimizer state;
    `largest`: (module or variable, bytes) by the top-level module they belong to."""

    params: int = 0
    grads: int = 0
    optimizer: int = 0
    largest: tuple[tuple[str, int], ...] = ()
    # the parts ("grads", "optimizer") of which a sharded parameter's tensor was still
    # pending, its layout not decided yet: counted whole
    whole: frozenset[str] = frozenset()
    # of `grads`, those the pending graph computes anew, as seen at a capture (backward()
    # after zero_grad() let the last ones go): that graph's outputs, not on the chip before
    # it runs. Not a part of what the code holds at other moments (`most` keeps none).
    new_grads: int = 0

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer

    def most(self, other: Residency | None) -> Residency:
        """The most held of each part, here or in `other` (another moment of the same run):
        an optimizer's state appears at its first step(), gradients live from backward() to
        zero_grad(), and a training step holds all three at once."""
        if other is None:
            return self
        sizes: dict[str, int] = {}
        whole: set[str] = set()
        for part in ("params", "grads", "optimizer"):
            mine, theirs = getattr(self, part), getattr(other, part)
            if mine and theirs and (part in self.whole) != (part in other.whole):
                # the same tensors, counted whole while pending and laid out at another
                # moment: their laid-out size
                sizes[part] = theirs if part in self.whole else mine
            else:
                sizes[part] = max(mine, theirs)
                if part in (self.whole if mine >= theirs else other.whole):
                    whole.add(part)
        largest: dict[str, int] = {}
        for r in [r for r in (self, other) if not r.whole] or (self, other):
            for name, size in r.largest:
                largest[name] = max(largest.get(name, 0), size)
        return Residency(
            sizes["params"],
            sizes["grads"],
            sizes["optimizer"],
            tuple(sorted(largest.items(), key=lambda kv: -kv[1])[:3]),
            frozenset(whole),
        )


@dataclass(frozen=True)
class GraphCost:
    """One compiled graph's model FLOPs and bytes (None where not known)."""

    flops: int | None = None
    left_out: str = ""
    graph_hash: str = ""  # the compile log's
    input_bytes: float | None = None
    output_bytes: float | None = None
    aliased_bytes: float | None = None
    temp_bytes: float | None = None
    program_bytes: float | None = None
    resident: Residency | None = None  # what the tracked code held when it was captured

    @property
    def moved_bytes(self) -> float | None:
        """HBM traffic at least: every input read once and every output written once."""
        if self.input_bytes is None or self.output_bytes is None:
            return None
        return self.input_bytes + self.output_bytes


@dataclass(frozen=True)
class MemoryFit:
    """Whether a step fits the chip's HBM: resident tensors plus the graph's temporaries
    and the outputs it does not write in place. `temporaries` None: not known (tpu_nb has
    no compile-log sizes for the graph: it compiled outside a tracked run, without the log,
    or tpu_nb could not match the graph it captured to the compile that wrote them).
    `unsized`: how many of the step's other graphs have no sizes where one has
    (`temporaries` is then the largest known). With anything not known, `needed` is a lower
    bound, and a step that fits it is not said to fit."""

    chip: Chip
    needed: float
    resident: Residency | None
    temporaries: float | None
    unknown: str = "tpu_nb has no compile-log sizes for this graph"
    unsized: int = 0
    # The graph's inputs (device data it reads, all resident while it runs), where they are
    # more than what tpu_nb found the tracked code holding (a library's optimizer, held by
    # an object rather than a name, is not found): they are then what is counted as held.
    inputs: float | None = None
    # the graph's outputs that do not take an input's place (a new tensor the step returns)
    outputs: float = 0.0
    graphs: int = 1  # the step's graphs: the figures are those of the one that needs most
    # the optimizer's state the graph makes, and the gradients it computes anew: among its
    # outputs, so not counted as held too
    made: float = 0.0
    new_grads: float = 0.0

    @property
    def fits(self) -> bool | None:
        """True or False; None where only the lower bound fits."""
        if self.needed > self.chip.per_device().hbm_bytes:
            return False
        return None if self.temporaries is None or self.unsized else True

    @property
    def fix(self) -> str:
        """What to do when the step does not fit, by what takes the room: what the step
        keeps on the chip between steps (no batch size changes it), or the temporaries."""
        r = self.resident
        # the gradients count here even when the step computes them anew: they stay on the
        # chip from one step to the next, whatever the batch
        held = max(self.inputs or 0.0, r.total - self.made if r else 0.0)
        if held > self.chip.per_device().hbm_bytes:
            return (
                f"what the step keeps on the chip ({format_bytes(held)}: parameters, "
                "gradients, optimizer state) is already more than it has, whatever the batch: "
                "bf16 weights (model.to(torch.bfloat16)), an optimizer with less state (SGD "
                "keeps none or one buffer per parameter, AdamW two), or the model sharded over "
                "more chips (FSDP, SPMD)"
            )
        temporaries = self.temporaries or 0.0
        if self.outputs > temporaries:  # what the step writes anew, not its activations
            return (
                f"what the graph writes anew ({format_bytes(self.outputs)} of outputs not "
                f"written in place, beside {format_bytes(temporaries)} of temporaries) takes "
                "it over: bf16 weights and optimizer state halve it, the model sharded over "
                "more chips (FSDP, SPMD) divides it"
            )
        return (
            f"the graph's temporaries ({format_bytes(temporaries)}: activations above all) "
            "take it over: a smaller batch (accumulate gradients over several to keep the "
            "batch the optimizer sees), activations recomputed in the backward "
            "(torch_xla.utils.checkpoint.checkpoint around each block), or bf16 activations"
        )

    def _once(self) -> str:
        """What the outputs hold that the code was also found holding (counted once)."""
        made = [
            what
            for what, size in (("gradients", self.new_grads), ("optimizer state", self.made))
            if size
        ]
        if not made:
            return ""
        verb = "computes" if made == ["gradients"] else "makes"
        return (
            f", the {' and '.join(made)} it {verb} among them (counted once, not also as resident)"
        )

    def describe(self) -> str:
        device = " device" if self.chip.devices > 1 else ""
        have = f"a {self.chip.name}{device} has {format_bytes(self.chip.per_device().hbm_bytes)}"
        parts = []
        r = self.resident
        found = (
            f"parameters {format_bytes(r.params)}, gradients {format_bytes(r.grads)}, "
            f"optimizer state {format_bytes(r.optimizer)}"
            if r is not None and r.total
            else ""
        )
        if self.inputs is not None:
            parts.append(
                f"the graph's inputs {format_bytes(self.inputs)}, all resident while it runs"
                + (
                    f" (your variables hold {format_bytes(r.total)} of device data: {found})"
                    if found and r is not None
                    else ""
                )
            )
        elif found and r is not None:
            parts.append(f"resident {format_bytes(r.total)} ({found})")
        if self.temporaries is None:
            parts.append(f"the graph's temporaries not known: {self.unknown}")
        elif self.unsized:
            others = (
                "1 other graph its steps ran has"
                if self.unsized == 1
                else (f"{self.unsized} other graphs its steps ran have")
            )
            parts.append(
                "the graph that needs most of those with compile-log sizes: temporaries "
                f"{format_bytes(self.temporaries)}; {others} none"
            )
        elif self.graphs > 1:  # the figures are one graph's: say which
            parts.append(
                f"of the {self.graphs} graphs its steps ran, the one that needs most: "
                f"temporaries {format_bytes(self.temporaries)}"
            )
        else:
            parts.append(f"the graph's temporaries {format_bytes(self.temporaries)}")
        if self.outputs:
            parts.append(
                f"its outputs not written in place {format_bytes(self.outputs)}" + self._once()
            )
        at_least = " at least" if self.temporaries is None or self.unsized else ""
        head = f"needs{at_least} {format_bytes(self.needed)}, {have}"
        if self.fits is None:
            return f"{head} ({'; '.join(parts)})"
        if self.fits:
            return f"fits: {head} ({'; '.join(parts)})"
        largest = self.resident.largest if self.resident else ()
        biggest = ", ".join(f"{n} {format_bytes(b)}" for n, b in largest)
        return (
            f"does not fit: {head}: "
            + (f"the biggest are {biggest}; " if biggest else "")
            + "; ".join(parts)
        )


@dataclass(frozen=True)
class StepCost:
    """What one steady step costs, judged for `chip` (`RunReport.cost`).

    `on_chip`: measured on that chip (a TPU); False: projected for the target from here."""

    chip: Chip
    on_chip: bool
    flops: int | None = None
    moved_bytes: float | None = None
    graphs: tuple[GraphCost, ...] = ()
    left_out: str = ""
    memory: MemoryFit | None = None
    device_seconds: float | None = None  # the target's roofline lower bound per step
    # the host's tracing, input and own sync time per step, measured here (not the time its
    # syncs waited for the device)
    host_seconds: float | None = None
    step_seconds: float | None = None  # measured step median
    measured_device_seconds: float | None = None  # execution per step here (the CPU's)
    mfu: float | None = None  # on a TPU
    hbm_used: int | None = None  # on a TPU
    notes: tuple[str, ...] = ()
    # torch.compile'd functions ran graphs of their own, which tpu_nb does not capture: the
    # figures are those of the rest of the step, a lower bound
    partial: bool = False

    def lines(self) -> list[str]:
        """The cost in a few sentences (the report's "cost per step")."""
        chip = self.chip.name
        out = []
        if self.flops is not None:
            bytes_ = f", {format_bytes(self.moved_bytes)} in and out" if self.moved_bytes else ""
            where = " outside torch.compile'd functions" if self.partial else ""
            out.append(
                f"{format_flops(self.flops)} per step{where}{bytes_} (matmuls and convolutions; "
                f"{self.left_out})"
            )
            if self.partial:
                out.append(
                    "the graphs torch.compile'd functions ran are not counted: the step does "
                    "more than this"
                )
        else:
            out.append("FLOPs per step not counted: tpu_nb did not capture the step's graph")
        if self.on_chip:
            if self.mfu is not None:
                out.append(f"MFU {self.mfu:.1%} of a {chip}'s bf16 peak")
            if self.hbm_used is not None:
                out.append(f"HBM in use {format_bytes(self.hbm_used)}")
        elif self.device_seconds is not None:
            here = (
                f"; XLA:CPU ran it in {format_seconds(self.measured_device_seconds)} (the "
                "CPU's time)"
                if self.measured_device_seconds
                else ""
            )
            out.append(
                f"on a {chip}: device work >= {format_seconds(self.device_seconds)} per step "
                f"(roofline), host time here {format_seconds(self.host_seconds)}{here}"
            )
        if self.memory is not None:
            out.append(f"memory on a {chip}: {self.memory.describe()}")
        out += list(self.notes)
        return out


def roofline_seconds(flops: float | None, moved: float | None, chip: Chip) -> float | None:
    """The least device time for the work: max(FLOPs / peak, bytes / HBM bandwidth)."""
    if flops is None:
        return None
    device = chip.per_device()
    return max(flops / device.peak_flops, (moved or 0.0) / device.hbm_bandwidth)


# -- gathered at a capture and a compile (see the module docstring) -------------------------


def judged_chip() -> tuple[Chip, bool]:
    """(the chip runs are judged for, whether this process runs on it)."""
    runtime = current_backend()
    if not runtime.process.started():
        return target_chip()
    kind = runtime.devices.kind().upper()
    accelerator = detect_accelerator().tpu_type if kind == "TPU" else None
    return target_chip(kind, accelerator)


def count_new_graph(own_hash: str, tensors: Sequence[Any], spaces: list | None = None) -> None:
    """A graph tpu_nb had not captured: count its FLOPs from its HLO (the HLO of a GPT-2
    step: ~20 ms, against seconds of compiling) and what the tracked code holds."""
    if own_hash in store.costs:
        return
    try:
        counted: HloFlops | None = hlo_flops(current_backend().graphs.hlo(list(tensors)))
    except Exception:
        log.debug("tpu_nb: counting a graph's FLOPs failed", exc_info=True)
        counted = None
    resident = residency(spaces) if spaces else None
    store.keep_cost(
        own_hash,
        GraphCost(
            flops=counted.flops if counted else None,
            left_out=counted.left_out if counted else "",
            resident=resident,
        ),
    )
    if resident is not None:
        _warn_if_it_cannot_fit(resident)


def note_compiled(own_hash: str, event) -> None:
    """The captured graph compiled as `event`: its sizes from the compile log."""
    known = store.costs.get(own_hash)
    if known is not None and event.sizes_gb:
        store.keep_cost(own_hash, replace(known, graph_hash=event.graph_hash, **_sizes(event)))


# The compile log gives sizes in GiB to six decimals: each may be off by half of 1e-6 GiB, and
# a difference of two by twice that (537 bytes each).
_LOG_ROUNDING = 1e-6 * 2**30


def _sizes(event) -> dict[str, Any]:
    """A compile event's sizes, as GraphCost fields, in bytes."""
    return {_SIZE_KEYS[k]: v * 2**30 for k, v in event.sizes_gb.items() if k in _SIZE_KEYS}


def _warn_if_it_cannot_fit(resident: Residency) -> None:
    """Said before the graph runs: what the tracked code holds already exceeds the chip."""
    chip, _ = judged_chip()
    fit = MemoryFit(chip, float(resident.total), resident, None, "it has not compiled yet")
    if fit.fits is False:
        warnings.warn(
            f"tpu_nb: this step {fit.describe()}. Fix: {fit.fix}.",
            UserWarning,
            stacklevel=user_stacklevel(),
        )


def _attributes(obj) -> list[tuple[str, Any]]:
    """An instance's own attributes, read from its __dict__ (no __getattr__ runs); none for
    classes, modules and functions."""
    kind = type(obj)
    if not kind.__dictoffset__ or issubclass(kind, (type, ModuleType, FunctionType)):
        return []
    try:
        attributes = object.__getattribute__(obj, "__dict__")
    except Exception:
        return []
    return list(attributes.items()) if type(attributes) is dict else []


def residency(spaces: Sequence[dict]) -> Residency:
    """Parameters, gradients and optimizer state of the modules and optimizers the
    variables of `spaces` (locals, then globals) hold, by top-level module: what one device
    holds (a tensor sharded across N devices counts 1/N)."""
    import torch

    backend = current_backend()
    device_type = backend.device_type
    named: dict[int, tuple[str, Any]] = {}
    held = (torch.nn.Module, torch.optim.Optimizer)
    for space in spaces:
        for n, v in space.items():
            # type(), not isinstance(): isinstance reads __class__, which some objects of a
            # big namespace answer with a warning
            if issubclass(type(v), held):
                named.setdefault(id(v), (n, v))
    # and those an object of theirs holds (a Trainer's model and optimizer), by its name
    for space in spaces:
        for n, v in space.items():
            for attribute, w in _attributes(v):
                if issubclass(type(w), held):
                    named.setdefault(id(w), (f"{n}.{attribute}", w))
    modules = [(n, v) for n, v in named.values() if isinstance(v, torch.nn.Module)]
    optimizers = [v for _, v in named.values() if isinstance(v, torch.optim.Optimizer)]
    seen: set[int] = set()
    owner: dict[int, str] = {}
    by_part: dict[str, int] = {}
    params = grads = state = new_grads = 0
    whole: set[str] = set()

    def counted_whole(t, got: int, param) -> bool:
        """A sharded parameter's gradient or state still pending, its size counted whole."""
        return (
            got == t.numel() * t.element_size()
            and backend.graphs.pending(t) != ""
            and backend.devices.shards(param) > 1
        )

    def size(t) -> int:
        if not isinstance(t, torch.Tensor) or t.device.type != device_type or id(t) in seen:
            return 0
        seen.add(id(t))
        # One device's part of a tensor sharded across the devices (SPMD). A tensor still
        # pending (a gradient seen before its step's sync) has no layout yet: counted whole.
        return t.numel() * t.element_size() // backend.devices.shards(t)

    for name, module in modules:
        for path, p in module.named_parameters():
            part = f"{name}.{path.split('.')[0]}" if "." in path else name
            owner[id(p)] = part
            got, grad = size(p), size(p.grad)
            params, grads = params + got, grads + grad
            if grad and backend.graphs.pending(p.grad) == "new":
                new_grads += min(grad, got)  # a sharded one's part, as its parameter's
            if grad and "grads" not in whole and counted_whole(p.grad, grad, p):
                whole.add("grads")
            by_part[part] = by_part.get(part, 0) + got + grad
    for opt in optimizers:
        for param, values in opt.state.items():
            part = owner.get(id(param), "optimizer")
            for value in values.values() if isinstance(values, dict) else ():
                got = size(value)
                state += got
                by_part[part] = by_part.get(part, 0) + got
                if got and "optimizer" not in whole and counted_whole(value, got, param):
                    whole.add("optimizer")
    largest = tuple(sorted(by_part.items(), key=lambda kv: -kv[1])[:3])
    return Residency(params, grads, state, largest, frozenset(whole), new_grads)


# -- per step, when the run ends ------------------------------------------------------------


SPANS_STEPS = (
    "the step's graph spans several steps (no torch_xla.sync() cuts it): its temporaries "
    "and compile time grow with every step"
)


def step_cost(
    line_graphs: dict[tuple[str, int], str],
    line_calls: dict,
    steps: int,
    live_tensors: Sequence[tuple[int, int]] = (),
    held: Residency | None = None,
    captured: Sequence[str] = (),
    site_graphs: dict[tuple, Any] | None = None,
    compiles: Sequence[Any] = (),
) -> StepCost:
    """The cost of a steady step: the graph each site ran most (`line_graphs`: a line, or a
    frame below it: provenance.Site.key) that synced or read in at least half the run's steps (a
    loop's sites, not a read after it), each graph once. `line_calls`: each site's calls;
    `held`: what the tracked code held as the run ended; `captured`: every graph the run
    captured, by hash, and what the code held at each; `site_graphs`: every graph each site
    ran; `compiles`: the run's compile events, placed on their sites (its memory is that of
    the graph that needs most of all these: one compiled at a loop's site that tpu_nb did not
    capture has its sizes from the compile log)."""
    chip, on_chip = judged_chip()
    loop_lines = [key for key in line_graphs if steps and line_calls.get(key, 0) * 2 >= steps]
    hashes = dict.fromkeys(line_graphs[k] for k in loop_lines)  # in order, each once
    graphs = tuple(store.costs[h] for h in hashes if h in store.costs)
    ran = dict.fromkeys(h for k in loop_lines for h in (site_graphs or {}).get(k, {}))
    every = graphs + tuple(store.costs[h] for h in ran if h in store.costs and h not in hashes)
    # The graphs compiled at the loop's sites: a capture can miss one (no variable reaches
    # its tensors), so each counts, with its sizes from the compile log. A captured graph
    # known by its compile (in this run or an earlier one: then another graph, cached) is
    # told apart by that compile's hash; one not known so may be one of those compiled here.
    loops = set(loop_lines)
    compiled = {e.graph_hash: e for e in compiles if e.site is not None and e.site.key in loops}
    known = {g.graph_hash for g in every if g.graph_hash}
    unknown = sum(1 for g in every if not g.graph_hash)
    missed = [h for h in compiled if h not in known]
    count = len(known) + len(missed) + max(0, unknown - len(missed))
    every += tuple(GraphCost(graph_hash=h, **_sizes(compiled[h])) for h in missed)
    counted = [g for g in graphs if g.flops is not None]
    flops = sum(g.flops or 0 for g in counted) if counted else None
    moved = [g.moved_bytes for g in graphs if g.moved_bytes is not None]
    note = kept_step_over_step(live_tensors)
    for h in captured:  # the most the code held, at any capture or as the run ended
        at = store.costs[h].resident if h in store.costs else None
        held = at.most(held) if at is not None else held
    return StepCost(
        chip=chip,
        on_chip=on_chip,
        flops=flops,
        moved_bytes=sum(moved) if moved else None,
        graphs=graphs,
        left_out=next((g.left_out for g in counted), ""),
        memory=memory_fit(every, chip, held, count),
        notes=(note,) if note else (),
    )


_GROWTH_STEPS = 10  # steps a growth is read over, at least


def kept_step_over_step(samples: Sequence[tuple[int, int]]) -> str:
    """From (steps made, live device tensors) just after steps' syncs: a loop whose live
    device tensors grow by about one per step or more, and at every sample since (a count
    that rises and falls, as a library's logging and evaluation make it, keeps nothing), in
    words ("" when not)."""
    if len(samples) < 3:
        return ""
    end_step, end_live = samples[-1]
    starts = [i for i, (s, _) in enumerate(samples[:-1]) if end_step - s >= _GROWTH_STEPS]
    if not starts:
        return ""
    since = samples[starts[-1] :]
    step, live = since[0]
    grown, steps = end_live - live, end_step - step
    if grown < 0.8 * steps:  # one kept per step, give or take the variables holding one
        return ""
    if any(later < earlier for (_, earlier), (_, later) in pairwise(since)):
        return ""
    return (
        f"device memory grows step over step: {grown} more live device tensors at the end "
        f"than {steps} steps before (about {grown / steps:.1g} kept per step: a list of "
        "losses or outputs holding device tensors? accumulate them into one tensor, "
        "total += loss.detach(), and read it after the loop)"
    )


def memory_fit(
    graphs: Sequence[GraphCost],
    chip: Chip,
    at_end: Residency | None = None,
    count: int = 0,
) -> MemoryFit | None:
    """What a step of these graphs needs of the chip: that of the graph which needs most
    (every graph a loop runs must fit: a gradient accumulation's optimizer step is one of
    several), with the most the tracked code held, at the graphs' captures or as the run
    ended (`at_end`: the state an optimizer made at a step after the captures); None: no
    graph has sizes. `count`: how many graphs the step ran, when known better than by
    telling `graphs` apart (one may be seen twice: captured, and compiled)."""
    sized = [g for g in graphs if g.temp_bytes is not None or g.resident is not None]
    if not sized:
        return None
    resident = max((g.resident for g in graphs if g.resident), key=lambda r: r.total, default=None)
    if at_end is not None and at_end.total:
        resident = at_end.most(resident)
    # what the tracked code holds, or the graph's inputs (device data it reads: at least that
    # much is resident) where they are more: a Trainer's optimizer state is held by the
    # Trainer, not by a name of the cell
    held = float(resident.total) if resident and resident.total else 0.0
    unknown = sum(1 for g in graphs if g.temp_bytes is None)
    # A graph writing at least the optimizer's state anew, and less than that in place (one
    # that updates the state in place read it), is the step that made it (the first step's,
    # wherever it ran): the state is counted once, as its outputs, not also as held.
    state = float(resident.optimizer) if resident else 0.0
    count = count or len({g.graph_hash or id(g) for g in graphs})
    fits = []
    for g in sized:
        outputs = max(0.0, (g.output_bytes or 0.0) - (g.aliased_bytes or 0.0))
        # (within the log's rounding, or a hundredth of a state smaller than that allows)
        makes = outputs + min(_LOG_ROUNDING, 0.01 * state) >= state > (g.aliased_bytes or 0.0)
        made = state if makes else 0.0
        # Gradients the graph computes anew are among its new outputs, though the code holds
        # them when it is captured: counted once, as outputs.
        fresh = (
            min(outputs - made, g.resident.new_grads, resident.grads)
            if g.resident and resident
            else 0.0
        )
        fresh = max(0.0, fresh)
        once = made + fresh
        inputs = g.input_bytes if (g.input_bytes or 0.0) > held - once else None
        fits.append(
            MemoryFit(
                chip,
                max(held - once, inputs or 0.0) + (g.temp_bytes or 0.0) + outputs,
                resident,
                g.temp_bytes,
                unsized=unknown if g.temp_bytes is not None else 0,
                inputs=inputs,
                outputs=outputs,
                graphs=count,
                made=made,
                new_grads=fresh,
            )
        )
    # the graph that needs most; of those that tie, one whose temporaries are known
    return max(fits, key=lambda m: (m.needed, m.temporaries is not None))


def timed(cost: StepCost, steps: Sequence[Any]) -> StepCost:
    """The cost with the steady steps' times: measured here, and projected or MFU."""
    if not steps:
        return cost
    step = percentile(sorted(s.wall for s in steps), 0.5)
    host, device = step_times(steps)
    timed_cost = replace(
        cost,
        step_seconds=step,
        host_seconds=host,
        measured_device_seconds=device,
        device_seconds=roofline_seconds(cost.flops, cost.moved_bytes, cost.chip),
    )
    if cost.on_chip and cost.flops is not None and step > 0:
        peak = cost.chip.per_device().peak_flops
        timed_cost = replace(timed_cost, mfu=cost.flops / step / peak, hbm_used=_hbm_used())
    return timed_cost


def step_times(steps: Sequence[Any]) -> tuple[float, float]:
    """The median step's host time (tracing, input and the syncs' own time) and device time
    (its executions, here), over `steps` (StepRecords, at least one)."""
    busy = Busy(union(span for s in steps for span in s.device_spans))
    host = sorted(s.trace + s.input + _own_sync(s, busy) for s in steps)
    return percentile(host, 0.5), percentile(sorted(s.device for s in steps), 0.5)


def union(spans) -> list[tuple[float, float]]:
    """Time spans as sorted, disjoint spans covering the same time."""
    out: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


class Busy:
    """Disjoint, sorted spans (the device's busy time) and their overlap with any window in
    O(log n): a run's steps are many, its executions too."""

    def __init__(self, spans: list[tuple[float, float]]):
        self.starts = [s for s, _ in spans]
        self.ends = [e for _, e in spans]
        self.cumulative = [0.0]
        for s, e in spans:
            self.cumulative.append(self.cumulative[-1] + e - s)

    def overlap(self, lo: float, hi: float) -> float:
        i = bisect_right(self.ends, lo)  # the first span ending after lo
        j = bisect_left(self.starts, hi)  # spans from i to j-1 start before hi
        if i >= j:
            return 0.0
        total = self.cumulative[j] - self.cumulative[i]
        total -= max(0.0, lo - self.starts[i])
        total -= max(0.0, self.ends[j - 1] - hi)
        return max(0.0, total)


def sync_waits(steps: Sequence[Any]) -> tuple[float, float]:
    """The steps' seconds in syncs, and of those the seconds the device was running."""
    busy = Busy(union(span for s in steps for span in s.device_spans))
    synced = sum(s.sync for s in steps)
    return synced, synced - sum(_own_sync(s, busy) for s in steps)


def _own_sync(step, busy: Busy) -> float:
    """The host's own time in the step's syncs: less the time they waited while the device
    ran (the runtime holds the host a step behind a busy device; on XLA:CPU, the CPU's)."""
    waited = sum(busy.overlap(start, end) for kind, start, end in step.host_spans if kind == "sync")
    return max(0.0, step.sync - waited)


def _hbm_used() -> int | None:
    try:
        runtime = current_backend()
        return runtime.devices.memory(str(runtime.devices.device())).used
    except Exception:
        log.debug("tpu_nb: reading HBM in use failed", exc_info=True)
        return None
