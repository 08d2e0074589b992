"""Why each graph compiled: torch_xla's compile-cause analysis, parsed into `CompileEvent`s.

With PT_XLA_DEBUG_LEVEL=1 and PT_XLA_DEBUG_FILE set (by `setup()`, before the first compile),
torch_xla appends one "Compilation Analysis" block per graph it compiles (cause, graph hash,
input/output counts, the Python frames that triggered it), then a "Post Compilation Analysis"
block with sizes. `CompileLog` reads only the bytes appended since its last read, so asking
"what compiled since offset N" costs a stat() when nothing did.
"""

from __future__ import annotations

import os
import re
import stat
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

from tpu_nb.runtime.backend import current as backend
from tpu_nb.runtime.backend import normal_hash
from tpu_nb.runtime.environment import _private_files as private_files
from tpu_nb.runtime.frame import Frame
from tpu_nb.runtime.metrics._counters import on_reset
from tpu_nb.runtime.sources import is_library

# The opening words of the blocks read -> their kind (other analysis blocks are skipped).
_KINDS = {"Compilation Analysis: ": "compile", "Post Compilation Analysis: ": "post"}
_RULE = "====="
_FRAME = re.compile(r"^\s+(.*) \((.*):(\d+)\)$")
_SIZE = re.compile(
    r"^(Graph input|Graph output|Aliased Input|Intermediate tensor|"
    r"Compiled program) size: ([0-9.]+) GB"
)

# torch_xla's own words for a cause, and the short kind a report groups them by.
_CAUSE_KINDS = (
    ("access tensor value", "value-access"),  # .item(), print, bool() before a sync
    ("torch_xla.sync", "sync"),
    ("mark_step", "sync"),
    ("dynamo", "dynamo"),
    ("compile", "compile"),
)


@dataclass(frozen=True)
class CompileEvent:
    """One graph torch_xla compiled (not found in its cache), and why."""

    cause: str  # torch_xla's words, e.g. "user torch_xla.sync"
    graph_hash: str
    frames: tuple[Frame, ...]  # innermost first, as torch_xla prints them
    inputs: int | None = None
    outputs: int | None = None
    graph_name: str | None = None  # set by torch_xla.compile(name=...)
    computation_hash: str | None = None
    # input, output, aliased, ...: in what torch_xla calls GB, which are GiB (2**30 bytes)
    sizes_gb: dict[str, float] = field(default_factory=dict)
    offset: int = 0  # byte offset of the block in the log
    # Where it came from, recorded by tpu_nb itself (a provenance.Site: the tracked code's
    # line, the helper and library function in between), when a tracked run saw it; the
    # log's own `frames` stop after 8.
    site: Any = field(default=None, compare=False)
    # Also from the tracked run: what the runtime was doing ("sync", "read", or "fallback":
    # a CPU fallback materialising its inputs), the step (syncs the run had made before it)
    # and how many calls its site had made before it. None/"" outside a tracked run.
    trigger: str = field(default="", compare=False)
    step: int | None = field(default=None, compare=False)
    call: int | None = field(default=None, compare=False)
    # A sync's compile at a line whose shape watch had just compared the tracked code's
    # tensors and found the shapes of the line's previous sync: no batch it names changed.
    same_shapes: bool = field(default=False, compare=False)
    # A sync's compile at a sync that ended one of the run's steps (not a device loader's
    # before its first batch, nor a library's logging inside a step)
    step_end: bool = field(default=False, compare=False)

    @property
    def kind(self) -> str:
        """'sync', 'value-access' (.item()/print before a sync), 'dynamo', 'compile' or 'other'."""
        low = self.cause.lower()
        return next((kind for needle, kind in _CAUSE_KINDS if needle in low), "other")

    @property
    def user_frame(self) -> Frame | None:
        """The innermost frame in the user's code (not the stdlib, an installed package or
        tpu_nb) — the line whose graphs are compared for recompilation; None when the compile
        came from library code alone (e.g. tpu_nb's own end sync, --sync). From the stack tpu_nb
        recorded (`site`) when there is one, else from the log's 8 frames. A finding is
        placed on `site.line`, the tracked code's own line that led here."""
        if self.site is not None:
            return self.site.user or self.site.line
        return next((frame for frame in self.frames if not is_library(frame.file)), None)

    def describe(self) -> str:
        where = self.user_frame
        at = f" at {where.file}:{where.line}" if where else ""
        return f"graph {self.graph_hash[:8]} compiled: {self.cause}{at}"


