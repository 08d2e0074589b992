"""What a launch on the hosts of a TPU pod slice returns and raises, and what it judges from
every host's facts: the host that compiled a different graph at a line than the others (and
what differs), the host that stopped syncing, the straggler."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from tpu_nb.runtime.metrics import MetricsDelta
from tpu_nb.runtime.parallel._results import ReplicaCrash, ReplicaError, quantile
from tpu_nb.runtime.tracking import graph_facts
from tpu_nb.runtime.tracking._store import add_graph
from tpu_nb.runtime.units import format_seconds

# A host is the straggler when its median step is this much slower than the other hosts'
# median (and each host ran at least MIN_STEPS steps): below it, load noise on a shared
# machine is enough to reorder hosts.
STRAGGLER_RATIO = 1.25
MIN_STEPS = 3


class HostError(ReplicaError):
    """A host raised; `traceback` is its traceback (the cell's lines), `host` which host."""

    unit = "host"
    host = property(lambda self: self.ordinal)
    hosts = property(lambda self: self.world)


class HostLost(ReplicaCrash):
    """A host's process died or stopped answering: `where` names the host, `stack` is what
    Ray said."""

    def __init__(self, host: int, reason: str, stack: str = ""):
        self.host = host
        message = (
            f"host {host}'s process {reason}; the other hosts were stopped. Fix: run the "
            "cell again; if it happens again, Ray's report is in this error's .stack "
            "attribute (and the host's log under /tmp/ray/session_latest/logs)."
        )
        super().__init__(reason, f"host {host}", stack, message=message)


@dataclass(frozen=True)
class GraphRecord:
    """One graph a host compiled: the cell line that compiled it (0: not a line of the
    cell), torch_xla's hash, the compile log's input/output counts, and the pending graph
    tpu_nb captured just before it (a runtime Graph) when it did."""

    line: int
    graph_hash: str
    inputs: int | None = None
    outputs: int | None = None
    graph: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class HostResult:
    """What one host did."""

    host: int  # its index in the slice (the TPU worker id where Ray knows it)
    node: str = ""  # Ray's node id
    address: str = ""  # the node's IP address
    pid: int = 0
    value: Any = None  # fn's return value (None when it could not be sent back)
    value_error: str = ""
    wall_seconds: float = 0.0
    started_seconds: float = 0.0  # from the launch's start to this host running the cell
    step_seconds: tuple[float, ...] = ()  # time between its syncs
    syncs: int = 0
    metrics: MetricsDelta | None = None
    verdict: str = ""  # the step anatomy's verdict ("" when it had too few steps)
    verdict_kind: str = ""
    graphs: tuple[GraphRecord, ...] = ()
    compile_analysis: bool = False  # False: the host's compile causes (and hashes) unknown

    @property
    def step_median(self) -> float | None:
        return quantile(self.step_seconds, 0.5)

    @property
    def step_p90(self) -> float | None:
        return quantile(self.step_seconds, 0.9)


@dataclass(frozen=True)
class Divergence:
    """Hosts that did not do what the others did: `kind` is "graph" (a different graph at
    `line`, `changed` says what differs from the others' graph) or "syncs" (fewer or more
    syncs than the others)."""

    kind: str
    hosts: tuple[int, ...]
    others: tuple[int, ...]
    line: int = 0
    what: str = ""
    changed: tuple[str, ...] = ()

    def __str__(self) -> str:
        return self.what + (": " + "; ".join(self.changed) if self.changed else "")


@dataclass(frozen=True, repr=False)
class PodResult:
    """Every host of one launch on a slice, and what tpu_nb judged from them."""

    hosts: tuple[HostResult, ...]
    wall_seconds: float
    started_seconds: float  # from the launch's start to every host running the cell
    slice: str  # e.g. "v4-16 (2 hosts)"
    reserved_seconds: float = 0.0  # of started_seconds: until the slice was reserved
    ready_seconds: float = 0.0  # until every host's process had set up its runtime
    source: str = ""  # the cell's source (its lines name divergences)
    divergences: tuple[Divergence, ...] = ()
    straggler: int | None = None
    straggler_reason: str = ""
    notes: tuple[str, ...] = ()

    @property
    def values(self) -> list:
        return [h.value for h in self.hosts]

    def verdicts(self) -> list[tuple[str, str]]:
        """Each kind of step-anatomy verdict the hosts reached: (the hosts in words, the
        verdict of the first of them, with its figures)."""
        by_kind: dict[str, list[HostResult]] = {}
        for h in self.hosts:
            if h.verdict:
                by_kind.setdefault(h.verdict_kind, []).append(h)
        out = []
        for members in by_kind.values():
            words = host_list([h.host for h in members])
            if len(members) > 1:
                words += f"; figures of host {members[0].host}"
            out.append((words, members[0].verdict))
        return out

    def summary(self) -> str:
        n = len(self.hosts)
        compiles = sum(h.metrics.compiles for h in self.hosts if h.metrics is not None)
        return (
            f"{n} host{'s' if n != 1 else ''} of {self.slice}: {format_seconds(self.wall_seconds)} "
            f"({format_seconds(self.started_seconds)} until every host ran the cell), {compiles} "
            f"compiled in all; {self.straggler_reason}"
        )

    def __repr__(self) -> str:
        return f"<PodResult: {self.summary()}>"

    def __str__(self) -> str:
        lines = [self.summary()]
        lines += [f"  DIVERGED: {d}" for d in self.divergences]
        lines += [f"  {note}" for note in self.notes]
        return "\n".join(lines)


def host_list(hosts) -> str:
    """Host indices as words: "host 3", "hosts 0–2", "hosts 0, 2 and 5"."""
    hosts = sorted(hosts)
    if len(hosts) == 1:
        return f"host {hosts[0]}"
    if hosts == list(range(hosts[0], hosts[-1] + 1)) and len(hosts) > 2:
        return f"hosts {hosts[0]}\u2013{hosts[-1]}"
    return "hosts " + ", ".join(str(h) for h in hosts[:-1]) + f" and {hosts[-1]}"


# -- judging the hosts together ----------------------------------------------------------------


def graph_divergences(hosts: tuple[HostResult, ...], *, live: bool = False) -> list[Divergence]:
    """Per cell line, the n-th distinct graph each host compiled there, compared across
    hosts: a host whose graph differs from the most hosts' (ties: host 0's side) is named,
    with what differs. Only the first difference of a line is reported (the rest follow
    from it). Hosts without compile analysis are left out: their hashes are unknown.
    live: while the hosts run, a host that has not compiled the n-th graph yet may still get
    there, so only graphs every host has compiled are compared."""
    known = [h for h in hosts if h.compile_analysis]
    by_line: dict[int, dict[int, list[GraphRecord]]] = {}
    for h in known:
        for g in h.graphs:
            if g.line > 0:
                add_graph(by_line.setdefault(g.line, {}), h.host, g)
    out = []
    for line in sorted(by_line):
        per_host = {h.host: by_line[line].get(h.host, []) for h in known}
        longest = max(len(graphs) for graphs in per_host.values())
        for i in range(longest):
            groups: dict[str, list[int]] = {}
            for host, graphs in per_host.items():
                groups.setdefault(graphs[i].graph_hash if i < len(graphs) else "", []).append(host)
            if len(groups) < 2 or (live and "" in groups):
                continue
            majority = max(groups, key=lambda k: (len(groups[k]), -min(groups[k])))
            for key, members in sorted(groups.items(), key=lambda kv: min(kv[1])):
                if key == majority:
                    continue
                out.append(_graph_divergence(line, i, key, members, majority, groups, per_host))
            break
    return out


def _graph_divergence(line, i, key, members, majority, groups, per_host) -> Divergence:
    others = tuple(sorted(groups[majority]))
    ordinal = "" if i == 0 else f"its graph #{i + 1} "
    if not key:
        what = (
            f"{host_list(members)} compiled no graph #{i + 1} at line {line}, "
            f"{host_list(others)} did ({majority[:8]})"
        )
        return Divergence("graph", tuple(sorted(members)), others, line, what)
    theirs = "compiled no graph there" if not majority else f"compiled {majority[:8]}"
    what = (
        f"{host_list(members)} compiled a different graph {ordinal}at line {line} "
        f"({key[:8]}) than {host_list(others)}, which {theirs}"
    )
    mine = per_host[members[0]][i]
    reference = per_host[others[0]][i] if majority else None
    return Divergence(
        "graph", tuple(sorted(members)), others, line, what, _what_differs(reference, mine)
    )


def _what_differs(reference: GraphRecord | None, mine: GraphRecord) -> tuple[str, ...]:
    """The same facts as a recompile finding: from the two captured graphs (the op, shape or
    dtype where they start to differ), else from the compile log's counts."""
    if reference is None:
        return ()
    if reference.graph is not None and mine.graph is not None:
        facts = graph_facts(reference.graph, mine.graph)
        if facts:
            return tuple(
                f.replace("earlier graph", "others' graph").replace(
                    "later graph", "this host's graph"
                )
                for f in facts
            )
    counts: list[str] = []
    if (reference.inputs, reference.outputs) != (mine.inputs, mine.outputs):
        counts.append(
            f"graph inputs {reference.inputs} \u2192 {mine.inputs}, outputs "
            f"{reference.outputs} \u2192 {mine.outputs}"
        )
    counts.append("tpu_nb did not capture both graphs, so it cannot name the op")
    return tuple(counts)


def sync_divergences(hosts: tuple[HostResult, ...]) -> list[Divergence]:
    """Hosts that synced a different number of times than most hosts: in a slice, every
    step's collectives need every host, so the others would wait for the missing steps."""
    counts = Counter(h.syncs for h in hosts)
    if len(counts) < 2:
        return []
    common = max(counts, key=lambda c: (counts[c], c))
    others = tuple(h.host for h in hosts if h.syncs == common)
    out = []
    for count in sorted(c for c in counts if c != common):
        members = tuple(h.host for h in hosts if h.syncs == count)
        what = (
            f"{host_list(members)} synced {count} time{'s' if count != 1 else ''}, "
            f"{host_list(others)} {common}: in a slice, the collectives of the steps one "
            "host does not run make the others wait for it"
        )
        out.append(Divergence("syncs", members, others, 0, what))
    return out


def find_straggler(hosts: tuple[HostResult, ...]) -> tuple[int | None, str]:
    """The host whose median step is STRAGGLER_RATIO slower than the others' median, with
    the figures; (None, why none) otherwise."""
    if len(hosts) < 2:
        return None, "one host: no straggler to compare"
    if any(len(h.step_seconds) < MIN_STEPS for h in hosts):
        return None, f"too few steps (syncs) to compare hosts (fewer than {MIN_STEPS})"
    medians = {h.host: h.step_median or 0.0 for h in hosts}
    slowest = max(medians, key=lambda k: medians[k])
    typical = quantile([v for k, v in medians.items() if k != slowest], 0.5) or 0.0
    if typical <= 0 or medians[slowest] < STRAGGLER_RATIO * typical:
        return None, (
            f"no straggler: median steps within {STRAGGLER_RATIO - 1:.0%} of each other "
            f"({format_seconds(min(medians.values()))}\u2013"
            f"{format_seconds(max(medians.values()))})"
        )
    return slowest, (
        f"straggler: host {slowest}, median step {format_seconds(medians[slowest])} vs "
        f"{format_seconds(typical)} on the other hosts ({medians[slowest] / typical:.1f}\u00d7)"
    )
