"""`launch_hosts(fn, hosts=...)`: run a function (or a notebook cell) once on every host of a
TPU pod slice, through Ray, from a notebook on one of them.

A multi-host slice (v4-16, v5e-16, ...) runs one process per host, each over its own chips; a
notebook on host 0 sees host 0 only. The launch needs the notebook connected to a Ray cluster
running on the slice's hosts (`ray.init(address=...)`). It reserves the slice through Ray
(`ray.util.tpu.SlicePlacementGroup` when the nodes carry Ray's TPU labels, else a placement
group with one bundle per host, the first on the `TPU-<pod type>-head` resource), starts one
actor per host (`_host.HostWorker`, a new process serving only this launch), sends the work
once through Ray's object store (the cell and the variables it uses, as the replicas' worker
path does) and polls every host a few times a second from the calling thread. However the
launch ends, the actors are killed and the placement group removed; each host removes its own
run directory. What tpu_nb judges from all the hosts together is in _pod.py.

Ray is imported only here, only when a launch asks for hosts: `import tpu_nb` never imports it.
"""

from __future__ import annotations

import linecache
import time
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from tpu_nb.runtime.errors import (
    WEEK,
    EnvironmentProblem,
    TpuNbUsageError,
    check_seconds,
    check_stream,
    check_whole_number,
)
from tpu_nb.runtime.parallel._cell import CellFunction
from tpu_nb.runtime.parallel._pod import (
    GraphRecord,
    HostError,
    HostLost,
    HostResult,
    PodResult,
    find_straggler,
    graph_divergences,
    host_list,
    sync_divergences,
)
from tpu_nb.runtime.parallel._results import Lines, not_sent_back, record_of

NO_RAY = (
    "launching on a slice's hosts needs Ray, which is not installed here. "
    'Fix: pip install "tpu_nb[pod]" (on every host of the slice)'
)
NO_CLUSTER = (
    "this process is not connected to a Ray cluster, so tpu_nb cannot reach the slice's "
    "hosts. Fix: ray.init(address=...) with the address of the Ray head on the slice "
    "(`ray start --head` on host 0, `ray start --address=HOST0:6379` on the others)"
)
POLL_SECONDS = 0.1  # how often the launch asks every host for its output and progress


@dataclass
class _Slice:
    """A reserved slice: its placement group(s) and, per host, the bundle and node."""

    description: str
    hosts_in_slice: int
    placements: list[tuple[int, int, str]]  # (host index, bundle index, node id)
    chips: float
    group: Any = None  # the worker placement group (Ray's PlacementGroup)
    release: Callable[[], None] = lambda: None
    addresses: dict = field(default_factory=dict)  # node id -> the node's IP address


def _import_ray():
    try:
        import ray
    except ImportError:
        raise EnvironmentProblem(NO_RAY) from None
    if not ray.is_initialized():
        raise TpuNbUsageError(NO_CLUSTER)
    return ray


def _slices(ray) -> dict[str, list[dict]]:
    """The cluster's TPU hosts, grouped by slice (Ray's `ray.io/tpu-slice-name` label; one
    slice of every TPU node when the nodes carry no label)."""
    found: dict[str, list[dict]] = {}
    for node in ray.nodes():
        if node.get("Alive") and node.get("Resources", {}).get("TPU", 0) > 0:
            name = (node.get("Labels") or {}).get("ray.io/tpu-slice-name", "")
            found.setdefault(name, []).append(node)
    return found


def _head_resource(nodes: list[dict]) -> str:
    for node in nodes:
        for key in node.get("Resources", {}):
            if key.startswith("TPU-") and key.endswith("-head"):
                return key
    return ""