def describe_difference(before: CompileEvent, after: CompileEvent) -> tuple[str, ...]:
    """What the compile log says differs between two graphs of one line.

    The log has no ops or shapes, only counts and sizes: this says which kind of change it
    is. (A captured graph diff, when available, names the op, shape or dtype.)"""
    lines = []
    if (before.inputs, before.outputs) != (after.inputs, after.outputs):
        lines.append(
            f"graph inputs {before.inputs} -> {after.inputs}, outputs "
            f"{before.outputs} -> {after.outputs}: the traced program changed (a "
            "Python branch, new tensors, or state created on the way)"
        )
    else:
        lines.append(
            f"same number of graph inputs ({after.inputs}) and outputs "
            f"({after.outputs}): a shape, dtype or Python value inside the graph "
            "changed"
        )
    sizes = []
    for key in sorted(set(before.sizes_gb) | set(after.sizes_gb)):
        a, b = before.sizes_gb.get(key), after.sizes_gb.get(key)
        if a != b:
            sizes.append(f"{key} {_gb(a)} -> {_gb(b)}")
    if sizes:
        lines.append("sizes: " + ", ".join(sizes))
    if before.cause != after.cause:
        lines.append(f"cause: {before.cause} -> {after.cause}")
    if before.graph_name != after.graph_name:
        lines.append(f"graph name: {before.graph_name} -> {after.graph_name}")
    return tuple(lines)


def _gb(value: float | None) -> str:
    return "?" if value is None else f"{value:g} GiB"


def parse_block(lines: list[str], offset: int = 0) -> CompileEvent:
    """Turn the body lines of one "Compilation Analysis" block into a CompileEvent."""
    cause, section = "", None
    info: dict[str, str] = {}  # the "Graph Info" section's "name: value" lines
    frames: list[Frame] = []
    for raw in lines:
        body = raw.strip()
        if body == "Compilation Cause":
            section = "cause"
        elif body.startswith("Graph Info"):
            section = "graph"
        elif body.startswith("Python Frame Triggered"):
            section = "frames"
        elif section == "cause" and body:
            cause = f"{cause} {body}".strip()
        elif section == "graph":
            name, colon, value = body.partition(":")
            if colon and value.strip():
                info[name] = value.strip()
        elif section == "frames" and (m := _FRAME.match(raw)):
            frames.append(Frame(file=m.group(2), line=int(m.group(3)), function=m.group(1)))
    n_in, n_out = (info.get(f"Number of Graph {what}") for what in ("Inputs", "Outputs"))
    return CompileEvent(
        cause=cause,
        graph_hash=normal_hash(info.get("Graph Hash", "")),
        frames=tuple(frames),
        inputs=None if n_in is None else int(n_in),
        outputs=None if n_out is None else int(n_out),
        graph_name=info.get("Graph Name"),
        offset=offset,
    )


# A report needs the events of the current cell; a long session compiles thousands of graphs.
MAX_EVENTS = 2_000
_HEAD = 1024  # bytes from the start of the file (its first block) that tell a rewrite
# The last bytes read, compared at the next read: a file rewritten in place (or a new file
# under a reused inode number) with the same first kilobyte differs there.
_SEAM = 4096


