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
from dataclasses import dataclass, field, replace
from typing import Any

from tpu_nb.runtime.sources import is_library

_COMPILE = "Compilation Analysis: "
_POST = "Post Compilation Analysis: "
_RULE = "====="
_FRAME = re.compile(r"^\s+(.*) \((.*):(\d+)\)$")
_SIZE = re.compile(r"^(Graph input|Graph output|Aliased Input|Intermediate tensor|"
                   r"Compiled program) size: ([0-9.]+) GB")

# torch_xla's own words for a cause, and the short kind a report groups them by.
_CAUSE_KINDS = (
    ("access tensor value", "value-access"),   # .item(), print, bool() before a sync
    ("torch_xla.sync", "sync"),
    ("mark_step", "sync"),
    ("dynamo", "dynamo"),
    ("compile", "compile"),
)


@dataclass(frozen=True)
class Frame:
    """One Python frame: where in the user's code (or a library) something happened."""

    file: str
    line: int
    function: str

    def __str__(self) -> str:
        return f"{self.function} ({self.file}:{self.line})"


@dataclass(frozen=True)
class CompileEvent:
    """One graph torch_xla compiled (not found in its cache), and why."""

    cause: str                      # torch_xla's words, e.g. "user torch_xla.sync"
    graph_hash: str
    frames: tuple[Frame, ...]       # innermost first, as torch_xla prints them
    inputs: int | None = None
    outputs: int | None = None
    graph_name: str | None = None   # set by torch_xla.compile(name=...)
    computation_hash: str | None = None
    sizes_gb: dict[str, float] = field(default_factory=dict)  # input, output, aliased, ...
    offset: int = 0                 # byte offset of the block in the log
    # Where it came from, recorded by tpu_nb itself (a provenance.Site: the tracked code's
    # line, the helper and library function in between), when a tracked run saw it; the
    # log's own `frames` stop after 8.
    site: Any = field(default=None, compare=False)

    @property
    def kind(self) -> str:
        """'sync', 'value-access' (.item()/print before a sync), 'dynamo', 'compile' or 'other'."""
        low = self.cause.lower()
        for needle, kind in _CAUSE_KINDS:
            if needle in low:
                return kind
        return "other"

    @property
    def user_frame(self) -> Frame | None:
        """The innermost frame in the user's code (not the stdlib, an installed package or
        tpu_nb) — the line whose graphs are compared for recompilation; None when the compile
        came from library code alone (e.g. tpu_nb's own final sync). From the stack tpu_nb
        recorded (`site`) when there is one, else from the log's 8 frames. A finding is
        placed on `site.line`, the tracked code's own line that led here."""
        if self.site is not None:
            return self.site.user or self.site.line
        for frame in self.frames:
            if not _is_library(frame.file):
                return frame
        return None

    def describe(self) -> str:
        where = self.user_frame
        at = f" at {where.file}:{where.line}" if where else ""
        return f"graph {self.graph_hash[:8]} compiled: {self.cause}{at}"


def _is_library(path: str) -> bool:
    # Kept for the modules that import it; the decision lives in sources.py.
    return is_library(path)


def _field(line: str, name: str) -> str | None:
    body = line.strip()
    if body.startswith(name + ":"):
        return body[len(name) + 1:].strip()
    return None


def parse_block(lines: list[str], offset: int = 0) -> CompileEvent:
    """Turn the body lines of one "Compilation Analysis" block into a CompileEvent."""
    cause, graph_hash, graph_name, n_in, n_out = "", "", None, None, None
    frames: list[Frame] = []
    section = None
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
            graph_hash = _field(raw, "Graph Hash") or graph_hash
            graph_name = _field(raw, "Graph Name") or graph_name
            if (v := _field(raw, "Number of Graph Inputs")) is not None:
                n_in = int(v)
            if (v := _field(raw, "Number of Graph Outputs")) is not None:
                n_out = int(v)
        elif section == "frames" and (m := _FRAME.match(raw)):
            frames.append(Frame(file=m.group(2), line=int(m.group(3)), function=m.group(1)))
    return CompileEvent(cause=cause, graph_hash=graph_hash, frames=tuple(frames), inputs=n_in,
                        outputs=n_out, graph_name=graph_name, offset=offset)


class CompileLog:
    """Incremental reader of one PT_XLA_DEBUG_FILE.

    `events_since(offset)` returns the events whose block starts at or after `offset`;
    `size()` is the offset to remember before running something.
    """

    def __init__(self, path: str, *, start: int = 0):
        self.path = path
        # Bytes parsed into events so far. A reader that wants only what comes next (the live
        # dashboard) starts at the file's current size: a block boundary unless a compile is
        # being logged at that very moment.
        self._consumed = start
        self._events: list[CompileEvent] = []

    def size(self) -> int:
        try:
            return os.stat(self.path).st_size
        except OSError:
            return 0

    def events_since(self, offset: int) -> list[CompileEvent]:
        if self.size() > self._consumed:
            self._read_new()
        return [e for e in self._events if e.offset >= offset]

    def _read_new(self) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._consumed)
                data = f.read()
        except OSError:
            return
        base, pos, done = self._consumed, 0, 0
        block: list[str] | None = None      # body lines of the block being read
        kind, block_start = "", 0
        for line in data.splitlines(keepends=True):
            start, pos = pos, pos + len(line)
            if not line.endswith(b"\n"):
                break                        # a line still being written: read it next time
            text = line.decode("utf-8", errors="replace").rstrip("\r\n")
            cut = text.find("Analysis: ")
            if cut < 0:                      # text between blocks
                if block is None:
                    if text.startswith("Computation hash:") and self._events:
                        self._set_last(computation_hash=text.split(":", 1)[1].strip())
                    done = pos
                continue
            prefix, body = text[:cut + len("Analysis: ")], text[cut + len("Analysis: "):]
            if block is None:
                if body.startswith(_RULE):   # the opening rule
                    block, kind, block_start = [], _kind_of(prefix), start
                else:
                    done = pos
            elif body.startswith(_RULE):     # the closing rule: the block is complete
                self._finish(kind, block, base + block_start)
                block, done = None, pos
            else:
                block.append(body)
        # Only whole blocks are consumed; a block still being written is read again next time.
        self._consumed = base + done

    def _finish(self, kind: str, body: list[str], offset: int) -> None:
        if kind == "compile":
            self._events.append(parse_block(body, offset))
        elif kind == "post" and self._events:
            sizes = {}
            for line in body:
                if m := _SIZE.match(line.strip()):
                    sizes[m.group(1).lower()] = float(m.group(2))
            self._set_last(sizes_gb=sizes)

    def _set_last(self, **changes) -> None:
        self._events[-1] = replace(self._events[-1], **changes)


def _kind_of(prefix: str) -> str:
    if prefix == _COMPILE:
        return "compile"
    if prefix == _POST:
        return "post"
    return "other"


_logs: dict[str, CompileLog] = {}


def compile_log() -> CompileLog | None:
    """The reader of this process's compile-cause file, or None when analysis is off."""
    path = os.environ.get("PT_XLA_DEBUG_FILE")
    log = _logs.get(path)
    if log is None and path:
        if os.environ.get("PT_XLA_DEBUG_LEVEL", "0").strip() in ("", "0"):
            return None
        log = _logs[path] = CompileLog(path)
    return log