def _reserve(ray, hosts, timeout: float) -> _Slice:
    """Reserve a whole slice (every host: a slice's runtime starts on all of them)."""
    slices = _slices(ray)
    if not slices:
        raise EnvironmentProblem(
            "the Ray cluster has no TPU host (no node offers the 'TPU' resource). Fix: "
            "start Ray on every TPU VM of the slice (`ray start --head` on host 0, "
            "`ray start --address=HOST0:6379` on the others), then ray.init(address=...)"
        )
    wanted = None if hosts == "all" else hosts
    name, nodes = max(
        slices.items(), key=lambda kv: (bool(_head_resource(kv[1])), len(kv[1]), kv[0])
    )
    if wanted is not None and wanted > len(nodes):
        raise TpuNbUsageError(
            f"hosts={wanted}, but the largest slice in the Ray cluster has {len(nodes)} "
            f"host{'s' if len(nodes) != 1 else ''}. Fix: hosts='all'"
        )
    labels = nodes[0].get("Labels") or {}
    head = _head_resource(nodes)
    pod_type = labels.get("ray.io/tpu-pod-type") or head[len("TPU-") : -len("-head")]
    topology = labels.get("ray.io/tpu-topology", "")
    chips = min(n["Resources"]["TPU"] for n in nodes)
    description = f"{pod_type or 'a TPU slice'} ({len(nodes)} host{'s' if len(nodes) != 1 else ''})"
    if name and topology and pod_type:
        from ray.util.tpu import SlicePlacementGroup

        try:
            # The slice is chosen by name: its label on every bundle gang-schedules it,
            # without Ray's head reservation (a task in a new process, to learn the name).
            handle = SlicePlacementGroup(
                topology=topology,
                accelerator_version=pod_type.split("-")[0],
                head_reservation_timeout_s=timeout,
                bundle_label_selector=[{"ray.io/tpu-slice-name": name} for _ in nodes],
            )
        except (TimeoutError, RuntimeError, ValueError) as exc:
            raise EnvironmentProblem(_not_reserved(description, timeout, exc)) from None
        group, release = handle.placement_group, handle.shutdown
    else:
        from ray.util.placement_group import placement_group, remove_placement_group

        bundles = [{"TPU": chips} for _ in nodes]
        if head:
            bundles[0][head] = 1
        group = placement_group(bundles, strategy="STRICT_SPREAD")
        release = lambda: remove_placement_group(group)  # noqa: E731
    try:  # an interrupt while waiting, or a failed look at the group: it goes too
        ready, _ = ray.wait([group.ready()], timeout=timeout) if group is not None else ([], [])
        if not ready:
            raise EnvironmentProblem(_not_reserved(description, timeout, None))
        chosen = _placements(ray, group, nodes)[:wanted]
    except BaseException:
        release()
        raise
    addresses = {n["NodeID"]: n.get("NodeManagerAddress", "") for n in nodes}
    return _Slice(description, len(nodes), chosen, chips, group, release, addresses)


def _not_reserved(description: str, timeout: float, exc) -> str:
    why = f" ({str(exc).splitlines()[0]})" if exc is not None else ""
    return (
        f"could not reserve the hosts of {description} within {timeout:.0f} s{why}: another "
        "job holds them, or a host is missing. Fix: wait for the other job, or check "
        "ray.nodes() on the slice"
    )


def _placements(ray, group, nodes) -> list[tuple[int, int, str]]:
    """(host index, bundle, node id) per host, by host index: the node's TPU worker id where
    every node has one (torch_xla's multi-host runtime numbers hosts so), else bundle order."""
    from ray.util.placement_group import placement_group_table

    bundle_nodes = placement_group_table(group).get("bundles_to_node_id", {})
    worker_ids = {n["NodeID"]: (n.get("Labels") or {}).get("ray.io/tpu-worker-id") for n in nodes}
    rows = [(worker_ids.get(node), int(b), node) for b, node in sorted(bundle_nodes.items())]
    ids = [r[0] for r in rows]
    if all(i is not None and i.isdigit() for i in ids) and len(set(ids)) == len(ids):
        rows.sort(key=lambda r: int(str(r[0])))
    return [(host, bundle, node) for host, (_, bundle, node) in enumerate(rows)]


