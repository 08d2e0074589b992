"""One interception layer: every hook tpu_nb puts into torch and torch_xla, in one place.

The probe wraps, while some subscriber listens for that kind of event:

- "sync": `torch_xla.sync` (which `xm.mark_step`, ParallelLoader and MpDeviceLoader call) and
  the same function as `torch_xla.torch_xla`'s global (which `torch_xla.compile(fn)` calls);
- "read": the Tensor methods that read device values (`item`, `tolist`, `cpu`, `bool()`, ...)
  and the library functions that copy device data to the host from C++ (`xm.mesh_reduce`'s);
- "fallback": the Python entry points of ops torch_xla runs on the CPU (and any op seen
  falling back, added by `watch_fallback`);
- "input": the data loaders' `__next__` (DataLoader's and ParallelLoader's iterators).

Each hook builds one typed event (`SyncEvent`, `ReadEvent`, `FallbackEvent`, `InputEvent`)
and hands it to the subscribers in order of `priority`: `before(event)` as the call starts,
`after(event, state)` as it returns, `state` being what `before` returned (a subscriber sets
`before = None` or `after = None` where it has nothing to do). The recorder
(provenance), the step anatomy, `max_graphs` and the live monitor's sync probe are
subscribers; none of them patches torch itself.

Installing and removing is one place, and cannot be left behind: `subscribe()` adds a
`Subscription` to the set of its kinds and installs a kind's hooks when its set was empty;
`Subscription.close()` removes it and restores the originals when the set is empty. The sets
make it independent of the order in which runs end (two threads, a background run outliving
a cell); closing twice is harmless; the restore finishes even when KeyboardInterrupt lands in
the middle of it (and SIGINT is held off while it runs in the main thread), then re-raises.

tpu_nb's own syncs (track()'s end-of-run sync, max_graphs' sync as it starts) are made inside
`own_sync(kind)`: their event carries `own`, an explicit marker subscribers test.

The other hooks are kinds their owners define (`define(kind, install)`), installed and removed
the same way while anyone subscribes to them: "factories" (default_device's torch factories
and module registration hooks, while a block is open), "legacy-names" (the finder and notes
for XRT-era names, while the extension is loaded), "counter-resets" (the backend's counter
reset carrying the counts, from the first snapshot until unload), "dynamo-trace" (one
handler on Dynamo's structured trace, handing its records to the runs' Dynamo watches),
"datasets" (DataLoader's map-style fetch: a dataset on the device indexed sample by sample)
and "collectives-refused" (in a replica forked on XLA:CPU, for its life: xm's collectives
raise instead of hanging).
`installed()` lists them all. Two registrations with Dynamo have no removal in torch and are
not hooks: tpu_nb's files and call trampolines are on Dynamo's skip lists, so that Dynamo
never compiles tpu_nb's code as the user's.
"""

from __future__ import annotations

import functools
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

from tpu_nb.runtime.backend import current as current_backend
from tpu_nb.runtime.frame import settle_walks
from tpu_nb.runtime.sources import as_caller, caller

log = logging.getLogger("tpu_nb")

KINDS = ("sync", "read", "fallback", "input")  # the event kinds; others are define()d
# Counters that move when device data reaches the host: a scalar read, a copy to the CPU.
READ_COUNTERS = ("aten::_local_scalar_dense", "xla::_to_cpu", "xla::_to_copy")
# Tensor methods that read device values, and how a finding names them.
READ_METHODS = {
    "item": ".item()",
    "tolist": ".tolist()",
    "numpy": ".numpy()",
    "cpu": ".cpu()",
    "__bool__": "bool(tensor)",
    "__float__": "float(tensor)",
    "__int__": "int(tensor)",
    "__index__": "a tensor used as an index",
    "__format__": "formatting a tensor",
    "__repr__": "printing a tensor",
}
# Python entry points of ops torch_xla 2.9 runs on the CPU (no XLA lowering), as
# (namespace, attribute).
FALLBACK_ENTRY_POINTS = (
    ("torch", "unique"),
    ("torch", "unique_consecutive"),
    ("torch", "nonzero"),
    ("torch", "masked_select"),
    ("torch", "histc"),
    ("torch", "median"),
    ("torch", "nanmedian"),
    ("torch", "bucketize"),
    ("torch", "searchsorted"),
    ("torch", "kthvalue"),
    ("torch", "mode"),
    ("torch", "bincount"),
    ("torch", "isin"),
    ("Tensor", "nonzero"),
    ("Tensor", "masked_select"),
    ("Tensor", "histc"),
    ("Tensor", "median"),
    ("Tensor", "nanmedian"),
    ("Tensor", "kthvalue"),
    ("Tensor", "bincount"),
    ("functional", "grid_sample"),
    # An op's backward that falls back (F.interpolate's, in diffusers' upsampling) runs from
    # C++ inside backward(): hooked from the start, its first step is placed on that line too,
    # with the compile its inputs force. Without a fallback the hook reads an empty list.
    # (Tensor.backward calls torch.autograd.backward: one hook serves both, and the site walks
    # past torch/_tensor.py to the line that called it.)
    ("autograd", "backward"),
    # Runs on the device, but its backward falls back: where the forward was called from
    # (a library's upsampling) is where that fallback comes from.
    ("functional", "interpolate"),
)


