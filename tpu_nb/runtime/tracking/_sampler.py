"""Where the host's time went, by line of the tracked code: a stack sampler for a tracked run.

While a run is tracked, a daemon thread reads the tracked thread's stack
(`sys._current_frames()`) about every `INTERVAL` seconds and gives the time since its previous
sample to what that stack was doing, as `%lprun` and py-spy attribute time:

- the line: the innermost frame of the tracked code — the cell's (or script's) own code, and
  functions defined in it (same file), as a notebook user reads them;
- via: the function it was in just under that line (`torch/nn/functional.py:1686 relu`),
  past the frames that only pass a call along (`Module.__call__`, decorators, tpu_nb's hooks);
- the kind: "input" when a frame of the tracked code is executing the `FOR_ITER` of a `for`
  and has a deeper frame — the loop is inside its iterator's `__next__`, whatever the iterable
  (a generator, a `datasets` iterator, a DataLoader) — unless that iterator itself syncs or
  reads (a generator that runs the training steps and yields losses: its time is the steps');
  "sync" and "read" inside tpu_nb's sync and value-read hooks; otherwise "host": the line's
  own Python work (tracing the graph).

Samples are summed per (kind, line, via); input samples are also kept as time spans, merged,
for the step anatomy's input part. A sample whose stack does not reach the tracked code (tpu_nb
finishing the run, another thread's callback) counts for nothing.

Do no harm: the thread never prints and never raises (a failure is logged and sampling stops);
it holds references to the tracked thread's frames only while it walks them, through
`walk_stack`, which a sync waits for (a frame kept alive would keep its tensors alive into the
next sync's graph), and it is joined when the run ends. Its cost
is the walk (a few µs to tens of µs, holding the GIL) at most 1/INTERVAL times a second for
the run's first INTERVAL * _SPAN_SAMPLES seconds, then less and less often: the interval grows
to the run's length / _SPAN_SAMPLES. After the run's first second (a short cell keeps every
sample it can get) the interval is also at least what a sample has cost the thread so far /
BUDGET: a deep stack is sampled less often, so that a long run's sampling keeps to about
BUDGET of one CPU (`benchmarks/bench_sampler.py`).

The GIL makes the reading exact in time only to the switch interval: a sample wanted while the
tracked thread runs Python waits until it lets the GIL go — at a torch call, or forced after
`sys.getswitchinterval()` (5 ms) — so under a pure-Python host the rate is about one sample
per switch interval, and a sample lands where the GIL was let go. The time between two
samples is split: the sleep half to each; the wait for the GIL to the earlier sample's state
when the GIL was let go before the switch interval forced it (the later stack is then a torch
call the thread reached, not where it spent the wait). A pure-Python stretch just before torch
calls can still show a little less than its share.
"""

from __future__ import annotations

import dis
import logging
import sys
import threading
import time
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass

from tpu_nb.runtime.frame import Frame, walk_stack
from tpu_nb.runtime.sources import frames_to_tracked, is_trampoline, line_at, line_of, short_path
from tpu_nb.runtime.units import format_place, format_seconds

log = logging.getLogger("tpu_nb")

INTERVAL = 0.005  # seconds between two samples (200 Hz asked), at first
# Then the interval grows with the run, to its length / _SPAN_SAMPLES: a line with 1 % of a
# long run's host time still gets ~10 samples of each _SPAN_SAMPLES, and a run of minutes
# costs a few samples a second, not 200.
_SPAN_SAMPLES = 1000
BUDGET = 0.004  # of one CPU: the sampling thread's time at most, after the run's first second
_FREE = 1.0  # seconds sampled at the asked interval, whatever a sample costs
MIN_SAMPLED = 10  # intervals' worth of sampled time before lines are named
_GAP = 0.0005  # at least this long asleep between two samples (the GIL let go)
_MAX_SPANS = 65_536  # input spans kept (merged: one per stretch of input samples)
_MAX_KEYS = 4096  # distinct (kind, line, via) kept; beyond, new ones count as "other"
_MAX_STACKS = 4096  # distinct stacks whose answer is kept
# Frames that only pass a call along: `via` names the function behind them.
_PASS_FUNCTIONS = frozenset(
    {"_wrapped_call_impl", "_call_impl", "decorate_context", "wrapper", "_use_grad", "_fn"}
)
_PASS_FILES = (
    "torch/nn/modules/module.py",
    "torch/_compile.py",
    "torch/_dynamo/eval_frame.py",
    "torch/utils/_contextlib.py",
    "torch/utils/_device.py",
    "functools.py",
    "contextlib.py",
    "typing_extensions.py",
)
_HOOK_KINDS = {"sync": "sync", "read": "read", "__next__": "input"}  # tpu_nb's hook functions
_TPU_NB = ("tpu_nb/runtime/",)


