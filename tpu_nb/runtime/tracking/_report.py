"""`RunReport`: what one tracked run did on XLA, and `LineFinding`: what one line of it did."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

from tpu_nb.runtime.metrics._compile_log import CompileEvent
from tpu_nb.runtime.metrics._counters import MetricsDelta
from tpu_nb.runtime.tracking import _dynamo as dynamo
from tpu_nb.runtime.tracking._anatomy import Anatomy
from tpu_nb.runtime.tracking._cost import StepCost
from tpu_nb.runtime.tracking._dynamo import DynamoCompile
from tpu_nb.runtime.tracking._fused import FusedOptimizer
from tpu_nb.runtime.tracking._oom import OutOfMemory
from tpu_nb.runtime.tracking._pending import EarlierWork, PendingWork
from tpu_nb.runtime.tracking._policy import Judgement, describe_pattern
from tpu_nb.runtime.tracking._provenance import Occurrence
from tpu_nb.runtime.units import format_seconds

FindingKind = Literal[
    "compile",
    "warm-up",
    "state",
    "variant",
    "earlier",
    "recompile",
    "growing",
    "fallback",
    "host-read",
    "pending",
    "inputs",
    "device-data",
]
# When a finding happened: during the run (in time order), not placed on a moment (totals
# tpu_nb could not place on a line), or left at the end (work left pending).
Phase = Literal["run", "unplaced", "left"]
_PHASES: dict[str, int] = {"run": 0, "unplaced": 1, "left": 2}


@dataclass(frozen=True)
class LineFinding:
    """Something a line did, with what to do about it."""

    line: int  # 1-based line in the source; 0 when not on a line of it
    kind: FindingKind
    what: str  # in plain words: "aten::histc ran on the CPU", "a graph compiled at ..."
    hint: str = ""  # what to do; findings of one kind on one topic share the same text
    place: str = ""  # where, when not a line: "end of cell" (--sync, work left pending)
    count: int = 1  # how many times it happened (host reads, fallbacks, graphs)
    via: str = ""  # the library function between the line and the event, e.g.
    # "torch/optim/adamw.py:480 _single_tensor_adamw"
    seconds: float | None = None  # time it cost where known (a compile's compile time)
    order: int = 0  # when it happened within its phase (compiles, then reads and fallbacks)
    changed: tuple[str, ...] = ()  # recompiles: what differs from the line's earlier graph
    pattern: str = ""  # compiles: the line's compiles over the run, in one sentence
    progression: str = ""  # compiles: one dimension changing across the line's graphs
    phase: Phase = "run"
    # for the curious, never in the sentence: the graph's hash and torch_xla's own words for
    # why it compiled ("graph 3a4b5c6d: user torch_xla.sync")
    detail: str = ""

    @property
    def sort_key(self) -> tuple[int, int, int]:
        """Findings sort by it: the run's in time order, then the unplaced, then what was left."""
        return (_PHASES[self.phase], self.order, self.line)


def _empty() -> Mapping:
    return MappingProxyType({})