# The events are plain classes, not dataclasses: a dataclass's generated __init__ is code of
# file "<string>", which Dynamo would compile as a frame of its own after a graph break (it
# keeps out only tpu_nb's files, _dynamo.keep_out_of_dynamo).


class SyncEvent:
    """One `torch_xla.sync()` call.

    frame: the caller's; entry: time.time() as the hook was entered; inner: called through
    torch_xla.torch_xla's global (torch_xla.compile's syncs); plumbing: the runtime's own sync
    around a compiled function; loader: a device data loader's own sync; own: tpu_nb's own
    sync ("end": track()'s last, "guard-start": max_graphs' first), made for `owner` (the
    run's recorder for "end"); start: the original called (after the subscribers' `before`);
    end: it returned; compiled: the graphs it compiled; launched: the graphs it ran (0: it had
    nothing to run — a data loader's before its first batch, a library's after its loop —
    and is no step of the user's; -1: not measured).
    """

    __slots__ = (
        "frame",
        "entry",
        "inner",
        "plumbing",
        "loader",
        "own",
        "owner",
        "start",
        "end",
        "compiled",
        "launched",
        "role",
        "role_of",
    )

    def __init__(self, frame, entry, inner, plumbing, loader, own, owner):
        self.frame: FrameType = frame
        self.entry: float = entry
        self.inner: bool = inner
        self.plumbing: bool = plumbing
        self.loader: bool = loader
        self.own: str = own
        self.owner: Any = owner
        self.start = self.end = 0.0
        self.compiled, self.launched = 0, -1
        self.role, self.role_of = "", None  # _libraries.sync_role's answer, for one run


class ReadEvent:
    """A value read of an XLA tensor (one of READ_METHODS): `label` names it (".item()");
    READ_COUNTERS before and after it; `in_sync`: inside a sync (a step closure). `copied`:
    a host copy that moves none of READ_COUNTERS copied XLA tensors (`tensor`: the first)."""

    __slots__ = (
        "frame",
        "label",
        "tensor",
        "entry",
        "counters_before",
        "compiles_before",
        "in_sync",
        "start",
        "end",
        "counters_after",
        "copied",
    )

    def __init__(self, frame, label, tensor, entry, counters_before, compiles_before, in_sync):
        self.frame: FrameType = frame
        self.label: str = label
        self.tensor: Any = tensor
        self.entry: float = entry
        self.counters_before: list[int] = counters_before
        self.compiles_before: int = compiles_before
        self.in_sync: bool = in_sync
        self.start = self.end = 0.0
        self.counters_after: list[int] = counters_before
        self.copied = False


class FallbackEvent:
    """A call of a CPU-fallback entry point (torch.unique, F.grid_sample, ...; `backward`,
    once an op's backward fell back: autograd runs it from C++, inside that call)."""

    __slots__ = ("frame", "args", "compiles_before", "backward", "op", "none_before")

    def __init__(self, frame, args, compiles_before, backward=False, op=""):
        self.frame: FrameType = frame
        self.args: tuple = args
        self.compiles_before: int = compiles_before
        self.backward: bool = backward
        self.op: str = op  # the entry point's name: "unique", "backward", "interpolate"
        # No op had fallen back before the call (subscribers are then asked after it)
        self.none_before = False