class CompileLog:
    """Incremental reader of one PT_XLA_DEBUG_FILE.

    `size()` is the offset to remember before running something; `events_since(offset)`
    returns the events whose block starts at or after it; `problem_since(offset, compiles)`
    says why the causes of that run's compiles are unknown or incomplete, if they are.

    Offsets are logical: when the file is deleted, replaced or truncated (a tmp cleaner, a
    user clearing /tmp) reading restarts at the new file's start under offsets greater than
    any given out before, so a remembered offset never picks up stale or earlier events.
    At most MAX_EVENTS events are kept (`dropped` counts the others).
    """

    def __init__(self, path: str, *, start: int = 0):
        self.path = path
        self.name = private_files.log_name(path)  # the file's name when path is /proc/.../fd/N
        self._held = private_files.held_fd(path)  # its descriptor then: fstat, no /proc lookup
        # Bytes of the current file parsed into events. A reader that wants only what comes
        # next (the live dashboard) starts at the file's current size: a block boundary
        # unless a compile is being logged at that very moment.
        self._consumed = start
        self._base = 0  # logical offset of the current file's first byte
        self._end = start  # logical end of the file when last seen
        self._physical = start  # its size then
        self._identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the file
        self._head = b""  # its first bytes, once read
        self._seam = b""  # the last bytes read before self._consumed
        self._events: deque[CompileEvent] = deque(maxlen=MAX_EVENTS)
        self.parsed = 0  # events ever parsed, dropped ones included
        self.breaks: deque[int] = deque(maxlen=64)  # logical offsets where a new file began
        self.cut_blocks = 0  # blocks left unfinished (a write failed mid-block)
        self._dropped_below = -1  # offsets at or below this were dropped

    @classmethod
    def following(cls, other: CompileLog) -> CompileLog:
        """A reader of the same file that starts where `other` is now (same offsets)."""
        other.size()
        log = cls(other.path, start=other._physical)
        log._base, log._end, log._identity = other._base, other._end, other._identity
        return log

    @property
    def dropped(self) -> int:
        return self.parsed - len(self._events)

    def size(self) -> int:
        try:
            held = self._held
            info: os.stat_result | None = os.stat(self.path) if held is None else os.fstat(held)
        except OSError:
            info = self._recreate()
        if info is None:
            return self._end
        self._follow(info)
        self._physical = info.st_size
        self._end = self._base + info.st_size
        return self._end

    def events_since(self, offset: int) -> list[CompileEvent]:
        self.size()
        if self._physical > self._consumed:
            self._read_new()
        return [e for e in self._events if e.offset >= offset]

    def events_from(self, count: int) -> list[CompileEvent]:
        """Events after the first `count` ever parsed (those still kept)."""
        self.events_since(0)
        return list(self._events)[max(0, count - self.dropped) :]

    def problem_since(self, offset: int, compiles: int) -> str | None:
        """Why the causes of `compiles` compiles since `offset` are unknown or incomplete;
        None when the log holds them all."""
        if compiles <= 0:
            return None
        logged = len(self.events_since(offset))
        if any(b > offset for b in self.breaks):
            return (
                f"the compile log {self.name} was deleted, replaced or truncated during "
                "this run, so the causes of its compiles are unknown"
            )
        missing = compiles - logged
        if missing <= 0:
            return None
        if offset <= self._dropped_below:
            return (
                f"only the causes of the last {MAX_EVENTS} compiles are kept; "
                f"{missing} of this run's are not"
            )
        return (
            f"torch_xla compiled {compiles} graph{'s' if compiles != 1 else ''} but the "
            f"compile log {self.name} holds the causes of {logged}: "
            f"{_why_missing(self.name, missing)}"
        )

    def forget(self) -> None:
        """Drop the events read so far (`reset_metrics()`); later ones are read as usual."""
        self.events_since(0)
        if self._events:
            self._dropped_below = max(self._dropped_below, self._events[-1].offset)
        self._events.clear()
        self.breaks.clear()

    def _follow(self, info: os.stat_result) -> None:
        identity = (info.st_dev, info.st_ino)
        if self._identity is None:
            self._identity = identity
        elif identity != self._identity or info.st_size < self._physical:
            self._restart(identity)

    def _restart(self, identity: tuple[int, int]) -> None:
        """A new file (or the old one cut short): read it from its start, under offsets
        beyond every one given out so far; what the old file still held is lost."""
        self._base = self._end + 1
        self._end = self._base
        self._consumed = self._physical = 0
        self._identity, self._head, self._seam = identity, b"", b""
        self.breaks.append(self._base)

    def _recreate(self) -> os.stat_result | None:
        """The file is gone: make our private one again (before torch_xla recreates it with
        default permissions, or cannot because its directory went too)."""
        if not private_files.ensure_log(self.path):
            return None
        try:
            return os.stat(self.path)
        except OSError:
            return None

    def _read_new(self) -> None:
        try:
            with open(self.path, "rb") as f:
                info = os.fstat(f.fileno())
                self._follow(info)
                head = os.pread(f.fileno(), _HEAD, 0)
                seam = os.pread(f.fileno(), len(self._seam), self._consumed - len(self._seam))
                if (self._head and not head.startswith(self._head)) or seam != self._seam:
                    self._restart((info.st_dev, info.st_ino))  # rewritten: not what we read
                if len(head) > len(self._head):
                    self._head = head
                f.seek(self._consumed)
                data = f.read()
        except OSError:
            return
        done = self._parse(data)
        if done:
            self._seam = (self._seam + data[:done])[-_SEAM:]

    def _parse(self, data: bytes) -> int:
        """Parse the whole blocks in `data`; returns how many bytes were consumed."""
        base, pos, done = self._base + self._consumed, 0, 0
        block: list[str] | None = None  # body lines of the block being read
        opened_by, block_start = "", 0  # the block's opening words and offset
        for line in data.splitlines(keepends=True):
            start, pos = pos, pos + len(line)
            if not line.endswith(b"\n"):
                break  # a line still being written: read it next time
            text = line.decode("utf-8", errors="replace").rstrip("\r\n")
            cut = text.find("Analysis: ")
            if cut < 0:  # text between blocks
                if block is None:
                    if text.startswith("Computation hash:") and self._events:
                        self._set_last(computation_hash=text.split(":", 1)[1].strip())
                    done = pos
                continue
            prefix, body = text[: cut + len("Analysis: ")], text[cut + len("Analysis: ") :]
            if block is None:
                if body.startswith(_RULE):  # the opening rule
                    block, opened_by, block_start = [], prefix, start
                else:
                    done = pos
            elif body.startswith(_RULE) and _cut_short(opened_by, prefix, block):
                # An opening rule where the closing one belongs: the block before it was cut
                # short (a write failed part-way, e.g. on a full disk). Start again here.
                self.cut_blocks += 1
                block, opened_by, block_start = [], prefix, start
            elif body.startswith(_RULE):  # the closing rule: the block is complete
                self._finish(_KINDS.get(opened_by, ""), block, base + block_start)
                block, done = None, pos
            else:
                block.append(body)
        # Only whole blocks are consumed; a block still being written is read again next time.
        self._consumed += done
        return done

    def _finish(self, kind: str, body: list[str], offset: int) -> None:
        if kind == "compile":
            if len(self._events) == self._events.maxlen:
                self._dropped_below = self._events[0].offset
            self._events.append(parse_block(body, offset))
            self.parsed += 1
        elif kind == "post" and self._events:
            found = (_SIZE.match(line.strip()) for line in body)
            self._set_last(sizes_gb={m.group(1).lower(): float(m.group(2)) for m in found if m})

    def _set_last(self, **changes) -> None:
        self._events[-1] = replace(self._events[-1], **changes)