class _Hosts:
    """The actors of one launch, polled from the calling thread."""

    def __init__(self, ray, reserved: _Slice, stream, stall_seconds: float):
        self.ray, self.slice, self.stream = ray, reserved, stream
        self.stall_seconds = stall_seconds
        self.actors: list = []
        self.results: dict[int, dict] = {}
        self.progress: dict[int, tuple[int, float]] = {}  # host -> (syncs, when it changed)
        self.stalled: set[int] = set()
        self.notes: list[str] = []
        self.live_graphs: dict[int, list[GraphRecord]] = {}  # from each host's compile log
        self.said: set[tuple[int, tuple[int, ...]]] = set()  # live divergences shown
        self.said_all_stalled = False
        self.lost: set[int] = set()  # hosts whose process died or stopped answering

    def start_actors(self, timeout: float, device: str) -> None:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from tpu_nb.runtime.parallel._host import SAME_INSTALL, HostWorker

        remote = self.ray.remote(HostWorker)
        n = len(self.slice.placements)
        refs = []
        for host, bundle, _node in self.slice.placements:
            strategy = PlacementGroupSchedulingStrategy(
                placement_group=self.slice.group, placement_group_bundle_index=bundle
            )
            actor = remote.options(
                num_cpus=0,
                resources={"TPU": self.slice.chips},
                scheduling_strategy=strategy,
                max_restarts=0,
            ).remote()
            self.actors.append(actor)
            refs.append(actor.prepare.remote(host, n, device))
        ready, _ = self.ray.wait(refs, num_returns=n, timeout=timeout)
        for host, ref in enumerate(refs):
            if ref not in ready:
                raise EnvironmentProblem(
                    f"host {host} did not get ready within {timeout:.0f} s (a new Python "
                    "process importing torch_xla and setting up its runtime). Fix: check "
                    "that host in ray.nodes(), or pass a longer start_timeout"
                )
            try:
                info = self.ray.get(ref)
            except self.ray.exceptions.RayError as exc:
                info = {"error": _last_line(exc), "fix": SAME_INSTALL}
            if "error" in info:
                raise HostError(
                    host, n, f"could not start: {info['error']}. Fix: {info['fix']}", ""
                )

    def run(self, work_ref, started_at: float, poll_timeout: float) -> None:
        ray = self.ray
        starts = [a.start.remote(work_ref, started_at) for a in self.actors]
        for host, ref in enumerate(starts):
            try:
                ray.get(ref, timeout=poll_timeout)
            except ray.exceptions.GetTimeoutError:
                raise HostLost(host, f"stopped answering for {poll_timeout:.0f} s") from None
            except ray.exceptions.RayError as exc:
                raise EnvironmentProblem(
                    f"host {host} could not load the work: {_last_line(exc).strip()}. Fix: "
                    "define the function in the notebook (sent by value), or install its "
                    "module on every host"
                ) from None
        running = dict(enumerate(self.actors))
        output = {h: Lines(self.stream, f"[host {h}] ") for h in running}
        now = time.monotonic()
        self.progress = {h: (0, now) for h in running}
        while running:
            polls = {h: a.poll.remote() for h, a in running.items()}
            at: dict[int, int] = {}  # the cell line each host is at
            ready, _ = ray.wait(list(polls.values()), num_returns=len(polls), timeout=poll_timeout)
            for host, ref in polls.items():
                if ref not in ready:
                    self.lost.add(host)
                    raise HostLost(host, f"stopped answering for {poll_timeout:.0f} s")
                try:
                    report = ray.get(ref)
                except ray.exceptions.RayActorError as exc:
                    self.lost.add(host)
                    raise HostLost(host, "died", str(exc)) from None
                output[host].add(report["output"])
                self._watch(host, report)
                at[host] = report["line"]
                self.live_graphs.setdefault(host, []).extend(
                    GraphRecord(line, graph_hash) for line, graph_hash in report["graphs"]
                )
                if report["result"] is not None:
                    output[host].end()
                    result = report["result"]
                    if result.get("error"):
                        raise HostError(
                            host, len(self.actors), result["error"], result["traceback"]
                        )
                    self.results[host] = result
                    del running[host]
            self._compare_live()
            self._watch_all(running, at)
            if running:
                time.sleep(POLL_SECONDS)

    def _compare_live(self) -> None:
        """Say at once when a host compiled a different graph at a line than the others:
        on a real slice, the collective after it would wait forever, and the run's end (with
        the full comparison) would never come."""
        if len(self.live_graphs) < 2:
            return
        seen = tuple(
            HostResult(host=h, graphs=tuple(g), compile_analysis=True)
            for h, g in sorted(self.live_graphs.items())
        )
        for d in graph_divergences(seen, live=True):
            key = (d.line, d.hosts)
            if key not in self.said:
                self.said.add(key)
                self.stream(
                    f"[tpu_nb] {d.what}: on a real slice, a collective after it waits "
                    "forever (what differs: in the view when the cell ends)"
                )

    def _watch(self, host: int, report: dict) -> None:
        """Say once, while it runs, that a host stopped syncing while others went on."""
        now = time.monotonic()
        syncs, since = self.progress.get(host, (0, now))
        if report["syncs"] != syncs:
            self.progress[host] = (report["syncs"], now)
            return
        if host in self.stalled or report["result"] is not None:
            return
        waited = now - since
        moved = [h for h, (_, t) in self.progress.items() if h != host and t > since]
        if waited >= self.stall_seconds and moved:
            self.stalled.add(host)
            at = f" (it is at line {report['line']})" if report["line"] else ""
            self._say(
                f"host {host} has not synced for {waited:.0f} s{at} while "
                f"{host_list(moved)} went on syncing: in a slice, their next collective "
                f"waits for host {host}"
            )

    def _watch_all(self, running: dict, lines: dict[int, int]) -> None:
        """Say once when every running host has stopped syncing (after syncing at least
        once): on a real slice, hosts stuck in one collective look like this."""
        if self.said_all_stalled or len(running) < 2:
            return
        now = time.monotonic()
        progress = [self.progress.get(h, (0, now)) for h in running]
        if all(n > 0 and now - t >= self.stall_seconds for n, t in progress):
            self.said_all_stalled = True
            waited = min(now - t for _, t in progress)
            where = ", ".join(
                f"host {h} at line {lines[h]}" if lines.get(h) else f"host {h}"
                for h in sorted(running)
            )
            self._say(f"no host has synced for {waited:.0f} s ({where})")

    def _say(self, note: str) -> None:
        self.notes.append(note)
        self.stream(f"[tpu_nb] {note}")

    def stop(self) -> None:
        """Every host: its run directory removed (briefly asked), its process killed; then the
        placement group removed."""
        ray = self.ray
        asks = [a.cleanup.remote() for a in self.actors]
        if asks:
            ray.wait(asks, num_returns=len(asks), timeout=5)
        for actor in self.actors:
            with suppress(Exception):  # already gone
                ray.kill(actor, no_restart=True)
        self._sweep_lost()
        self.slice.release()

    def _sweep_lost(self) -> None:
        """A host whose process died could not remove its run directory: a small task on
        its node removes the directories of processes that no longer run."""
        if not self.lost:
            return
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        from tpu_nb.runtime.environment._private_files import sweep_dead_runs
        from tpu_nb.runtime.parallel._host import RUN_PREFIX

        sweep = self.ray.remote(num_cpus=0)(sweep_dead_runs)
        nodes = {node for host, _, node in self.slice.placements if host in self.lost}
        refs = [
            sweep.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
            ).remote(RUN_PREFIX)
            for node in nodes
        ]
        with suppress(Exception):  # best effort: the next launch on that host sweeps too
            self.ray.wait(refs, num_returns=len(refs), timeout=30)