class InputEvent:
    """One batch from a data loader's iterator, on the thread that called `__next__`."""

    __slots__ = ("thread", "start", "end")

    def __init__(self, thread, start):
        self.thread: int = thread
        self.start: float = start
        self.end = 0.0


class Subscription:
    """One subscriber's membership of the probe's kinds; `close()` leaves them (idempotent)."""

    __slots__ = ("subscriber", "kinds", "closed", "run")

    def __init__(self, subscriber, kinds: tuple[str, ...], run: object = None):
        self.subscriber, self.kinds, self.closed = subscriber, kinds, False
        self.run = run  # the tracked run open on the subscribing thread, if any

    def close(self) -> None:
        if not self.closed:
            _probe.release(self)


class _Hook:
    __slots__ = ("owner", "name", "original", "had_own", "wrapper")

    def __init__(self, owner, name, original, had_own, wrapper):
        self.owner, self.name, self.original = owner, name, original
        self.had_own, self.wrapper = had_own, wrapper

    def restore(self) -> None:
        if getattr(self.owner, self.name, None) is self.wrapper:  # unless replaced since
            if self.had_own:
                setattr(self.owner, self.name, self.original)
            else:
                delattr(self.owner, self.name)


class _Undo:
    __slots__ = ("step", "name")

    def __init__(self, step: Callable[[], object], name: str):
        self.step, self.name = step, name

    def restore(self) -> None:
        self.step()


class Hooks:
    """What a defined kind's `install` is given: `patch` replaces `owner.name` with
    `make(original)`, `undo` registers a step for anything else (a handle to remove); the probe
    reverses them, last first, when the kind's last subscriber leaves."""

    __slots__ = ("_probe", "_kind")

    def __init__(self, probe: Probe, kind: str):
        self._probe, self._kind = probe, kind

    def patch(self, owner, name: str, make: Callable[[Any], Any]) -> None:
        self._probe._patch(self._kind, owner, name, make)

    def undo(self, step: Callable[[], object], name: str = "") -> None:
        self._probe._hooks[self._kind].append(_Undo(step, name or getattr(step, "__name__", "")))


class _Local(threading.local):
    """Per-thread state of the hooks. Class-level defaults: `getattr(local, name, default)`
    of a missing name raises and catches an AttributeError inside (~1.5 us per sync)."""

    own = ""  # own_sync()'s kind, while tpu_nb syncs
    owner: Any = None
    in_sync = False  # inside a sync: reads are its step closures
    depth = 0  # inside a read hook: nested reads are its own
    in_next = False  # inside a loader's __next__ (MpDeviceLoader's nests another)
    in_fallback = False  # inside a fallback hook (an entry point calling another)
    runs: list | None = None  # tracked runs open on this thread, innermost last


