"""What an %%on_tpu cell asks for, checked before anything runs: `Plan(**options)`.

`%%on_tpu` parses its line into these keywords (`--max-graphs 2` is max_graphs="2", a bare
`--replicas` is replicas="all"), and a script can build the same Plan with numbers. Every
combination that cannot run raises TpuNbUsageError naming the option as %%on_tpu spells it,
with the fix, so nothing is half-applied; `mode` says how the cell runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from tpu_nb.runtime.errors import (
    WEEK,
    TpuNbUsageError,
    check_given,
    check_seconds,
    check_whole_number,
)
from tpu_nb.runtime.parallel import Spmd, check_spmd, parse_mesh, spmd_context
from tpu_nb.runtime.tracking._guard import MAX_GRAPHS

MAX_PROFILE_STEPS = 1000  # profile=N: a trace of more steps is too large to draw
# What acts on this kernel's own runtime: --hosts runs the cell on other machines instead.
THIS_KERNEL = ("replicas", "spmd", "live", "profile", "graph", "max_graphs", "sync", "no_sync")
Mode = Literal["process", "spmd", "replicas", "hosts"]
# The numbers %%on_tpu takes, each checked by the library's one validator.
NUMBERS: tuple[tuple[str, Callable, dict], ...] = (
    ("max_graphs", check_whole_number, dict(high=MAX_GRAPHS, fix="e.g. --max-graphs 2")),
    ("profile", check_whole_number, dict(high=MAX_PROFILE_STEPS, fix="e.g. --profile 3")),
    ("timeout", check_seconds, dict(low=1, high=WEEK, fix="e.g. --timeout 600")),
    (
        "replicas",
        check_whole_number,
        dict(alternative="'all'", fix="e.g. --replicas 4, or --replicas alone for every device"),
    ),
    ("hosts", check_whole_number, dict(alternative="'all'", fix="e.g. --hosts all, or --hosts 2")),
)


@dataclass(frozen=True)
class Plan:
    """How an %%on_tpu cell runs, from its options; see `mode`.

        plan = Plan(replicas=4, timeout=600)   # %%on_tpu --replicas 4 --timeout 600
        plan.mode                              # "replicas": launch(fn, devices=plan.replicas)

    mode "process": the cell runs in this kernel, tracked (on_tpu); "spmd": the same, once
    over all devices (`enter_spmd()` first); "replicas": once per device of this host, each in
    its own process (launch); "hosts": once per host of a pod slice, through Ray
    (launch_hosts).
    """

    sync: bool = False
    no_sync: bool = False  # the default, kept for older notebooks
    max_graphs: int | None = None
    live: bool = False
    graph: bool = False
    profile: int | None = None
    replicas: int | str | None = None  # "all" or a count
    timeout: float | None = None  # seconds, with replicas
    spmd: str | None = None  # the mesh: "all", "4" or "2x2"
    hosts: int | str | None = None  # "all" or a count

    def __post_init__(self) -> None:
        for name, check, bounds in NUMBERS:
            value = getattr(self, name)
            if value is not None and not (value == "all" and "alternative" in bounds):
                option = "--" + name.replace("_", "-")
                object.__setattr__(self, name, check_given(value, option, check, **bounds))
        _check_combination(self)

    @property
    def mode(self) -> Mode:
        if self.hosts is not None:
            return "hosts"
        if self.replicas is not None:
            return "replicas"
        return "spmd" if self.spmd is not None else "process"

    def spmd_request(self) -> tuple[int | str, str | None]:
        """(devices, mesh) for spmd_context: every device in one row, or the mesh's."""
        shape = parse_mesh(self.spmd)
        return ("all", None) if shape is None else (shape[0] * shape[1], self.spmd)

    def check(self) -> None:
        """What this process's state refuses, before anything changes it: the switch to SPMD
        cannot be undone (RuntimeStateError, TpuNbUsageError)."""
        if self.mode == "spmd":
            check_spmd(*self.spmd_request())

    def enter_spmd(self) -> Spmd:
        """Switch this process to SPMD and build the mesh (mode "spmd")."""
        return spmd_context(*self.spmd_request())


def _check_combination(plan: Plan) -> None:
    """Options that cannot go together, each refused with the one to drop."""
    if plan.replicas is not None and plan.spmd is not None:
        raise TpuNbUsageError(
            "choose one of --replicas and --spmd. Fix: --replicas for a process per device, "
            "or --spmd for one program over all of them"
        )
    if plan.sync and plan.no_sync:
        raise TpuNbUsageError("choose one of --sync and --no-sync. Fix: drop --no-sync")
    for name in THIS_KERNEL if plan.hosts is not None else ():
        if getattr(plan, name) not in (None, False):
            option = "--" + name.replace("_", "-")
            raise TpuNbUsageError(
                f"{option} works on this kernel's device, and --hosts runs the cell on the "
                f"slice's hosts. Fix: drop {option} (each host reports to the view of every host)"
            )
    # Each replica runs the cell as a plain function in another process: no graph guard,
    # no pending graph shown there, so these would be silently ignored.
    for name, value in (("max_graphs", " N"), ("graph", "")) if plan.replicas is not None else ():
        if getattr(plan, name) not in (None, False):
            option = "--" + name.replace("_", "-")
            raise TpuNbUsageError(
                f"{option} works on this kernel's device, and --replicas runs the cell "
                f"elsewhere. Fix: drop {option}, or use --spmd {option}{value}"
            )
    if plan.live and plan.replicas is not None:
        raise TpuNbUsageError(
            "--live watches this kernel's XLA runtime, and --replicas runs the cell elsewhere. "
            "Fix: drop --live (each replica reports), or use --spmd --live"
        )
    if plan.profile is not None and plan.replicas is not None:
        raise TpuNbUsageError(
            "--profile traces this kernel, and --replicas runs the cell elsewhere. Fix: drop "
            "--profile, or use --spmd --profile N"
        )
    if plan.timeout is not None and plan.replicas is None:
        raise TpuNbUsageError(
            "--timeout bounds a --replicas run. Fix: add --replicas, or drop --timeout"
        )
    if plan.spmd is not None:
        try:
            parse_mesh(plan.spmd)
        except TpuNbUsageError as exc:
            raise TpuNbUsageError(f"--spmd: {exc}") from None