@dataclass(frozen=True)
class RunReport:
    """What a tracked run did on XLA: frozen (tuples and read-only mappings).

    Built in one direction when the `track()` block exits, also on error: the run's facts
    (metrics, compile events, recordings, steps), the policy's judgement of them, and the
    findings placed on the tracked code's lines. The report `track()` yields is empty
    (`complete` False) until then; a live view follows the run through `current_run()`."""

    name: str | None = None
    wall_seconds: float = 0.0  # includes the device wait (and tpu_nb's sync, if asked for)
    metrics: MetricsDelta = field(default_factory=MetricsDelta)
    compile_events: tuple[CompileEvent, ...] = ()
    error: BaseException | None = None
    waited: bool = False  # device ops waited for: execute_seconds is complete
    # tpu_nb ran a sync of its own at the end (track(sync=True), %%on_tpu --sync), and it
    # had work to run; its compiles and executions are counted in this report.
    synced_at_end: bool = False
    # Work left pending at the end (not run, not counted here: the next sync or value read
    # runs it and is charged with it); None when nothing was left (see _pending.py).
    pending: PendingWork | None = None
    # Work earlier code left pending, found as the run started: the run's first sync runs it
    # with the run's own first step (see _pending.py: EarlierWork).
    earlier: EarlierWork | None = None
    compile_analysis: bool = False  # False: compile causes unknown (setup() not called)
    # Lines that compiled more than one distinct graph (in this run or before): graph hashes.
    recompilations: Mapping[tuple[str, int], tuple[str, ...]] = field(default_factory=_empty)
    # Value reads and CPU fallbacks, each placed on the line that led to it (with the library
    # function in between), aggregated per line, in time order.
    occurrences: tuple[Occurrence, ...] = ()
    capture_seconds: float = 0.0  # spent capturing pending graphs (recompile diffs)
    captures: int = 0  # pending graphs looked for (at syncs and reads), found or not
    record_errors: int = 0  # recording hooks that failed (logged by "tpu_nb")
    # Why some compile causes of this run are unknown (the compile log was deleted, replaced,
    # truncated or could not be written), or "" when the log holds them all.
    compile_log_problem: str = ""
    # The findings placed on the tracked code's lines (when its source is known: on_tpu(),
    # %%on_tpu), that source and the graphs a line may compile (--max-graphs), so the report
    # shows the same whether displayed by the magic or returned by -o.
    findings: tuple[LineFinding, ...] = ()
    source: str = ""
    allowed_graphs: int = 1
    complete: bool = False
    # Where each step's time went (tpu_nb.runtime.tracking._anatomy), with the policy's
    # verdict of the steady state, once complete (needs record=True).
    anatomy: Anatomy | None = None
    # the steps the tracked code's syncs made (recorded runs; tracking._anatomy's steps)
    syncs: int = 0
    # (file, line) of the tracked code -> the syncs and device reads it made (recorded runs)
    line_calls: Mapping[tuple[str, int], int] = field(default_factory=_empty)
    # provenance.Site.key -> the syncs and device reads made at that site (recorded runs)
    site_calls: Mapping[tuple, int] = field(default_factory=_empty)
    # What the facts call for: each compile's kind, each line's pattern, which reads repeat
    # per step, the steady state's verdict (tracking._policy.Judgement).
    judgement: Judgement | None = None
    # What Dynamo compiled (torch.compile): tracking._dynamo.DynamoCompile, in order.
    compiled: tuple[DynamoCompile, ...] = ()
    # What a steady step costs on the chip the run is judged for (a TPU, or the target
    # elsewhere): FLOPs, bytes, memory fit, and MFU or the projected device time
    cost: StepCost | None = None
    # A RESOURCE_EXHAUSTED the run failed with, read into its facts (the out-of-memory card)
    out_of_memory: OutOfMemory | None = None
    # A fused optimizer (torch's fused=True) the run failed on: XLA has no such kernel
    fused_optimizer: FusedOptimizer | None = None
    # Datasets holding XLA tensors that a DataLoader indexed sample by sample
    # (tracking._device_data.DeviceDataset: built on the device by %%on_tpu, typically)
    device_datasets: tuple = ()

    @property
    def steps(self) -> tuple:
        """The run's steps (anatomy.StepRecord, one per sync); () without an anatomy."""
        return getattr(self.anatomy, "steps", ())

    def error_cards(self) -> list[list[str]]:
        """What the error the run failed with was, read into facts, and what to do: one
        card (a headline, then its lines) per kind tpu_nb can explain."""
        known = (self.out_of_memory, self.fused_optimizer)
        return [card.lines() for card in known if card is not None]

    @property
    def recompiled(self) -> bool:
        """Whether a line kept compiling new graphs after its warm-up, beyond the graphs
        --max-graphs allows it (or its graph grows)."""
        return bool(self.recompiled_lines(self.allowed_graphs))

    def recompiled_lines(self, allowed: int = 1) -> dict[tuple[str, int], int]:
        """Lines that kept compiling new graphs in this run (beyond their warm-up, not a
        bounded set then cached), with the graphs they compiled; `allowed` > 1 accepts that
        many graphs per line (deliberate bucketing, --max-graphs)."""
        lines: Counter[tuple[str, int]] = Counter()
        for key, p in self.judgement.lines.items() if self.judgement else ():
            if p.flagged and (p.kind == "growing" or p.graphs > allowed):
                lines[key[:2]] += p.graphs  # per site: a line's sites are summed
        return dict(lines)

    def summary(self) -> str:
        """One line: wall time and the XLA figures that matter."""
        head = f"{self.name}: " if self.name else ""
        line = f"{head}{format_seconds(self.wall_seconds)} wall, {self.metrics.summary()}"
        if self.recompiled:
            line += f", RECOMPILED at {len(self.recompiled_lines(self.allowed_graphs))} line(s)"
        if self.error is not None:
            line += f", failed: {type(self.error).__name__}"
        return line

    def __str__(self) -> str:
        lines = [self.summary(), str(self.metrics)]
        if self.compile_events:
            lines.append("  compiles:")
            lines += [f"    {e.describe()}" for e in self.compile_events]
        elif self.metrics.compiles and not self.compile_analysis:
            lines.append(
                "  compile causes unknown: call tpu_nb.setup() before the first "
                "compile to record them"
            )
        if self.compile_log_problem:
            lines.append(f"  compile causes unknown: {self.compile_log_problem}")
        lines += dynamo.report_lines(self.compiled)
        if self.synced_at_end:
            lines.append("  tpu_nb synced at the end (sync=True): that work is counted here")
        if self.pending is not None:
            lines.append(f"  {self.pending.summary()}")
        judgement = self.judgement
        for key, pattern in judgement.lines.items() if judgement else ():
            if pattern.graphs > 1 or pattern.flagged:
                where = f"{key[0]}:{key[1]}" + (f" \u2192 {pattern.via}" if pattern.via else "")
                lines.append(f"  {where}: {describe_pattern(pattern)}")
        verdict = getattr(self.anatomy, "verdict", None)
        if judgement is not None and judgement.one_time_compiles and judgement.loop:
            lines.append(f"  {judgement.one_time_cost()}")
        if verdict is not None:
            if judgement is not None and judgement.note:  # what the verdict leaves out
                lines.append(f"  {judgement.note}")
            lines.append(f"  verdict: {verdict}")
        elif judgement is not None and judgement.note:
            lines.append(f"  no verdict: {judgement.note}")
        if self.cost is not None and self.steps:
            lines.append("  cost per step:")
            lines += [f"    {line}" for line in self.cost.lines()]
        for card in self.error_cards():
            lines += [f"  {line}" for line in card]
        return "\n".join(lines)
