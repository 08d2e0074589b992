"""The dashboard's widgets and magics in a real InteractiveShell, on each notebook stack.

Marked `stack`: runs with the current ipywidgets 8 / IPython 9 and again with Colab's
ipywidgets 7.7.1 / IPython 7.34. Real kernels and comms: test_dashboard_kernel.py.
"""

import re
import threading
import time

import pytest
import torch
import torch_xla
from conftest import sgd_step

import tpu_nb

pytestmark = pytest.mark.stack


def _widget_count() -> int:
    import ipywidgets
    from ipywidgets.widgets import widget

    instances = getattr(widget, "_instances", None)  # ipywidgets 8
    if instances is None:
        instances = ipywidgets.Widget.widgets  # ipywidgets 7
    return len(instances)


def _dashboard_threads():
    return [t for t in threading.enumerate() if t.name == "tpu_nb-dashboard"]


def _step_fn(width=36):
    torch.manual_seed(0)
    return sgd_step(torch.nn.Linear(width, 4).to(tpu_nb.device()), width)


def test_widgets_get_trait_updates_while_running_and_are_closed_at_the_end():
    step = _step_fn()
    before = _widget_count()
    dash = tpu_nb.Dashboard(widgets=True, refresh=0.2)
    dash.start()
    try:
        assert _widget_count() > before and len(_dashboard_threads()) == 1
        seen, charts = set(), set()
        deadline = time.monotonic() + 60  # steps until the view has moved, not for 2.5 s
        while len(seen) < 3 or not charts:
            assert time.monotonic() < deadline, (seen, charts)
            for _ in range(20):
                step()
            match = re.search(r"class='tpunb-steps'>(\d+)<", dash._panels.value)
            seen.add(int(match.group(1)))
            if "<polyline" in dash._step_chart.value:
                charts.add(dash._step_chart.value)
        assert len(seen) >= 3, seen  # the step counter moved while running
        # The live chart (SVG) was drawn during the run.
        assert charts and all("<svg" in c for c in charts)
        assert "Execution" in dash._panels.value and "syncs <b>" in dash._panels.value
    finally:
        dash.stop()
    stats = dash.stats
    assert stats.refreshes <= stats.thread_seconds / 0.2 + 1
    # Charts: at most once a second each, only when their data changed.
    assert stats.chart_draws <= 2 * (stats.thread_seconds / dash.chart_refresh + 1)
    assert _widget_count() == before and not _dashboard_threads()
    assert dash.state.steps >= max(seen) and dash.status == "finished"
    # The final view's charts: SVG again, drawn from the final state.
    assert sorted(dash._svgs) == ["compile", "step"]
    assert all(svg.startswith("<svg") for svg in dash._svgs.values())
    assert "<polyline" in dash._svgs["step"] and "no step completed" not in dash._svgs["step"]


def test_on_tpu_live_shows_the_final_state_and_the_report(shell, capsys):
    capsys.readouterr()
    r = shell.run_cell(
        "%%on_tpu --live\n"
        "lin = torch.nn.Linear(6, 2)\n"
        "for _ in range(5):\n"
        "    lin(torch.ones(3, 6)).sum().backward()\n"
        "    torch_xla.sync()\n"
    )
    assert r.error_in_exec is None
    out = capsys.readouterr().out
    assert "XLA dashboard (finished): 5 steps" in out  # the final view (no kernel: text)
    assert "XLA: " in out and "(incl. device work)" in out  # %%on_tpu's own report
    assert out.index("XLA dashboard (finished)") < out.index("(incl. device work)")
    assert not _dashboard_threads()


def test_on_tpu_live_sync_does_not_count_tpu_nbs_own_sync_as_a_step(shell, capsys):
    capsys.readouterr()
    r = shell.run_cell(
        "%%on_tpu --live --sync -o\n"
        "lin = torch.nn.Linear(7, 2)\n"
        "for _ in range(5):\n"
        "    lin(torch.ones(3, 7)).sum().backward()\n"
        "    torch_xla.sync()\n"
        "pending = lin.weight * 2\n"  # run by %%on_tpu's own sync at the cell's end
    )
    assert r.error_in_exec is None and len(r.result.steps) == 5
    assert "XLA dashboard (finished): 5 steps" in capsys.readouterr().out


def test_on_tpu_live_recompiling_loop_raises_the_alert_and_buckets_settle(shell, capsys):
    capsys.readouterr()
    r = shell.run_cell(
        "%%on_tpu --live\n"
        "import time\n"
        "w = torch.randn(11, 11)\n"  # shapes no other test compiled
        "torch_xla.sync()\n"
        "for i in range(16):\n"
        "    out = (torch.ones(2 + i, 11) @ w).tanh().sum()\n"
        "    torch_xla.sync()\n"
        "    time.sleep(0.04)\n"
    )
    assert r.error_in_exec is None
    out = capsys.readouterr().out
    assert "RECOMPILATION ALERT: cell line 7 compiled 16 distinct graphs (more than 3)" in out
    # The graphs of line 7 were read before they compiled: the changing dimension is named.
    diff = out.split("what differs:")[1]
    assert re.search(r"\w+::\w+ dim 0: 2 \u2192 3 \u2192 4 \u2192 \u2026", diff), diff
    r = shell.run_cell(
        "%%on_tpu --live\n"
        "import time\n"
        "w = torch.randn(13, 13)\n"
        "torch_xla.sync()\n"
        "for i in range(40):\n"
        "    out = (torch.ones(2 + i % 5, 13) @ w).tanh().sum()\n"
        "    torch_xla.sync()\n"
        "    time.sleep(0.04)\n"
    )
    out = capsys.readouterr().out
    assert "RECOMPILATION ALERT" not in out and "RECOMPILED" not in out, out
    assert "compiled 5 distinct graphs, each once, then ran cached" in out
    assert not _dashboard_threads() and torch_xla.sync.__module__ == "torch_xla.torch_xla"