def _last_line(exc: BaseException) -> str:
    said = str(exc).strip().splitlines()
    return said[-1] if said else type(exc).__name__


def _work(fn, args) -> tuple:
    """(fn, args, source, filename): the source lets each host place findings and show
    tracebacks with the cell's (or the function's) lines."""
    if isinstance(fn, CellFunction):
        return fn, args, fn.source, fn.filename
    code = getattr(fn, "__code__", None)
    filename = code.co_filename if code is not None else ""
    source = "".join(linecache.getlines(filename)) if filename else ""
    return fn, args, source, filename


def _check_sendable(fn, args, dumps) -> None:
    """Refuse, in one line naming it, a value the hosts cannot receive (a lock, a generator,
    an open file), before any host starts: Ray's own error is a page of its serializer's
    trace without the variable's name."""
    if isinstance(fn, CellFunction):
        named = [(f"`{name}`", value) for name, value in sorted(fn.variables.items())]
    else:
        named = [("the function", fn)]
    named += [(f"argument {i}", value) for i, value in enumerate(args, 1)]
    for name, value in named:
        try:
            dumps(value)
        except Exception as exc:
            reason = (str(exc).splitlines() or [type(exc).__name__])[0][:120]
            raise TpuNbUsageError(
                f"{name} ({type(value).__name__}) cannot be sent to the hosts: {reason}. Fix: "
                "create it inside the cell (or the function), or send plain data (numbers, "
                "strings, lists, dicts, CPU tensors)"
            ) from None