class Probe:
    """The process's one interception layer (`probe()`); see the module docstring."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subs: dict[str, set[Subscription]] = {k: set() for k in KINDS}
        # Subscribers of each kind in priority order, rebuilt on every change: the hooks read
        # a tuple without taking the lock.
        self.listeners: dict[str, tuple] = {k: () for k in KINDS}
        self.befores: dict[str, tuple] = {k: () for k in KINDS}
        self.afters: dict[str, tuple] = {k: () for k in KINDS}
        self._hooks: dict[str, list[_Hook | _Undo]] = {k: [] for k in KINDS}
        self._patched: set[tuple[int, str]] = set()  # (id(owner), name) of each _Hook listed
        self._wrappers: dict[tuple[int, str], tuple] = {}  # see _patch
        self._defined: dict[str, Callable[[Hooks], None]] = {}
        self.local = _Local()
        # The tracked runs now running, in the order they began (any thread), and the last
        # that ended: a live view and max_graphs follow a run through them.
        self.active_runs: tuple = ()
        self.last_run: Any = None
        self._counter: Any = None
        self._fallbacks: Any = None
        self._compiler: Any = None  # its `_is_compiling_flag`: see _compiling_state

    # -- subscribing ---------------------------------------------------------------------------

    def define(self, kind: str, install: Callable[[Hooks], None]) -> None:
        """A kind of hook besides the event kinds: `install(hooks)` puts it in place when the
        kind's first subscriber comes (see `Hooks`), and the probe takes it out when the last
        leaves. Its subscribers are listed in `listeners[kind]`."""
        if kind in KINDS:
            raise ValueError(f"{kind!r} is one of the probe's event kinds")
        with self._lock:
            self._defined[kind] = install
            self._subs.setdefault(kind, set())
            self._hooks.setdefault(kind, [])
            self.listeners.setdefault(kind, ())

    def subscribe(self, subscriber, kinds: tuple[str, ...], *, of_run: bool = True) -> Subscription:
        """Deliver the events of `kinds` to `subscriber` (or, for a defined kind, keep its
        hooks in place) until the subscription is closed. `of_run`: it belongs to the tracked
        run open on this thread, if any, whose end closes it if its owner could not; False
        for one that outlives runs (a default_device block, the loaded extension)."""
        unknown = set(kinds) - set(KINDS) - self._defined.keys()
        if unknown:
            raise ValueError(f"unknown probe event kinds {sorted(unknown)}")
        runs = self.local.runs
        run = runs[-1] if runs and of_run else None
        subscription = Subscription(subscriber, tuple(kinds), run)
        with self._lock:
            try:
                for kind in kinds:
                    first = not self._subs[kind]
                    # a set's add is one step: an interrupt leaves it in or out, never half
                    self._subs[kind].add(subscription)
                    # (an event kind's hooks can be missing after a failed install; a defined
                    # kind's install may have found nothing to hook yet)
                    if first if kind in self._defined else not self._hooks[kind]:
                        self._install(kind)
            except BaseException:
                self._leave(subscription)
                raise
            self._relist()
        return subscription

    def release(self, subscription: Subscription) -> None:
        with _sigint_held(), self._lock:
            self._leave(subscription)

    # -- runs: what a tracked run subscribed, closed when it ends ------------------------------

    def begin_run(self, run: object) -> None:
        """Subscriptions made on this thread from now until `end_run(run)` (the recorder's,
        the anatomy's, max_graphs' in %%on_tpu) belong to `run`."""
        local = self.local
        if local.runs is None:
            local.runs = []
        local.runs.append(run)
        with self._lock:
            self.active_runs = (*self.active_runs, run)

    def end_run(self, run: object) -> None:
        """Close whatever `run` still holds: each subscriber closes its own as the run ends,
        and this catches one an interrupt stopped half-way. Other runs' are left alone,
        whatever order the runs end in."""
        runs = self.local.runs or []
        if run in runs:
            runs.remove(run)
        with self._lock:
            if run in self.active_runs:
                self.active_runs = tuple(r for r in self.active_runs if r is not run)
                self.last_run = run
        interrupted: BaseException | None = None
        with _sigint_held(), self._lock:
            left = {s for subs in self._subs.values() for s in subs if s.run is run}
            for subscription in left:
                try:
                    self._leave(subscription)
                except KeyboardInterrupt as error:  # the rest are still left
                    interrupted = error
        if interrupted is not None:
            raise interrupted

    def _leave(self, subscription: Subscription) -> None:
        # Runs to the end even when KeyboardInterrupt lands in it (then re-raised): a hook
        # left installed would outlive the run for the rest of the kernel.
        interrupted: BaseException | None = None
        while True:
            try:
                subscription.closed = True
                for kind in subscription.kinds:
                    self._subs[kind].discard(subscription)
                    if not self._subs[kind]:
                        self._uninstall(kind)
                self._relist()
                break
            except KeyboardInterrupt as error:
                interrupted = error
        if interrupted is not None:
            raise interrupted

    def _relist(self) -> None:
        befores, afters = {}, {}
        listeners = {kind: tuple(s.subscriber for s in self._subs[kind]) for kind in self._defined}
        for kind in KINDS:
            subs = self._subs[kind]
            ordered = sorted((s.subscriber for s in subs), key=lambda s: getattr(s, "priority", 0))
            # bound methods, looked up once; a subscriber sets `before = None` (or `after`)
            # when it has nothing to do there
            befores[kind] = tuple((s, s.before) for s in ordered if s.before is not None)
            afters[kind] = tuple((s, s.after) for s in ordered if s.after is not None)
        self.befores, self.afters = befores, afters
        self.listeners = {**listeners, **{kind: befores[kind] or afters[kind] for kind in KINDS}}

    def installed(self) -> dict[str, int]:
        """Hooks installed now, per kind (for tests and diagnostics)."""
        return {kind: len(hooks) for kind, hooks in self._hooks.items() if hooks}

    # -- install / remove ----------------------------------------------------------------------

    def _install(self, kind: str) -> None:
        defined = self._defined.get(kind)
        if defined is not None:
            defined(Hooks(self, kind))
            return
        import torch

        runtime = current_backend()
        if self._counter is None:
            self._counter = runtime.counters.reader()
            self._fallbacks = runtime.counters.fallbacks_reader()
            self._compiler = _compiling_state(torch)
        if kind == "sync":
            for owner, name, inner in runtime.syncs.entry_points():
                self._patch("sync", owner, name, lambda o, i=inner: self._sync_hook(o, inner=i))
        elif kind == "read":
            for name, label in READ_METHODS.items():
                self._patch("read", torch.Tensor, name, lambda o, lb=label: self._read_hook(o, lb))
            for owner, name, label in runtime.syncs.host_copies():
                self._patch(
                    "read", owner, name, lambda o, lb=label: self._read_hook(o, lb, copies=True)
                )
        elif kind == "fallback":
            for namespace, name in FALLBACK_ENTRY_POINTS:
                self.watch_fallback(namespace, name)
        elif kind == "input":
            dataloader = sys.modules.get("torch.utils.data.dataloader")
            for cls in (
                getattr(dataloader, "_BaseDataLoaderIter", None),
                *runtime.syncs.loader_iterators(),
            ):
                if cls is not None:
                    self._patch("input", cls, "__next__", self._input_hook)

    def watch_fallback(self, namespace: str, name: str) -> None:
        """Hook one more CPU-fallback entry point ("torch", "Tensor", "functional" or
        "autograd"), until the fallback subscribers leave."""
        import torch

        owner = {
            "torch": torch,
            "Tensor": torch.Tensor,
            "functional": torch.nn.functional,
            "autograd": torch.autograd,
        }.get(namespace)
        if owner is not None and callable(getattr(owner, name, None)):
            self._patch("fallback", owner, name, self._fallback_hook)

    def _patch(self, kind: str, owner, name: str, make) -> None:
        original = getattr(owner, name, None)
        at = (id(owner), name)  # the owner is kept alive by its hook: its id is not reused
        if original is None or at in self._patched:
            return
        # An event kind's wrapper depends on the original alone: made once, put back in place
        # run after run (a defined kind's `make` may close over its install's state).
        made = self._wrappers.get(at) if kind in KINDS else None
        if made is not None and made[1] is original and made[2].__tpu_nb_hook__ == kind:
            wrapper = made[2]
        else:
            wrapper = make(original)
            wrapper.__tpu_nb_hook__ = kind
            if kind in KINDS:
                self._wrappers[at] = (owner, original, wrapper)  # the owner kept: ids unique
        hook = _Hook(owner, name, original, name in vars(owner), wrapper)
        self._hooks[kind].append(hook)  # listed first: a removal never misses it
        self._patched.add(at)
        setattr(owner, name, wrapper)

    def _uninstall(self, kind: str) -> None:
        hooks = self._hooks[kind]
        while hooks:
            hook = hooks[-1]
            try:
                hook.restore()
            except Exception:  # one that cannot be undone must not keep the rest in place
                log.debug("tpu_nb: could not restore %s", hook.name, exc_info=True)
            if isinstance(hook, _Hook):  # before the pop: an interrupt leaves it listed
                self._patched.discard((id(hook.owner), hook.name))
            hooks.pop()

    # -- the hooks -----------------------------------------------------------------------------

    def _sync_hook(self, original, *, inner: bool):
        # Every sync of a tracked run passes here: what it looks up is bound once (installed
        # after _install set the counter and the compiling check).
        probe, local, clock = self, self.local, time.time
        counter, compiler, plumbing_codes = self._counter, self._compiler, _plumbing_codes

        @functools.wraps(original)
        def sync(*args, **kwargs):
            __tracebackhide__ = True  # noqa: F841
            frame = caller()
            settle_walks()  # no frame held by a stack walk keeps a tensor in this graph
            if not probe.listeners["sync"] or compiler._is_compiling_flag:
                return as_caller(frame)(original, args, kwargs)
            entry, compiles = clock(), counter("UncachedCompile")
            known = plumbing_codes.get(id(frame.f_code))  # _sync_kind's cache, inlined
            if known is None or known[0] is not frame.f_code:
                known = _sync_kind(frame)
            plumbing = known[1]
            event = SyncEvent(frame, entry, inner, plumbing, known[2], local.own, local.owner)
            # Did it have anything to run? A graph to run is looked up in the compile cache,
            # in this thread (an execution's own counter moves later, in the runtime's
            # threads)
            compiles = compiles or 0
            launched = compiles + (counter("CachedCompile") or 0)
            states = {}
            for subscriber, before in probe.befores["sync"]:
                states[subscriber] = before(event)
            event.start = clock()
            outer = local.in_sync
            local.in_sync = not plumbing  # reads during a step's sync: its closures
            try:
                result = as_caller(frame)(original, args, kwargs)
            finally:
                local.in_sync = outer
            event.end = clock()
            uncached = counter("UncachedCompile") or 0
            event.compiled = uncached - compiles
            event.launched = uncached + (counter("CachedCompile") or 0) - launched
            for subscriber, after in probe.afters["sync"]:
                after(event, states.get(subscriber))  # only max_graphs raises, on purpose
            return result

        return sync

    def _read_hook(self, original, label: str, *, copies: bool = False):
        """A value read (`Tensor.item`, `tolist`, printing); with `copies`, a library function
        copying device data to the host: a read of its first XLA tensor (its arguments, or one
        level inside a list, tuple or dict of them)."""
        probe = self

        @functools.wraps(original)
        def read(*args, **kwargs):
            __tracebackhide__ = True  # noqa: F841
            frame = caller()
            local = probe.local
            tensor = None
            # A CPU tensor's read cannot move XLA's counters: nothing to report.
            if (
                probe.listeners["read"]
                and not local.depth
                and not probe._compiler._is_compiling_flag
            ):
                if copies:
                    tensor = _first_xla_tensor(args)
                elif args and getattr(args[0], "is_xla", False):
                    tensor = args[0]
            if tensor is None:
                return as_caller(frame)(original, args, kwargs)
            counter = probe._counter
            event = ReadEvent(
                frame,
                label,
                tensor,
                time.time(),
                [counter(n) or 0 for n in READ_COUNTERS],
                counter("UncachedCompile"),
                local.in_sync,
            )
            event.copied = copies
            local.depth = 1
            states: dict = {}
            try:
                for subscriber, before in probe.befores["read"]:
                    states[subscriber] = before(event)
                event.start = time.time()
                return as_caller(frame)(original, args, kwargs)
            finally:
                event.end = time.time()
                local.depth = 0
                event.counters_after = [counter(n) or 0 for n in READ_COUNTERS]
                for subscriber, after in probe.afters["read"]:
                    after(event, states.get(subscriber))

        return read

    def _fallback_hook(self, original):
        probe = self
        name = getattr(original, "__name__", "")
        backward = name == "backward"

        @functools.wraps(original)
        def op(*args, **kwargs):
            __tracebackhide__ = True  # noqa: F841
            local = probe.local
            frame = caller()
            if (
                not probe.listeners["fallback"]
                or local.in_fallback
                or probe._compiler._is_compiling_flag
            ):
                return as_caller(frame)(original, args, kwargs)
            compiles = probe._counter("UncachedCompile")
            # Every training step's backward passes here. While no op of this process has
            # fallen back, the subscribers have no counts to take before it: they are asked
            # only if one falls back inside it (their "before" then sees the counts as they
            # were: none).
            quiet = backward and not probe._fallbacks()
            event = None if quiet else FallbackEvent(frame, args, compiles, backward, name)
            states = {}
            if event is not None:
                states = {s: before(event) for s, before in probe.befores["fallback"]}
            local.in_fallback = True
            try:
                result = as_caller(frame)(original, args, kwargs)
            finally:
                local.in_fallback = False
            if event is None:
                if not probe._fallbacks():
                    return result
                event = FallbackEvent(frame, args, compiles, backward, name)
                event.none_before = True
                states = {s: before(event) for s, before in probe.befores["fallback"]}
            for subscriber, after in probe.afters["fallback"]:
                after(event, states.get(subscriber))
            return result

        return op

    def _input_hook(self, original):
        probe = self

        def __next__(iterator):
            local = probe.local
            afters = probe.afters["input"]
            if not afters or local.in_next:
                return original(iterator)  # nested (MpDeviceLoader's own)
            local.in_next = True
            event = InputEvent(threading.get_ident(), time.time())
            try:
                return original(iterator)
            finally:
                event.end = time.time()
                local.in_next = False
                for _, after in afters:
                    after(event, None)

        __next__.__wrapped__ = original
        return __next__


class _CompilingCall:
    """`torch.compiler.is_compiling()` as the attribute `_is_compiling_flag`, for a torch
    that keeps no such module flag."""

    __slots__ = ("_call",)

    def __init__(self, call: Callable[[], bool]):
        self._call = call

    @property
    def _is_compiling_flag(self) -> bool:
        return self._call()


def _compiling_state(torch) -> Any:
    """What the hooks read `_is_compiling_flag` of, to leave alone what torch.export traces.
    In eager code torch 2.9's `torch.compiler.is_compiling()` returns that module's flag
    (`torch.jit.is_scripting()` is False there): the module itself, one attribute read at
    every sync, read and fallback call where the function is two calls."""
    compiler = torch.compiler
    if isinstance(getattr(compiler, "_is_compiling_flag", None), bool):
        return compiler
    return _CompilingCall(compiler.is_compiling)


def _first_xla_tensor(args: tuple) -> Any:
    for arg in args:
        values: tuple | list
        if isinstance(arg, dict):
            values = tuple(arg.values())
        else:
            values = arg if isinstance(arg, (list, tuple)) else (arg,)
        for value in values:
            if getattr(value, "is_xla", False):
                return value
    return None


# Whether a code object's syncs are plumbing, by id: (code, answer), the code kept so that its
# id is not reused while the entry lives (hashing a code object hashes its whole body).
_plumbing_codes: dict[int, tuple] = {}


def _sync_kind(frame) -> tuple:
    """(code, plumbing, loader) of the function that called a sync, cached per code object.
    plumbing: the runtime's own sync around a compiled function, not a user's step. loader:
    a device data loader's sync (before each batch, and at the end of the data)."""
    code = frame.f_code
    known = _plumbing_codes.get(id(code))
    if known is not None and known[0] is code:
        return known
    path, name = code.co_filename, code.co_name
    backend = current_backend()
    plumbing = any(
        path.endswith(suffix) and (not function or name == function)
        for suffix, function in backend.syncs.plumbing_callers
    )
    loader = any(part in path.replace("\\", "/") for part in backend.syncs.loader_paths)
    if len(_plumbing_codes) >= 1024:  # bounded: one per function that syncs
        _plumbing_codes.clear()
    known = _plumbing_codes[id(code)] = (code, plumbing, loader)
    return known


