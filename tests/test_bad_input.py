"""Bad input gets one line saying what is wrong and the exact fix, and changes nothing.

One table for the library (TpuNbError) and one for the magics (UsageError): each input, the
words its message must hold, and a check that the process environment is untouched.

Marked `stack` (run again on Colab's IPython 7.34): the magics' tests, which go through IPython's
argument handling and UsageError; the library's are the same under any IPython.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
import textwrap
from pathlib import Path

import pytest
import torch_xla  # noqa: F401  (its import sets XLA_FLAGS etc.: not what these tests check)
from IPython.core.error import UsageError

import tpu_nb
from tpu_nb.display.dashboard import Dashboard
from tpu_nb.runtime.environment import MAX_CPU_DEVICES
from tpu_nb.runtime.errors import (
    EnvironmentProblem,
    RuntimeStateError,
    TpuNbError,
    TpuNbUsageError,
)
from tpu_nb.runtime.live import LiveMonitor
from tpu_nb.runtime.tracking import profile


def _step():
    return None


def _on_tpu(**options):
    with tpu_nb.on_tpu(**options):
        raise AssertionError("the block must not run")


def _stopped_dashboard_started_again():
    dash = Dashboard(refresh=0.1)
    dash.start()
    dash.stop()
    dash.start()


NO_SUCH_USER = "~nonexistentuser_tpu_nb"

# (call, words in the message). Every message must also hold "Fix:" and be one line.
LIBRARY = [
    (
        lambda: tpu_nb.setup("cpu", cache_dir=f"{NO_SUCH_USER}/x"),
        f"the compile cache '{NO_SUCH_USER}/x' starts with ~, but there is no user named "
        f"'{NO_SUCH_USER[1:]}' on this machine",
    ),
    (
        lambda: tpu_nb.setup("cpu", debug_file=f"{NO_SUCH_USER}/x.log"),
        f"debug_file '{NO_SUCH_USER}/x.log' starts with ~, but there is no user named",
    ),
    (
        lambda: tpu_nb.max_graphs(10**30),
        "max_graphs must be a whole number from 1 to 10,000; got 1000000000000000000000000000000",
    ),
    (lambda: _on_tpu(max_graphs=2**63), "max_graphs must be a whole number from 1 to 10,000"),
    (lambda: tpu_nb.launch(_step, timeout=0), "timeout must be None or a number of seconds"),
    (lambda: tpu_nb.launch(_step, timeout=math.nan), "got nan"),
    (lambda: tpu_nb.launch(_step, timeout="60"), "got '60'"),
    (lambda: tpu_nb.setup(device=None), "device must be one of 'auto', 'tpu', 'cpu'; got None"),
    (lambda: tpu_nb.setup(cache_dir=123), "cache_dir must be a directory path; got 123"),
    (lambda: tpu_nb.setup(cache_dir="  "), "cache_dir must be a directory path"),
    (lambda: tpu_nb.setup(debug_file=123), "debug_file must be a file path; got 123"),
    (lambda: tpu_nb.setup(ir_debug="yes"), "ir_debug must be True or False; got 'yes'"),
    (
        lambda: tpu_nb.setup("cpu", num_devices=100000000000),
        f"num_devices must be a whole number from 1 to {MAX_CPU_DEVICES}; got 100000000000",
    ),
    (lambda: tpu_nb.setup("cpu", num_devices=2.0), "num_devices must be a whole number"),
    (
        lambda: tpu_nb.setup(cache_dir="/proc/tpu_nb/cache"),
        "the compile cache /proc/tpu_nb/cache is in /proc, a kernel file system",
    ),
    (
        lambda: tpu_nb.time_device(42),
        "time_device times a function called with no arguments; got 42",
    ),
    (
        lambda: tpu_nb.time_device(_step, repeat=1.5),
        "repeat must be a whole number from 1 to 1,000; got 1.5",
    ),
    (
        lambda: tpu_nb.time_device(_step, number="3"),
        "number must be a whole number from 1 to 1,000,000; got '3'",
    ),
    (lambda: tpu_nb.time_device(_step, number=10**12), "got 1000000000000"),
    (lambda: tpu_nb.time_device(_step, repeat=0), "repeat must be a whole number from 1"),
    (lambda: tpu_nb.device(index=99), "there is no XLA device 99: this process has 1"),
    (lambda: tpu_nb.device(index=-1), "index must be None or a whole number of at least 0"),
    (lambda: tpu_nb.device(index="0"), "index must be None or a whole number of at least 0"),
    (
        lambda: tpu_nb.launch(lambda spmd: 1, mode="spmd", devices=100000000000),
        f"devices must be 'all' or a whole number from 1 to {MAX_CPU_DEVICES}",
    ),
    (lambda: tpu_nb.launch(42), "launch needs a function to run; got int 42"),
    (
        lambda: tpu_nb.launch(lambda spmd: 1, mode="spmd", timeout=60),
        "timeout= bounds a replicas launch; mode='spmd' runs fn in this process, which "
        "nothing stops. Fix: drop timeout=, or use mode='replicas'",
    ),
    (
        lambda: Dashboard(refresh=math.nan),
        "refresh must be a number of seconds from 0.1 to 3600; got nan",
    ),
    (lambda: Dashboard(refresh=math.inf), "got inf"),
    (lambda: Dashboard(refresh=1e308), "got 1e+308"),
    (lambda: Dashboard(refresh=0.01), "got 0.01"),
    (lambda: Dashboard(refresh="1"), "got '1'"),
    (lambda: Dashboard(chart_refresh=math.nan), "chart_refresh must be a number of seconds"),
    (lambda: Dashboard(chart_refresh=-math.inf), "chart_refresh must be a number of seconds"),
    (
        lambda: Dashboard(alert_graphs=10**20),
        "alert_graphs must be a whole number from 1 to 10,000; got 100000000000000000000",
    ),
    (lambda: Dashboard(alert_graphs=1.5), "alert_graphs must be a whole number"),
    (lambda: tpu_nb.dashboard(refresh=math.nan), "refresh must be a number of seconds"),
    (lambda: profile(steps=0), "steps must be None or a whole number of at least 1; got 0"),
    (lambda: profile(steps=True), "steps must be None or a whole number"),
    (lambda: LiveMonitor(alert_graphs=0), "alert_graphs must be a whole number of at least 1"),
    (
        lambda: tpu_nb.launch(_step, devices=0),
        "devices must be 'all' or a whole number of at least 1; got 0. Fix: e.g. devices=4.",
    ),
    (
        lambda: tpu_nb.launch_hosts(_step, hosts=0),
        "hosts must be 'all' or a whole number of at least 1; got 0",
    ),
    (
        lambda: tpu_nb.launch_hosts(_step, hosts=2, start_timeout=math.nan),
        "start_timeout must be a number of seconds above 0 and at most 604800; got nan",
    ),
    (
        lambda: tpu_nb.launch(_step, timeout=-1),
        "timeout must be None or a number of seconds above 0 and at most 604800; got -1",
    ),
]


@pytest.mark.parametrize("call, words", LIBRARY, ids=[w[:40] for _, w in LIBRARY])
def test_library_mistakes_are_one_line_with_a_fix_and_change_nothing(call, words):
    before = dict(os.environ)
    with pytest.raises(TpuNbUsageError) as info:  # each is the call's mistake, not the machine's
        call()
    message = str(info.value)
    assert words in message
    assert "Fix:" in message and "\n" not in message
    assert dict(os.environ) == before
    assert os.environ.get("XLA_USE_SPMD") is None


# What the machine or the install cannot do, and what this process's state forbids now: the
# other two kinds, each still a TpuNbError with one line and its Fix.
OTHER_KINDS = [
    (lambda: tpu_nb.setup("gpu"), EnvironmentProblem, "XLA:GPU was removed from torch_xla 2.9"),
    (lambda: tpu_nb.setup("tpu"), EnvironmentProblem, "this machine has no TPU"),
    (_stopped_dashboard_started_again, RuntimeStateError, "has already run and stopped"),
    (lambda: Dashboard().refresh_now(), RuntimeStateError, "the dashboard is not running"),
]


@pytest.mark.parametrize("call, kind, words", OTHER_KINDS, ids=[w for _, _, w in OTHER_KINDS])
def test_environment_and_state_problems_say_their_kind(call, kind, words):
    if kind is EnvironmentProblem and os.environ.get("TPU_ACCELERATOR_TYPE"):
        pytest.skip("this machine has a TPU: setup('tpu') would succeed")
    with pytest.raises(kind) as info:
        call()
    assert not isinstance(info.value, TpuNbUsageError)
    assert words in str(info.value)
    assert "Fix:" in str(info.value) and "\n" not in str(info.value)


def test_cache_dir_that_is_a_file_or_inside_one(tmp_path):
    file = tmp_path / "cache"
    file.write_text("not a directory")
    for path, words in (
        (file, "is a file, not a directory"),
        (file / "xla", f"is inside a file ({file})"),
    ):
        with pytest.raises(TpuNbError) as info:
            tpu_nb.setup(cache_dir=path)
        assert f"the compile cache {path} {words}" in str(info.value)
        assert "Fix:" in str(info.value)
    assert file.read_text() == "not a directory"


MAGICS = [
    (
        "tpu_setup",
        "--devices 100000000000",
        f"%tpu_setup: --devices must be a whole number from 1 to {MAX_CPU_DEVICES}; got "
        f"'100000000000'. Fix: e.g. --devices 4",
    ),
    ("tpu_setup", "--devices 0", "--devices must be a whole number from 1"),
    (
        "tpu_setup",
        "--cache '/tmp/no end",
        '%tpu_setup: cannot split "--cache \'/tmp/no end" '
        "into arguments (No closing quotation). Fix: close "
        "the quote",
    ),
    ("tpu_setup", "--cache /proc/tpu_nb", "the compile cache /proc/tpu_nb is in /proc"),
    ("tpu_setup", f"--cache {NO_SUCH_USER}/x", "starts with ~, but there is no user named"),
    (
        "tpu_setup",
        "--dry-run",
        "%tpu_setup: --dry-run shows what --install would do, and changes nothing on its own. "
        "Fix: %tpu_setup --install --dry-run",
    ),
    (
        "tpu_setup",
        "--check --devices 2",
        "%tpu_setup: --check only checks the environment and sets nothing up, so --devices "
        "would be ignored. Fix: %tpu_setup --check alone, then %tpu_setup without --check",
    ),
    ("tpu_setup", "--install --dry-run --device cpu", "--install only installs"),
    ("tpu_setup", "--check --target v6e", "so --target would be ignored"),
    ("tpu_setup", "--install --check", "choose one of --install and --check. Fix:"),
    (
        "tpu_setup",
        "--nope",
        "%tpu_setup: unrecognized arguments: --nope. Fix: see %tpu_setup --help",
    ),
    (
        "tpu_dashboard",
        "--refresh nan",
        "%tpu_dashboard: --refresh must be a number of "
        "seconds from 0.1 to 3600; got 'nan'. Fix: e.g. "
        "--refresh 0.5",
    ),
    ("tpu_dashboard", "--refresh inf", "got 'inf'"),
    ("tpu_dashboard", "--refresh 1e400", "got '1e400'"),
    ("tpu_dashboard", "--chart-refresh nan", "--chart-refresh must be a number"),
    (
        "tpu_dashboard",
        "--alert-graphs 99999999999999999999999",
        "--alert-graphs must be a whole number from 1 to 10,000",
    ),
    ("tpu_dashboard", '--refresh "1', "No closing quotation"),
    ("tpu_time", "-n 0 x", "%tpu_time: -n must be a whole number from 1 to 1,000,000; got '0'"),
    ("tpu_time", "-r 1.5 x", "%tpu_time: -r must be a whole number from 1 to 1,000; got '1.5'"),
    ("tpu_time", "-n 'x", "%tpu_time: cannot split"),
    (
        "xla_graph",
        "42",
        "42 is of type int (42), not an XLA tensor nor anything holding one. Fix: %xla_graph loss",
    ),
    ("xla_graph", "{'a': [1, 'x']}", "is of type dict ({'a': [1, 'x']}), not an XLA tensor"),
    (
        "xla_graph",
        "__import__('numpy').eye(3)",
        "is of type ndarray (array([[1., 0., 0.], [0., 1., 0.], [0., ), not an XLA tensor",
    ),
    ("xla_graph", "--budget 99999999999999999999999 x", "--budget must be a whole"),
    ("xla_graph", "'x", "%xla_graph: cannot split"),
    (
        "xla_graph",
        "--diff loss",
        "%xla_graph: --diff draws the last two graphs of the line that changed last, and "
        "takes no expression (got 'loss'). Fix: %xla_graph --diff, or %xla_graph loss",
    ),
    ("xla_metrics", '--cells "', "%xla_metrics: cannot split"),
    (
        "xla_metrics",
        "--all --cells",
        "choose one of --since-cell, --all, --reset, --cells. Fix: e.g. %xla_metrics --since-cell",
    ),
    (
        "xla_graph",
        "no_such_name",
        "could not evaluate 'no_such_name': NameError: name "
        "'no_such_name' is not defined. Fix: give an expression",
    ),
]


@pytest.mark.stack
@pytest.mark.parametrize("magic, line, words", MAGICS, ids=[f"{m} {ln}" for m, ln, _ in MAGICS])
def test_magic_mistakes_are_one_line_with_a_fix_and_change_nothing(shell, magic, line, words):
    before = dict(os.environ)
    with pytest.raises(UsageError) as info:
        shell.run_line_magic(magic, line)
    message = str(info.value)
    assert words in message
    assert "Fix:" in message and "\n" not in message
    assert dict(os.environ) == before


@pytest.mark.stack
@pytest.mark.parametrize(
    "line, words",
    [
        (
            "--max-graphs 99999999999999999999999",
            "%on_tpu: --max-graphs must be a whole number from 1 to 10,000",
        ),
        ("--max-graphs 0", "--max-graphs must be a whole number from 1"),
        ("--spmd 'x", "%on_tpu: cannot split"),
        ("--spmd abc", "--spmd: mesh 'abc' is not a shape like 4 or 2x2"),
        ("--spmd 300x300", "of at most 256 devices"),
        ("--replicas 2 --spmd", "choose one of --replicas and --spmd. Fix: --replicas for a "),
        ("--timeout 5", "--timeout bounds a --replicas run. Fix: add --replicas"),
        ("--replicas 2 --timeout 0", "%on_tpu: --timeout must be a number of seconds from 1"),
        (
            "--replicas 0",
            "%on_tpu: --replicas must be 'all' or a whole number of at least 1; got '0'",
        ),
        ("--replicas -1", "got '-1'"),
        ("--replicas abc", "got 'abc'"),
        ("--replicas 4.5", "got '4.5'"),
        ("--replicas ''", "got ''"),
    ],
)
def test_on_tpu_mistakes_stop_before_the_cell_runs(shell, line, words):
    before = dict(os.environ)
    shell.user_ns.pop("ran", None)
    with pytest.raises(UsageError) as info:
        shell.run_cell_magic("on_tpu", line, "ran = True")
    assert words in str(info.value) and "Fix:" in str(info.value)
    assert "ran" not in shell.user_ns
    assert dict(os.environ) == before


@pytest.mark.stack
def test_xla_graph_of_a_tensor_with_nothing_pending_still_says_so(shell, capsys):
    shell.run_cell(
        "import torch, torch_xla\nsettled = torch.ones(2, device=torch_xla.device())"
        "\ntorch_xla.sync()"
    )
    capsys.readouterr()
    shell.run_line_magic("xla_graph", "settled")
    assert "nothing pending" in capsys.readouterr().out


@pytest.mark.stack
def test_cache_path_with_quotes_spaces_and_tilde_is_what_the_user_meant(py, tmp_path):
    """In a fresh process (the compile cache is latched when the runtime starts)."""
    out = py(
        textwrap.dedent("""
        import json, os
        from IPython.testing.globalipapp import start_ipython
        ip = start_ipython()
        ip.run_line_magic("load_ext", "tpu_nb")
        ip.run_line_magic("tpu_setup", "--device cpu --cache '~/my xla cache'")
        print("RESULT", json.dumps(os.environ["XLA_PERSISTENT_CACHE_PATH"]))
    """),
        env={"HOME": str(tmp_path)},
    ).stdout
    path = json.loads(out.split("RESULT", 1)[1])
    assert path == str(tmp_path / "my xla cache")
    assert (tmp_path / "my xla cache").is_dir()
    assert not any("'" in p.name for p in tmp_path.iterdir())


def test_cache_dir_not_writable_by_this_user(py, other_user):  # noqa: F811 (fixture import)
    """Root may write anywhere: the check runs as a second local uid."""
    tmp_path = Path(tempfile.mkdtemp(prefix="tpu_nb_not_yours_", dir=enterable_tmp()))
    os.chmod(tmp_path, 0o755)  # ours: the other user can enter it, not write in it
    uid, gid = other_user
    try:
        out = py(f"""
            import os
            import tpu_nb
            from tpu_nb.runtime.environment import setup
            os.setgid({gid}); os.setuid({uid})
            try:
                setup("cpu", cache_dir={str(tmp_path / "cache")!r})
            except tpu_nb.TpuNbError as exc:
                print("RESULT", exc)
        """).stdout
    finally:
        made = (tmp_path / "cache").exists()
        shutil.rmtree(tmp_path, ignore_errors=True)
    message = out.split("RESULT ", 1)[1].strip()
    assert message.startswith(
        f"the compile cache {tmp_path / 'cache'} cannot be created: "
        f"{tmp_path} is not writable by you. Fix: "
    )
    assert not made  # nothing half-applied


@pytest.mark.stack
def test_replica_traceback_from_a_fresh_worker_shows_the_source_line(py):
    """The runtime is in use, so the replicas run in a fresh worker process, which never saw
    the cell: its traceback must still quote the failing line."""
    out = py(
        """
        from IPython.testing.globalipapp import start_ipython
        ip = start_ipython()
        ip.run_line_magic("load_ext", "tpu_nb")
        ip.run_line_magic("tpu_setup", "--device cpu --devices 2")
        ip.run_cell("import torch, torch_xla\\n"
                    "(torch.ones(2, device=torch_xla.device()) + 1).sum().item()")
        ip.run_cell("%%on_tpu --replicas 2\\nx = 1\\nif index == 1:\\n"
                    "    raise ValueError('boom in replica')\\n")
    """,
        timeout=240,
    ).stdout
    replica = out.split("--- replica 1 of 2: traceback ---", 1)[1]
    assert (
        ", line 4, in <module>\n    raise ValueError('boom in replica')\nValueError: boom "
        "in replica" in replica
    )


from test_files import enterable_tmp, other_user  # noqa: E402,F401  (the second uid)


def test_unknown_users_home_creates_no_folder(shell):
    """`~nobody/x` was taken literally: a folder named `~nobody` in the notebook's folder."""
    with pytest.raises(UsageError):
        shell.run_line_magic("tpu_setup", f"--cache {NO_SUCH_USER}/x")
    assert not os.path.exists(NO_SUCH_USER)
    assert not os.path.exists(os.path.join(os.getcwd(), NO_SUCH_USER))