def launch_hosts(
    fn: Callable,
    *args,
    hosts: int | str = "all",
    stream: Callable[[str], None] | None = print,
    device: str | None = None,
    reserve_timeout: float = 60.0,
    start_timeout: float = 300.0,
    poll_timeout: float = 60.0,
    stall_seconds: float = 60.0,
) -> PodResult:
    """Run `fn(host, *args)` once on each of the first `hosts` hosts (by TPU worker id, 'all':
    every host) of the slice of the Ray cluster this process is connected to
    (`ray.init(address=...)`; `pip install "tpu_nb[pod]"`), each in a new process under
    tpu_nb's tracking.

    Prints come back prefixed `[host k]` through `stream` (None: not shown); an exception on
    one host stops the others (HostError, with its traceback); an interrupt stops every host;
    the hosts' processes and the slice's reservation are released at the end. `device`: what
    each host sets up (default: the device this process's setup() was told, else "auto":
    each host's PJRT_DEVICE if set, else its TPU, else its CPU). Each wait has a timeout;
    `stall_seconds` is how long a host may go without a sync, while others sync, before
    tpu_nb says so. Returns a PodResult: each host's value, counters, steps and verdict, and
    what tpu_nb judged from all of them (a host that compiled a different graph at a line, a
    host that synced a different number of times, the straggler).
    """
    __tracebackhide__ = True  # noqa: F841
    if hosts != "all":
        check_whole_number(
            hosts,
            "hosts",
            alternative="'all'",
            fix="hosts='all' (every host of the slice) or e.g. hosts=2",
        )
    for name, seconds in (
        ("reserve_timeout", reserve_timeout),
        ("start_timeout", start_timeout),
        ("poll_timeout", poll_timeout),
        ("stall_seconds", stall_seconds),
    ):
        check_seconds(seconds, name, low=0, above_low=True, high=WEEK, fix=f"e.g. {name}=60")
    if not callable(fn):
        raise TpuNbUsageError(
            f"launch_hosts needs a function to run; got {type(fn).__name__} {fn!r:.40}. Fix: "
            "launch_hosts(train, hosts='all'), with train(host) defined first."
        )
    device = _host_device(device)
    stream = check_stream(stream, "launch_hosts")
    ray = _import_ray()
    _check_sendable(fn, args, ray.cloudpickle.dumps)
    start, started_at = time.perf_counter(), time.time()
    try:
        work_ref = ray.put(_work(fn, args))
    except Exception as exc:
        raise TpuNbUsageError(
            f"cannot send the work to the hosts ({type(exc).__name__}: {exc}). Fix: pass "
            "plain data and CPU tensors (move device tensors with .cpu()), or build them "
            "in the cell itself"
        ) from None
    reserved = _reserve(ray, hosts, reserve_timeout)
    pod = _Hosts(ray, reserved, stream, stall_seconds)
    timings = [time.perf_counter() - start]  # until reserved, until every host was ready
    try:
        pod.start_actors(start_timeout, device)
        timings.append(time.perf_counter() - start)
        pod.run(work_ref, started_at, poll_timeout)
    finally:
        pod.stop()
    return _collect(pod, reserved, fn, time.perf_counter() - start, *timings)


def _host_device(device: str | None) -> str:
    """The device each host sets up: `device` if given, else the one this process's setup()
    was told by name (%tpu_setup --device cpu), else "auto" — where each host's own
    PJRT_DEVICE, if set, wins over what its machine looks like."""
    from tpu_nb.runtime.environment import chosen_device

    if device is None:
        return chosen_device() or "auto"
    if not isinstance(device, str) or device.strip().lower() not in ("auto", "cpu", "tpu"):
        raise TpuNbUsageError(
            f"device must be 'auto', 'cpu' or 'tpu'; got {device!r}. Fix: device='cpu' to run "
            "every host on its CPU, or leave it out (the kernel's %tpu_setup choice, else auto)"
        )
    return device.strip().lower()


def _collect(pod: _Hosts, reserved: _Slice, fn, wall: float, reserved_at, ready_at) -> PodResult:
    lined_up = tuple(
        record_of(
            HostResult,
            {**pod.results[host], "node": node, "address": reserved.addresses.get(node, "")},
        )
        for host, _, node in reserved.placements
    )
    straggler, why = find_straggler(lined_up)
    notes = list(pod.notes)
    if len(lined_up) < reserved.hosts_in_slice:
        notes.append(
            f"ran on {len(lined_up)} of the slice's {reserved.hosts_in_slice} hosts: on a real "
            "slice, torch_xla's multi-host runtime starts on every host (hosts='all')"
        )
    notes += [not_sent_back(f"Host {h.host}", h.value_error) for h in lined_up if h.value_error]
    unknown = [h.host for h in lined_up if not h.compile_analysis]
    if unknown:
        notes.append(
            f"{host_list(unknown)} recorded no compile causes, so their graphs were not compared"
        )
    return PodResult(
        hosts=lined_up,
        wall_seconds=wall,
        started_seconds=max(h.started_seconds for h in lined_up),
        slice=reserved.description,
        reserved_seconds=reserved_at,
        ready_seconds=ready_at,
        source=_work(fn, ())[2],
        divergences=tuple(graph_divergences(lined_up) + sync_divergences(lined_up)),
        straggler=straggler,
        straggler_reason=why,
        notes=tuple(notes),
    )