@contextmanager
def _sigint_held() -> Iterator[None]:
    """In the main thread, hold SIGINT while the block runs and deliver it after (the
    default handler's KeyboardInterrupt); elsewhere no signal can arrive."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    try:
        previous = signal.getsignal(signal.SIGINT)
    except (ValueError, OSError):
        previous = None
    if previous is not signal.default_int_handler:  # someone else's handler: leave it be
        yield
        return
    caught: list = []
    signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if caught:
            raise KeyboardInterrupt


_probe = Probe()


def probe() -> Probe:
    """The process's interception layer."""
    return _probe


def close_surely(subscription: Subscription) -> None:
    """Close `subscription` even when KeyboardInterrupt lands in the middle (re-raised after):
    for one no run's end would close (`of_run=False`)."""
    interrupted: BaseException | None = None
    while not subscription.closed:
        try:
            subscription.close()
        except KeyboardInterrupt as error:
            interrupted = error
    if interrupted is not None:
        raise interrupted


@contextmanager
def own_sync(kind: str, owner: Any = None) -> Iterator[None]:
    """Syncs made in the block are tpu_nb's own (`SyncEvent.own == kind`, made for `owner`)."""
    local = _probe.local
    before = local.own, local.owner
    local.own, local.owner = kind, owner
    try:
        yield
    finally:
        local.own, local.owner = before