@dataclass(frozen=True)
class HostLine:
    """Host time on one line of the tracked code, and the function it was in under it."""

    line: Frame  # the tracked code's line (a cell line, or a function defined in the cell)
    via: str  # "torch/nn/functional.py:1686 relu"; "" when the line's own code
    seconds: float
    share: float  # of the run's wall time
    kind: str = "host"  # "host": the line's own work; "sync": in a sync it called;
    # "input": inside the iterator of its `for`

    @property
    def where(self) -> str:
        """ "In [3], line 7" for a cell (the extension names cells), else "file.py:7"."""
        return format_place(short_path(self.line.file), self.line.line)

    def __str__(self) -> str:
        via = f" \u2192 {self.via}" if self.via else ""
        what = {"sync": " (sync)", "input": " (waiting for its iterator)"}.get(self.kind, "")
        if self.kind == "sync" and self.via.endswith((" sync", " mark_step")):
            what = ""  # "torch_xla/torch_xla.py:78 sync" says it already
        return f"{self.where}{via}{what}: {format_seconds(self.seconds)} ({self.share:.0%})"


class Sampler:
    """Samples one thread's stack until stopped; see the module docstring.

    root_codes: the tracked code's code objects (a cell's compiled code); root_frame: else the
    frame that entered the run. Functions defined in the same file count as the tracked code.
    """

    def __init__(
        self,
        thread_id: int,
        *,
        root_codes: tuple = (),
        root_frame=None,
        interval: float = INTERVAL,
        budget: float | None = BUDGET,
    ):
        codes = tuple(c for c in root_codes if c is not None)
        self._ids = frozenset(id(c) for c in codes)
        self._codes = codes  # kept alive: ids compared
        self._root = root_frame
        anchor = codes[0] if codes else (root_frame.f_code if root_frame is not None else None)
        self._file = anchor.co_filename if anchor is not None else None
        self._tid = thread_id
        self.interval = interval
        self._budget = budget
        self._clock = time.time  # the clock of torch_xla's metric samples
        self._gate = threading.Lock()  # held until stop(): the thread waits on it
        self._gate.acquire()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._infos: dict[int, list] = {}  # id(code) -> what its frames are (`_info`)
        # the stack's (id(code), f_lasti), from the line in -> (answer, the `for` an "input"
        # answer waits on, the codes): see `_classify`
        self._classified: dict[tuple, tuple] = {}
        self._waiting: tuple | None = None
        # Results, read by other threads (copies of a dict or deque hold the GIL: no torn read)
        self.totals: dict[tuple, float] = {}  # (kind, file, line, function, via) -> seconds
        # The run's first intervals as (start, end, key, first seen, last seen): a verdict
        # about the steady state takes the warm-up steps' time back out of the totals
        # (bounded: the warm-up comes first). An interval reaches past the samples that saw
        # its state (the state changed somewhere between two samples): see `lines`.
        self.early: list[tuple[float, float, tuple, float, float]] = []
        self.early_complete = True  # False: `early` filled up before the run ended
        self.input_spans: deque = deque(maxlen=_MAX_SPANS)  # (start, end, loop), merged
        # `for` lines (file, line) whose iterator syncs or reads: it runs the steps (a
        # generator that trains and yields losses), so time inside it is not input
        self.stepping: set[tuple[str, int]] = set()
        self.loops: set[tuple[str, int]] = set()  # `for` lines seen waiting for an iterator
        self.checked: set[tuple[str, int]] = set()  # of those, checked at a sync
        self.check = False  # a loop to check at the next sync (`check_at_sync`)
        self.samples = 0  # samples taken
        self.attributed = 0  # of those, reaching the tracked code
        self.started = self.stopped = 0.0
        self.failed = False
        self.cpu_seconds = 0.0  # the sampling thread's CPU time (it holds the GIL meanwhile)

    # -- start / stop --------------------------------------------------------------------------

    def start(self) -> Sampler:
        if self._file is None:
            return self  # nothing to attribute to
        self.started = self._clock()
        thread = threading.Thread(target=self._run, name="tpu_nb-sampler", daemon=True)
        self._thread = thread
        thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> Sampler:
        """Stop and join the thread (idempotent; safe from any thread but the sampler's)."""
        if not self._stopping:
            self._stopping = True
            self._gate.release()  # wakes the thread at once
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
            self.stopped = self._clock()
            if not thread.is_alive():
                self._root = None  # the entering frame (and its locals) is not kept
        return self

    @property
    def alive(self) -> bool:
        thread = self._thread
        return thread is not None and thread.is_alive()

    @property
    def rate(self) -> float:
        """Samples per second reached (0 before the run ended)."""
        span = self.stopped - self.started
        return self.samples / span if span > 0 and self.stopped else 0.0

    # -- the thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._loop()
        except BaseException:  # never print, never reach the user's code: log and stop
            self.failed = True
            log.debug("tpu_nb: the host sampler stopped", exc_info=True)

    def _loop(self) -> None:
        clock, interval, gate, budget = self._clock, self.interval, self._gate, self._budget
        forced = sys.getswitchinterval() * 0.8
        cpu = time.thread_time()
        previous, last = clock(), None
        start, base = previous, interval
        deadline = previous + interval
        # A timed acquire of a lock held until stop(): one call that lets the GIL go.
        while not gate.acquire(timeout=max(_GAP, deadline - clock())):
            due, now = deadline, clock()
            # Deadline pacing: a sample delayed by the GIL does not lower the rate.
            interval = max(base, (now - start) / _SPAN_SAMPLES)
            if budget and self.samples and now - start > _FREE:
                interval = max(interval, (time.thread_time() - cpu) / self.samples / budget)
            self.interval = interval
            deadline = max(deadline + interval, now + _GAP)
            key = self._sample()
            if key is False:
                break  # the tracked thread is gone
            self.samples += 1
            if key is not None:
                self.attributed += 1
            # Asleep from `previous` to `due`: half to each sample (the state changed
            # somewhere in between). From `due` to `now` the tracked thread held the GIL: if
            # it let it go before the switch interval forced it, `now` is a point where it
            # lets it go (a torch call), not where it spent the wait: the wait goes to the
            # previous sample's state, as the state it most likely kept.
            due = min(max(due, previous), now)
            middle = (previous + due) / 2
            late = key if (now - due >= forced or last is None) else last
            if last == key == late:  # one state throughout (the usual case): one interval
                if key is not None and now > previous:
                    self._add(key, previous, now)
            else:
                for what, lo, hi, seen in (
                    (last, previous, middle, previous),
                    (key, middle, due, now),
                    (late, due, now, now if late == key else previous),
                ):
                    if what is not None and hi > lo:
                        self._add(what, lo, hi, (seen, seen))
            previous, last = now, key
        if last is not None:
            self._add(last, previous, clock(), (previous, previous))
        self.cpu_seconds = time.thread_time() - cpu

    def _add(self, key: tuple, start: float, end: float, seen: tuple | None = None) -> None:
        """`key`'s state from `start` to `end`, seen by the samples at `seen` (first, last;
        by default both ends)."""
        totals = self.totals
        if key not in totals and len(totals) >= _MAX_KEYS:
            key = (key[0], key[1], 0, "", "")  # too many distinct lines: one "other" line
        totals[key] = totals.get(key, 0.0) + (end - start)
        first, last = seen if seen is not None else (start, end)
        early = self.early
        if early and early[-1][2] == key and early[-1][1] == start:
            was = early[-1]  # the same state on: one interval
            early[-1] = (was[0], end, key, min(was[3], first), max(was[4], last))
        elif len(early) < _EARLY:
            early.append((start, end, key, first, last))
        else:
            self.early_complete = False
        if key[0] == "input":
            spans, loop = self.input_spans, key[1:3]
            if spans and spans[-1][1] == start and spans[-1][2] == loop:
                spans[-1] = (spans[-1][0], end, loop)
            else:
                spans.append((start, end, loop))

    def _sample(self):
        """(kind, file, line, function, via) of the tracked thread's stack now; None if it is
        not in the tracked code; False if the thread is gone. Frames are dropped on return."""
        return walk_stack(self._tid, self._classify, False)

    def _classify(self, top) -> tuple | None:
        path = frames_to_tracked(top, self._ids, self._root)
        if path is None:
            return None  # not under the tracked code
        try:
            # A training loop's stack passes through a few hundred states at most: the same
            # functions at the same instructions give the same answer, found once (the walk
            # below costs ~5x this key). The `for` an "input" answer waits on may since have
            # been found to run the steps: that answer is found again. (Loops found to run
            # the steps stay so for the run: a later answer needs nothing added.)
            signature = tuple([(id(frame.f_code), frame.f_lasti) for frame in path])
            known = self._classified.get(signature)
            if known is not None:
                key, waiting = known[0], known[1]
                if waiting is None:
                    return key
                if waiting not in self.stepping:
                    if waiting not in self.checked:
                        self.loops.add(waiting)
                        self.check = True
                    return key
            key = self._walk(path, signature)
            classified = self._classified
            if len(classified) >= _MAX_STACKS:
                classified.clear()
            # the codes are kept with it, so that their ids are not reused while it lives
            codes = tuple(frame.f_code for frame in path)
            classified[signature] = (key, self._waiting, codes)
            return key
        finally:
            path.clear()

    def _walk(self, path: list, signature: tuple) -> tuple | None:
        """The answer for `path`, at the instructions its frames were at in `signature`: read
        once, as the walk itself may lose the GIL and the thread run on (its frames' lines and
        instructions now would not be the ones the answer is kept for)."""
        chain = [  # innermost first
            (frame.f_code, self._info_of(frame.f_code), at)
            for frame, (_, at) in zip(path, signature, strict=True)
        ]
        self._waiting = None
        try:
            # The tracked code's frames, outermost first (the root, then functions it defines)
            ours = [i for i in range(len(chain) - 1, -1, -1) if chain[i][1][1]]
            at = ours[-1]  # the innermost: the line
            kind = "host"
            hooks = [chain[i][1][2] for i in range(at - 1, -1, -1) if chain[i][1][2]]
            if hooks:  # tpu_nb's sync, read or loader hook under it, the outermost
                kind = hooks[0]
            # A device loader's own sync inside its __next__ (MpDeviceLoader ends the previous
            # step there) is that step's sync, not a wait for input.
            loader_sync = kind == "input" and "sync" in hooks
            if loader_sync:
                kind = "sync"
            stepping = self.stepping
            for i in ours:  # the outermost `for` waiting for its iterator
                if i == 0:
                    break
                code, info, lasti = chain[i]
                loops = info[5]
                if loops is None:
                    loops = self._loops(info)
                if lasti in loops:
                    where = (code.co_filename, line_at(code, lasti))
                    if loader_sync:  # a data loop (check_at_sync tells it apart)
                        break
                    if kind in ("sync", "read"):  # its iterator runs the steps
                        stepping.add(where)
                    elif where not in stepping:
                        kind, at = "input", i
                        self._waiting = where
                        if where not in self.checked:
                            self.loops.add(where)
                            self.check = True
                        break
            code, _, lasti = chain[at]
            via = self._via(chain, at)
            return (kind, code.co_filename, line_at(code, lasti), code.co_name, via)
        finally:
            chain.clear()

    def check_at_sync(self, frame) -> None:
        """On the tracked thread, in a sync (when `check` is set): a `for` of the tracked code
        in its FOR_ITER here is one whose iterator runs the steps (every sync of such a loop
        happens inside its iterator; a data loop syncs in its body). A tpu_nb loader hook
        under it (MpDeviceLoader syncs in its `__next__`) is a data loader."""
        self.check = False
        seen = list(self.loops)
        loader = False
        for outer in frames_to_tracked(frame, self._ids, self._root) or ():
            info = self._info_of(outer.f_code)
            if info[2] == "input":
                loader = True
            elif info[1]:
                loops = info[5] if info[5] is not None else self._loops(info)
                if outer.f_lasti in loops and not loader:
                    self.stepping.add((info[0].co_filename, line_of(outer)))
                loader = False
        self.checked.update(seen)

    def _info_of(self, code) -> list:
        info = self._infos.get(id(code))
        return info if info is not None and info[0] is code else self._info(code)

    def _info(self, code) -> list:
        """What a frame of `code` is, once per code object: [code, the tracked code's,
        tpu_nb hook kind, tpu_nb's own, passes calls along, FOR_ITER offsets, name]."""
        path = code.co_filename.replace("\\", "/")
        # a trampoline carries the calling line's file name, yet is tpu_nb's
        trampoline = is_trampoline(code)
        ours = trampoline or any(f"/{p}" in path for p in _TPU_NB)
        info = [
            code,
            code.co_filename == self._file and not trampoline,
            _HOOK_KINDS.get(code.co_name) if ours and not trampoline else None,
            ours,
            code.co_name in _PASS_FUNCTIONS or path.endswith(_PASS_FILES),
            None,  # FOR_ITER offsets, when first needed
            None,  # "file:line name", when first needed
        ]
        self._infos[id(code)] = info
        return info

    @staticmethod
    def _loops(info: list) -> frozenset:
        info[5] = _for_iter_offsets(info[0])
        return info[5]

    @staticmethod
    def _via(chain: list, at: int) -> str:
        """The function just under the line, past pass-through frames and tpu_nb's hooks;
        "" when the line itself was running."""
        fallback = None
        for i in range(at - 1, -1, -1):
            info = chain[i][1]
            if info[3]:
                continue
            if fallback is None:
                fallback = info
            if info[4]:
                continue
            return info[6] or _named(info)
        return (fallback[6] or _named(fallback)) if fallback is not None else ""

    # -- results -------------------------------------------------------------------------------

    def lines(self, wall: float, without: tuple = ()) -> tuple[HostLine, ...]:
        """Time per (kind, line, via) — the line's own work ("host"), its syncs ("sync"),
        its `for`'s iterator ("input"); value reads have their own findings — largest first,
        with shares of `wall` seconds. `without`: (start, end) windows left out (the
        warm-up's steps), as far as the first intervals kept in `early` reach.

        A window's edges are where a sync returned: the state changed there, not at the
        midpoint between two samples where an interval's guess put the change. An interval
        whose samples all saw its state inside one window is left out whole (the code after
        a loop, seen only after its last sync); any other loses its overlap with the windows,
        at most its own length (steps share their edges)."""
        got: dict[tuple, float] = dict(self.totals)
        windows = sorted(without)
        ends = [hi for _, hi in windows]
        for start, end, key, first, last in self.early:
            cut = 0.0  # (a state can be seen past its interval: the windows up to there)
            for lo, hi in windows[bisect_left(ends, min(start, first)) :]:
                if lo > max(end, last):
                    break
                if lo <= first and last <= hi:
                    cut = end - start
                    break
                cut += max(0.0, min(end, hi) - max(start, lo))
            cut = min(cut, end - start)
            if cut > 0:
                got[key] = got.get(key, 0.0) - cut
        stepping = set(self.stepping)
        merged: dict[tuple, float] = {}
        for (kind, file, line, function, via), seconds in got.items():
            if kind == "input" and (file, line) in stepping:
                kind = "host"  # seen before its iterator's first sync
            key = (kind, file, line, function, via)
            merged[key] = merged.get(key, 0.0) + seconds
        if sum(max(seconds, 0.0) for seconds in merged.values()) < MIN_SAMPLED * self.interval:
            return ()  # a handful of samples places nothing: no lines rather than noise
        out = []
        for (kind, file, line, function, via), seconds in merged.items():
            if kind == "read" or seconds <= 0:
                continue
            # The shares are of the same time as the seconds: `wall` covers the steps kept,
            # and `without` took the others out. Past `early`'s reach it could not: a share
            # is then at most the whole.
            share = min(seconds / wall, 1.0) if wall > 0 else 0.0
            out.append(HostLine(Frame(file, line, function), via, seconds, share, kind))
        out.sort(key=lambda h: -h.seconds)
        return tuple(out)


# Intervals kept with their times, consecutive ones of one state merged (a minute of a run
# sampled at 200 Hz whose state changed at every sample; hours of a training loop's).
_EARLY = 50_000


def _named(info: list) -> str:
    """A function as "torch/nn/functional.py:1686 relu" (its first line), kept in `info`."""
    code = info[0]
    where = format_place(short_path(code.co_filename), code.co_firstlineno)
    info[6] = f"{where} {code.co_name}"
    return info[6]


def _for_iter_offsets(code) -> frozenset[int]:
    """The `f_lasti` values of a frame of `code` in a `for`'s FOR_ITER: the instruction and
    its inline caches (Python 3.12+ reports a frame that entered a generator from FOR_ITER at
    the cache entry after it)."""
    try:
        instructions = list(dis.get_instructions(code))
    except Exception:
        return frozenset()
    out: set[int] = set()
    for k, ins in enumerate(instructions):
        if ins.opname.startswith(("FOR_ITER", "INSTRUMENTED_FOR_ITER")):
            end = instructions[k + 1].offset if k + 1 < len(instructions) else ins.offset + 2
            out.update(range(ins.offset, max(end, ins.offset + 2), 2))
    return frozenset(out)
