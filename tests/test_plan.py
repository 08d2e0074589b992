"""The plan of an %%on_tpu cell, and what a %tpu_setup asks for: options in, what runs (or the
one-line mistake) out.

The rules are the library's (tpu_nb.runtime.plan, environment.setup_action); the magics only
parse their line into them, so a script gets the same answer, and the magic's message is the
library's.
"""

import dataclasses

import pytest
from IPython.core.error import UsageError

from tpu_nb.runtime.environment import setup_action
from tpu_nb.runtime.errors import TpuNbUsageError
from tpu_nb.runtime.plan import Plan


@pytest.mark.parametrize(
    "options, mode",
    [
        ({}, "process"),
        ({"sync": True, "max_graphs": 2, "live": True, "graph": True, "profile": 3}, "process"),
        ({"spmd": "all"}, "spmd"),
        ({"spmd": "2x2", "live": True, "profile": "1"}, "spmd"),
        ({"replicas": "all", "timeout": 600}, "replicas"),
        ({"hosts": "all"}, "hosts"),
    ],
)
def test_each_combination_that_runs_says_how(options, mode):
    assert Plan(**options).mode == mode


def test_counts_given_as_a_command_lines_text_are_read_as_numbers():
    plan = Plan(replicas="4", timeout="0.5e3")
    assert (plan.replicas, plan.timeout, Plan(max_graphs="2").max_graphs) == (4, 500.0, 2)
    assert Plan(hosts="2").hosts == 2 and Plan(hosts="all").hosts == "all"
    assert Plan(replicas=3) == Plan(replicas="3")  # a script and the magic build the same plan


def test_spmd_asks_for_the_meshs_devices_or_all():
    assert Plan(spmd="2x2").spmd_request() == (4, "2x2")
    assert Plan(spmd="4").spmd_request() == (4, "4")
    assert Plan(spmd="all").spmd_request() == ("all", None)