def _cut_short(opened_by: str, prefix: str, block: list[str]) -> bool:
    """Whether a rule line inside a block opens a new block instead of closing this one
    (compile and post blocks end with a dashed line before their closing rule)."""
    if prefix != opened_by:
        return True
    return opened_by in _KINDS and not (block and block[-1].startswith("-----"))


def _why_missing(path: str, missing: int) -> str:
    """Why compiles have no cause in the log: the disk or the file, when they say so; else the
    log is intact and torch_xla wrote none for them."""
    try:
        fs = os.statvfs(os.path.dirname(path) or ".")
        if fs.f_bavail * fs.f_frsize < 64 * 1024:
            return "its disk is full"
    except OSError:
        return "its directory is gone"
    try:
        regular = stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return "the file was removed"
    if not regular:  # a device or a pipe: whether writes reach it is not known
        return "writing to it failed, or torch_xla wrote no cause for them"
    return (
        f"the log is intact and torch_xla wrote no cause for {missing} of them (a compile it "
        "starts outside Python code, such as a CPU fallback's inputs inside autograd's "
        "backward, can come without one)"
    )


_logs: dict[str, CompileLog] = {}


@on_reset
def _forget_events() -> None:
    for log in _logs.values():
        log.forget()


def compile_log() -> CompileLog | None:
    """The reader of this process's compile-cause file, or None when analysis is off."""
    path = backend().process.compile_log_path()
    if path is None:
        return None
    log = _logs.get(path)
    if log is None:
        log = _logs[path] = CompileLog(path)
    return log