def test_on_tpu_live_failing_cell_shows_failed(shell, capsys):
    capsys.readouterr()
    r = shell.run_cell("%%on_tpu --live\n(torch.ones(2) * 2).sum()\nraise ValueError('bad')\n")
    assert isinstance(r.error_in_exec, ValueError)
    assert "XLA dashboard (failed: ValueError)" in capsys.readouterr().out
    assert not _dashboard_threads()


def test_tpu_dashboard_lives_until_the_end_of_its_cell(shell, capsys):
    capsys.readouterr()
    callbacks = len(shell.events.callbacks["post_run_cell"])
    r = shell.run_cell(
        "%tpu_dashboard --refresh 0.2\n"
        "alive = [t.name for t in __import__('threading').enumerate()]\n"
        "v = (torch.ones(4, device=torch_xla.device()) * 3).sum().item()\n"
    )
    assert r.error_in_exec is None
    assert "tpu_nb-dashboard" in shell.user_ns["alive"]  # running inside the cell
    assert not _dashboard_threads()  # joined when it ended
    assert len(shell.events.callbacks["post_run_cell"]) == callbacks  # hooks removed
    out = capsys.readouterr().out
    assert "XLA dashboard (finished): 0 steps, 1 executions" in out
    assert "1 scalar reads" in out
    assert "read once after the loop" not in out  # one read, no steps: nothing to change
    r = shell.run_cell("%tpu_dashboard\n1 / 0\n")
    assert isinstance(r.error_in_exec, ZeroDivisionError)
    assert "XLA dashboard (failed: ZeroDivisionError)" in capsys.readouterr().out
    assert not _dashboard_threads()


def test_dashboard_as_a_cells_last_expression_is_shown_once(shell, capsys):
    capsys.readouterr()
    shell.run_cell("tpu_nb.dashboard()", store_history=True)
    out = capsys.readouterr().out
    assert out.count("XLA dashboard (finished)") == 1
    assert not _dashboard_threads()


def test_a_finished_dashboard_shows_again_in_a_later_cell(shell, capsys):
    capsys.readouterr()
    shell.run_cell(
        "dash = tpu_nb.dashboard()\n(torch.ones(5, device=torch_xla.device()) * 2).sum()",
        store_history=True,
    )
    assert capsys.readouterr().out.count("XLA dashboard (finished)") == 1
    shell.run_cell("dash", store_history=True)
    assert "XLA dashboard (finished): 0 steps" in capsys.readouterr().out
    shell.run_cell("with tpu_nb.Dashboard() as dash2:\n    pass", store_history=True)
    assert capsys.readouterr().out.count("XLA dashboard (finished)") == 1
    shell.run_cell("dash2", store_history=True)
    assert "XLA dashboard (finished)" in capsys.readouterr().out
    assert not _dashboard_threads()


def test_tpu_dashboard_help_and_mistakes(shell, capsys):
    from IPython.core.error import UsageError

    shell.run_line_magic("tpu_dashboard", "-h")
    out = capsys.readouterr().out
    assert "--refresh" in out and "--alert-graphs" in out and "--no-charts" in out
    for line, words in (
        ("--refresh 0", "--refresh must be a number of seconds"),
        ("--alert-graphs 0", "--alert-graphs must be a whole number"),
        ("--refresh 2 --chart-refresh 1", "chart_refresh"),
        ("--refresh soon", "got 'soon'. Fix: e.g. --refresh 0.5"),
        ("--bogus", "unrecognized arguments"),
    ):
        with pytest.raises(UsageError, match=words):
            shell.run_line_magic("tpu_dashboard", line)
    assert not _dashboard_threads()
    with pytest.raises(UsageError, match="--live watches this kernel"):
        shell.run_cell_magic("on_tpu", "--live --replicas 2", "raise AssertionError('no')")
    shell.run_cell("%%on_tpu --help\nraise AssertionError('must not run')")
    assert "--live" in capsys.readouterr().out


def test_a_failing_final_poll_still_shows_the_last_state_and_says_so(shell, capsys):
    step = _step_fn(width=29)
    capsys.readouterr()
    dash = tpu_nb.Dashboard(widgets=True, refresh=0.2)
    dash.start()
    for _ in range(3):
        step()
    dash.refresh_now()
    real = dash._monitor.poll

    def poll(*, final=False):
        if final:
            raise RuntimeError("the final read failed")
        return real()

    dash._monitor.poll = poll
    dash.stop()
    out = capsys.readouterr().out
    assert "XLA dashboard (finished): 3 steps" in out, out
    assert "the dashboard stopped updating: RuntimeError" in out, out
    assert isinstance(dash.error, RuntimeError) and not _dashboard_threads()