def test_a_plan_cannot_be_changed_after_its_checks():
    plan = Plan(replicas=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.spmd = "all"  # type: ignore[misc]


MISTAKES = [
    (
        {"replicas": "2", "spmd": "all"},
        "choose one of --replicas and --spmd. Fix: --replicas for a process per device, or "
        "--spmd for one program over all of them",
    ),
    ({"sync": True, "no_sync": True}, "choose one of --sync and --no-sync. Fix: drop --no-sync"),
    (
        {"hosts": "all", "max_graphs": "2"},
        "--max-graphs works on this kernel's device, and --hosts runs the cell on the slice's "
        "hosts. Fix: drop --max-graphs (each host reports to the view of every host)",
    ),
    (
        {"hosts": 2, "replicas": 2},
        "--replicas works on this kernel's device, and --hosts runs the cell on the slice's "
        "hosts. Fix: drop --replicas (each host reports to the view of every host)",
    ),
    (
        {"replicas": "all", "live": True},
        "--live watches this kernel's XLA runtime, and --replicas runs the cell elsewhere. "
        "Fix: drop --live (each replica reports), or use --spmd --live",
    ),
    (
        {"replicas": "2", "max_graphs": "1"},
        "--max-graphs works on this kernel's device, and --replicas runs the cell elsewhere. "
        "Fix: drop --max-graphs, or use --spmd --max-graphs N",
    ),
    (
        {"replicas": "all", "graph": True},
        "--graph works on this kernel's device, and --replicas runs the cell elsewhere. "
        "Fix: drop --graph, or use --spmd --graph",
    ),
    (
        {"replicas": "all", "profile": 2},
        "--profile traces this kernel, and --replicas runs the cell elsewhere. Fix: drop "
        "--profile, or use --spmd --profile N",
    ),
    (
        {"hosts": "all", "timeout": 5},
        "--timeout bounds a --replicas run. Fix: add --replicas, or drop --timeout",
    ),
    (
        {"spmd": "2x2x2"},
        "--spmd: mesh '2x2x2' is not a shape like 4 or 2x2 of at most 256 devices. Fix: e.g. "
        "--spmd 4.",
    ),
    (
        {"replicas": "4.5"},
        "--replicas must be 'all' or a whole number of at least 1; got '4.5'. Fix: e.g. "
        "--replicas 4, or --replicas alone for every device.",
    ),
    (
        {"replicas": 0},
        "--replicas must be 'all' or a whole number of at least 1; got 0. Fix: e.g. "
        "--replicas 4, or --replicas alone for every device.",
    ),
    (
        {"hosts": "some"},
        "--hosts must be 'all' or a whole number of at least 1; got 'some'. Fix: e.g. "
        "--hosts all, or --hosts 2.",
    ),
    (
        {"max_graphs": "all"},
        "--max-graphs must be a whole number from 1 to 10,000; got 'all'. Fix: e.g. "
        "--max-graphs 2.",
    ),
    (
        {"profile": 1001},
        "--profile must be a whole number from 1 to 1,000; got 1001. Fix: e.g. --profile 3.",
    ),
    (
        {"replicas": 2, "timeout": "nan"},
        "--timeout must be a number of seconds from 1 to 604800; got 'nan'. Fix: e.g. "
        "--timeout 600.",
    ),
]


@pytest.mark.parametrize("options, message", MISTAKES, ids=[m[:40] for _, m in MISTAKES])
def test_each_combination_that_cannot_run_is_one_line_with_the_fix(options, message):
    with pytest.raises(TpuNbUsageError) as info:
        Plan(**options)
    assert str(info.value) == message


@pytest.mark.stack
@pytest.mark.parametrize("options, message", MISTAKES, ids=[m[:40] for _, m in MISTAKES])
def test_the_magic_says_what_the_plan_says_and_runs_nothing(shell, options, message):
    # The magic hands the plan its line's text: the same options as a script's, as typed.
    typed = {name: value if value is True else str(value) for name, value in options.items()}
    with pytest.raises(TpuNbUsageError) as planned:
        Plan(**typed)
    line = " ".join(
        "--" + name.replace("_", "-") + ("" if value is True else f" {value}")
        for name, value in typed.items()
    )
    shell.user_ns.pop("ran", None)
    with pytest.raises(UsageError) as info:
        shell.run_cell_magic("on_tpu", line, "ran = True")
    assert str(info.value) == f"%on_tpu: {planned.value}"
    assert "ran" not in shell.user_ns


@pytest.mark.stack
def test_on_tpu_help_leads_with_an_example(shell):
    magic = shell.find_cell_magic("on_tpu")
    assert "%%on_tpu --max-graphs 2" in magic.__doc__
    assert "%%on_tpu --spmd 2x2 -o" in magic.__doc__


@pytest.mark.parametrize(
    "options, action",
    [
        ({}, "setup"),
        ({"device": "cpu", "num_devices": 4, "ir_debug": True, "target": "v6e"}, "setup"),
        ({"cache_dir": "~/cache"}, "setup"),
        ({"check": True}, "check"),
        ({"install": True}, "install"),
        ({"install": True, "dry_run": True}, "install"),
    ],
)
def test_a_tpu_setup_asks_for_one_action(options, action):
    assert setup_action(**options) == action


SETUP_MISTAKES = [
    (
        {"dry_run": True},
        "--dry-run shows what --install would do, and changes nothing on its own. Fix: "
        "%tpu_setup --install --dry-run",
    ),
    (
        {"install": True, "check": True},
        "choose one of --install and --check. Fix: %tpu_setup --install, then %tpu_setup --check",
    ),
    (
        {"check": True, "num_devices": 2},
        "--check only checks the environment and sets nothing up, so --devices would be "
        "ignored. Fix: %tpu_setup --check alone, then %tpu_setup without --check",
    ),
    (
        {"install": True, "dry_run": True, "device": "cpu"},
        "--install only installs torch and torch_xla and sets nothing up, so --device would be "
        "ignored. Fix: %tpu_setup --install alone, then %tpu_setup without --install",
    ),
    ({"check": True, "ir_debug": True}, "so --ir-debug would be ignored"),
    ({"check": True, "cache_dir": "/tmp/c"}, "so --cache would be ignored"),
    ({"install": True, "target": "v6e"}, "so --target would be ignored"),
]
SETUP_OPTIONS = {"num_devices": "--devices", "cache_dir": "--cache"}


@pytest.mark.parametrize(
    "options, message", SETUP_MISTAKES, ids=[m[:40] for _, m in SETUP_MISTAKES]
)
def test_each_tpu_setup_that_cannot_be_done_is_one_line_with_the_fix(options, message):
    with pytest.raises(TpuNbUsageError) as info:
        setup_action(**options)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.stack
@pytest.mark.parametrize(
    "options, message", SETUP_MISTAKES, ids=[m[:40] for _, m in SETUP_MISTAKES]
)
def test_the_setup_magic_says_what_the_library_says(shell, options, message):
    with pytest.raises(TpuNbUsageError) as library:
        setup_action(**options)
    line = " ".join(
        SETUP_OPTIONS.get(name, "--" + name.replace("_", "-"))
        + ("" if value is True else f" {value}")
        for name, value in options.items()
    )
    with pytest.raises(UsageError) as info:
        shell.run_line_magic("tpu_setup", line)
    assert str(info.value) == f"%tpu_setup: {library.value}"
