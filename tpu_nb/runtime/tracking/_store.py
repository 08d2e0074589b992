"""The graph store: what the process learned about its graphs, across tracked runs.

One bounded store (`store`), the only history tracking keeps between runs: a line's graph in
a later cell is compared with the one it compiled before, a graph captured once is not read
again, and a graph's cost is computed once per new graph. Everything else a run records
lives in its `Run` and goes with it. `reset_metrics()` empties the store with the runtime's
counters. Every table keeps its most recently used entries.
"""

from __future__ import annotations

from collections import OrderedDict
from operator import attrgetter
from typing import Any

from tpu_nb.runtime.metrics._compile_log import CompileEvent
from tpu_nb.runtime.metrics._counters import on_reset


def add_graph(lines: dict, key, event, identity=attrgetter("graph_hash")) -> bool:
    """Add `event` (a compile event or graph record) to `lines[key]`, the distinct graphs of
    one line, unless one there has the same graph (by `identity`): True when it was new."""
    graphs = lines.setdefault(key, [])
    if all(identity(event) != identity(g) for g in graphs):
        graphs.append(event)
        return True
    return False


def _keep(table: OrderedDict, key, value, limit: int) -> None:
    table[key] = value
    table.move_to_end(key)
    while len(table) > limit:
        table.popitem(last=False)


class GraphStore:
    """Graphs by the process's lines and hashes (bounded; see the module docstring)."""

    def __init__(self) -> None:
        # compile log's graph hash -> the pending graph captured just before it compiled
        self.captured: OrderedDict[str, Any] = OrderedDict()
        # torch_xla's hash of a captured tensors' graph -> that Graph: the same pending graph
        # is read once (reading the IR text of a GPT-2 step costs ~0.5 s; its hash ~2 ms)
        self.by_own_hash: OrderedDict[str, Any] = OrderedDict()
        # (file, line) -> the graphs captured at its syncs (a few, the latest)
        self.line_captures: OrderedDict[tuple[str, int], list] = OrderedDict()
        # (file, line) -> the compile event of each distinct graph the line compiled, in
        # order (the first two and the latest)
        self.line_events: OrderedDict[tuple[str, int], list[CompileEvent]] = OrderedDict()
        # torch_xla.compile'd function -> its inputs at the call that last compiled its graph
        self.inputs_at_compile: OrderedDict[tuple, tuple] = OrderedDict()
        # torch_xla's hash of a captured graph -> its cost (tracking._cost.GraphCost)
        self.costs: OrderedDict[str, Any] = OrderedDict()
        # compile log's graph hash -> what Dynamo said changed before it compiled it
        self.dynamo_changes: OrderedDict[str, tuple[str, ...]] = OrderedDict()

    def clear(self) -> None:
        for table in vars(self).values():
            table.clear()

    # -- captures ---------------------------------------------------------------------------

    def keep_capture(self, graph_hash: str, graph) -> None:
        _keep(self.captured, graph_hash, graph, 48)

    def keep_own(self, own_hash: str, graph) -> None:
        _keep(self.by_own_hash, own_hash, graph, 48)

    def note_line_capture(self, key: tuple[str, int], graph) -> None:
        """A capture at `key`'s sync. The table is ordered by change, for last_change: a
        line moves to its end when it is new or captures a graph unlike those it kept, not
        when it captures its same graph again or nothing."""
        kept = self.line_captures.get(key)
        new = graph is not None and not any(g.hash == graph.hash for g in kept or ())
        if kept is None or new:
            kept = kept if kept is not None else []
            if new:
                kept.append(graph)
                del kept[:-4]
            _keep(self.line_captures, key, kept, 64)

    def last_change(self):
        """The line that most recently captured a graph unlike its previous one:
        ((file, line), earlier graph, later graph); None when no line has two."""
        for key in reversed(self.line_captures):
            kept = self.line_captures[key]
            if len(kept) >= 2:
                return key, kept[-2], kept[-1]
        return None

    def captured_graph(self, event: CompileEvent):
        """The pending graph captured just before `event`'s graph compiled, if captured."""
        return self.captured.get(event.graph_hash)

    # -- a line's graphs over the process ---------------------------------------------------

    def note_compiles(self, events) -> dict[tuple[str, int], tuple[str, ...]]:
        """Keep the graphs of `events` by line; return the lines with more than one graph
        (in this run or before), with their hashes."""
        out = {}
        for event in events:
            key = _history_key(event)
            if key is None or not event.graph_hash:
                continue
            new = add_graph(self.line_events, key, event)
            graphs = self.line_events[key]
            if new and len(graphs) > 32:  # keep the first two and the latest
                del graphs[2]
            _keep(self.line_events, key, graphs, 256)
            if len(graphs) > 1:
                out[key] = tuple(g.graph_hash for g in graphs)
        return out

    def earlier_graph(self, event: CompileEvent) -> CompileEvent | None:
        """The compile event of the graph the same line compiled before `event`'s, if any."""
        key = _history_key(event)
        graphs = self.line_events.get(key, []) if key else []
        at = next((i for i, g in enumerate(graphs) if g.graph_hash == event.graph_hash), 0)
        return graphs[at - 1] if at > 0 else None

    def swap_inputs(self, key: tuple, inputs: tuple) -> tuple | None:
        """Keep a compiled function's inputs; return those kept before, if any."""
        before = self.inputs_at_compile.get(key)
        _keep(self.inputs_at_compile, key, inputs, 64)
        return before

    def keep_cost(self, own_hash: str, graph_cost) -> None:
        _keep(self.costs, own_hash, graph_cost, 512)

    def keep_dynamo_change(self, graph_hash: str, facts: tuple[str, ...]) -> None:
        _keep(self.dynamo_changes, graph_hash, facts, 512)


def _history_key(event: CompileEvent) -> tuple[str, int] | None:
    """The code whose graphs are compared with each other, in a run and across runs: the
    library function or helper that synced, read or compiled (a Trainer's data loader, the
    mask check of a transformers model), else the tracked code's line; never the cell line
    alone when a library did it, so a loader's step graph is not compared with the mask
    check's graph."""
    site = event.site
    frame = site.library if site is not None and site.library is not None else event.user_frame
    return (frame.file, frame.line) if frame is not None else None


store = GraphStore()
on_reset(store.clear)
