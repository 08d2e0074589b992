"""An out-of-memory error read into facts: what was used against what the device has, the
largest allocations with their op and the user's line, and what to do.

XLA reports device memory exhaustion as a RESOURCE_EXHAUSTED status, which torch_xla 2.9
raises as a ValueError at compile time ("Ran out of memory in memory space hbm. Used 21.95G
of 15.48G hbm ... Largest program allocations in hbm: 1. Size: 2.00G Operator: op_name=...
source_file=... source_line=...") and as a RuntimeError at run time ("Error allocating device
buffer: Attempting to allocate 196.00M. That was not possible. There are 134.44M free.").
XLA:CPU raises "Out of memory allocating N bytes." when the host cannot give the buffer.
Sizes with a K/M/G suffix are XLA's human-readable bytes: powers of 1024.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tpu_nb.runtime.sources import short_path
from tpu_nb.runtime.units import format_place

_SCALE = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_SIZE = r"([\d.]+)\s*([KMGT]?)i?B?"
_COMPILE = re.compile(
    r"Ran out of memory in memory space (\w+)\.\s*Used " + _SIZE + r" of " + _SIZE
)
_RUN = re.compile(
    r"Attempting to (?:allocate|reserve) " + _SIZE + r"(?: at the bottom of memory)?\. "
    r"That was not possible\. There are " + _SIZE + r" free"
)
_HOST = re.compile(r"Out of memory allocating (\d+) bytes")
_ALLOCATION = re.compile(r"\d+\.\s*Size:\s*" + _SIZE)
_OP = re.compile(r"op_name=\"?([^\"\s]+)\"?")
_FILE = re.compile(r"source_file=\"?([^\"\s]+)\"?")
_LINE = re.compile(r"source_line=(\d+)")
_SHAPE = re.compile(r"Shape:\s*(\S+)")
_MARKERS = (
    "RESOURCE_EXHAUSTED",
    "Ran out of memory",
    "Error allocating device buffer",
    "Out of memory allocating",
)

FIX = (
    "a smaller batch; bf16 weights (model.to(torch.bfloat16)); recompute activations in "
    "the backward instead of keeping them (torch_xla.utils.checkpoint.checkpoint around "
    "each block); or shard the model and batch over more chips (SPMD, FSDP)"
)


@dataclass(frozen=True)
class Allocation:
    """One of the largest allocations XLA listed: its size, op, shape and source line."""

    size: float
    op: str = ""
    shape: str = ""
    file: str = ""
    line: int = 0

    def describe(self) -> str:
        where = f" at {format_place(short_path(self.file), self.line)}" if self.file else ""
        shape = f" {self.shape}" if self.shape else ""
        return f"{_gib(self.size)} {self.op or 'an allocation'}{shape}{where}"


@dataclass(frozen=True)
class OutOfMemory:
    """The facts of a device (or XLA:CPU host) memory exhaustion (`RunReport.out_of_memory`)."""

    when: str  # "compile" (the program cannot fit) or "run" (a buffer could not be allocated)
    memory: str = "hbm"  # the memory space XLA named ("host" for XLA:CPU)
    used: float | None = None  # bytes the program needs (compile time)
    capacity: float | None = None  # bytes the device has for it
    requested: float | None = None  # bytes of the allocation that failed (run time)
    free: float | None = None  # bytes free then
    allocations: tuple[Allocation, ...] = ()  # largest first, as XLA lists them
    error: str = ""  # the error's first line

    def headline(self) -> str:
        if self.used is not None and self.capacity is not None:
            over = self.used - self.capacity
            return (
                f"out of memory compiling: the program needs {_gib(self.used)} of "
                f"{self.memory.upper()}, the device has {_gib(self.capacity)} "
                f"({_gib(over)} too much)"
            )
        if self.requested is not None and self.free is not None:
            return (
                f"out of memory running: a buffer of {_gib(self.requested)} did not fit in "
                f"the {_gib(self.free)} of {self.memory.upper()} still free"
            )
        if self.requested is not None:
            return f"out of memory: XLA:CPU could not allocate {_gib(self.requested)} on the host"
        return "out of device memory"

    def lines(self) -> list[str]:
        """The card: the headline, the largest allocations, what to do."""
        out = [self.headline()]
        if self.allocations:
            out.append("largest allocations:")
            out += [f"  {i}. {a.describe()}" for i, a in enumerate(self.allocations[:5], 1)]
        out.append(f"Fix: {FIX}")
        return out

    def __str__(self) -> str:
        return "\n".join(self.lines())


def _bytes(number: str, unit: str) -> float:
    return float(number) * _SCALE.get(unit.upper(), 1)


def _gib(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def out_of_memory(error: BaseException | None) -> OutOfMemory | None:
    """The facts of `error` when it is a memory exhaustion, else None."""
    if not isinstance(error, (ValueError, RuntimeError, MemoryError)):
        return None
    text = str(error)
    if not any(marker in text for marker in _MARKERS):
        return None
    first = text.strip().splitlines()[0] if text.strip() else ""
    if m := _COMPILE.search(text):
        used, capacity = _bytes(m.group(2), m.group(3)), _bytes(m.group(4), m.group(5))
        found = _allocations(text)
        return OutOfMemory("compile", m.group(1), used, capacity, allocations=found, error=first)
    if m := _RUN.search(text):
        requested, free = _bytes(m.group(1), m.group(2)), _bytes(m.group(3), m.group(4))
        return OutOfMemory("run", requested=requested, free=free, error=first)
    if m := _HOST.search(text):
        return OutOfMemory("run", "host", requested=float(m.group(1)), error=first)
    return OutOfMemory("run", error=first)


def _allocations(text: str) -> tuple[Allocation, ...]:
    """XLA's "Largest program allocations" list: one entry per "N. Size: ..." block."""
    starts = list(_ALLOCATION.finditer(text))
    found = []
    for i, m in enumerate(starts):
        block = text[m.end() : starts[i + 1].start() if i + 1 < len(starts) else len(text)]
        op, file, line, shape = (_first(p, block) for p in (_OP, _FILE, _LINE, _SHAPE))
        size = _bytes(m.group(1), m.group(2))
        found.append(Allocation(size, op, shape.split("{")[0], file, int(line or 0)))
    return tuple(sorted(found, key=lambda a: -a.size))


def _first(pattern: re.Pattern, text: str) -> str:
    found = pattern.search(text)
    return found.group(1) if found else ""
