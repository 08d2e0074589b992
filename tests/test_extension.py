"""The extension in a real InteractiveShell: magics, hooks, settings, reports.

Marked `stack`: runs on the current IPython and again on Colab's (IPython 7.34).
"""

import os
import re

import pytest
import torch
import torch_xla

import tpu_nb
from tpu_nb.ipython.extension import get_state

pytestmark = pytest.mark.stack


def run(ip, cell):
    result = ip.run_cell(cell)
    return result


def test_expected_stack():
    import IPython

    expected = os.environ.get("TPU_NB_STACK")
    if expected == "colab":
        assert IPython.__version__.startswith("7.34")
    else:
        assert int(IPython.__version__.split(".")[0]) >= 9


def test_load_ext_does_not_import_torch_xla(py):
    out = (
        py(
            """
        import sys, time
        from IPython.testing.globalipapp import start_ipython
        ip = start_ipython()
        ip.run_line_magic("load_ext", "tpu_nb")
        print("RESULT", "torch_xla" in sys.modules, "torch" in sys.modules,
              sorted(ip.magics_manager.magics["cell"]).count("on_tpu"))
    """,
            cold=True,
        )
        .stdout.split("RESULT")[-1]
        .split()
    )  # IPython 7 writes a terminal-title escape
    assert out == ["False", "False", "1"]


def test_reload_and_unload_leave_no_duplicates(shell):
    def count():
        return (
            len(shell.events.callbacks["post_run_cell"]),
            len(shell.events.callbacks["pre_run_cell"]),
            sum(isinstance(c, type(get_state(shell).settings)) for c in shell.configurables),
        )

    loaded = count()
    for _ in range(3):
        shell.run_line_magic("reload_ext", "tpu_nb")
    assert count() == loaded
    shell.run_line_magic("unload_ext", "tpu_nb")
    assert "on_tpu" not in shell.magics_manager.magics["cell"]
    assert "tpu_setup" not in shell.magics_manager.magics["line"]
    # gone: the cell watcher's hook and the interrupt notice's
    assert len(shell.events.callbacks["post_run_cell"]) == loaded[0] - 2
    shell.run_line_magic("load_ext", "tpu_nb")
    assert count() == loaded


def test_a_reload_before_the_first_compile_keeps_the_compile_analysis(py):
    # Unloading before anything compiled puts PT_XLA_DEBUG_* back; the reloaded extension's
    # first cell must set them again, or its compiles have no line.
    out = py("""
        from IPython.testing.globalipapp import start_ipython
        ip = start_ipython()
        ip.run_line_magic("load_ext", "tpu_nb")
        ip.run_line_magic("tpu_setup", "--device cpu")
        ip.run_line_magic("reload_ext", "tpu_nb")
        ip.run_cell("import torch")
        ip.run_cell("%%on_tpu\\nx = torch.linspace(0, 1, 64)\\ns = (x * 2).sum()\\nprint(s.item())")
    """).stdout
    assert "line 4: compiled ×1" in out, out


def test_on_tpu_defaults_the_device_and_returns_the_last_value(shell, capsys):
    r = run(
        shell,
        "%%on_tpu\nimport torch\nt = torch.randn(3, 3)\nlayer = torch.nn.Linear(5, 2)\n"
        "(t.device.type, layer.weight.device.type, str(torch.zeros(1).device))",
    )
    assert r.error_in_exec is None
    assert r.result == ("xla", "xla", "xla:0")
    assert torch.zeros(1).device.type == "cpu"  # restored after the cell
    out = capsys.readouterr().out
    # nothing ran on the device (the work is left pending): the wall time is the code's alone
    assert "(incl. device work)" not in out and "(the cell's code)" in out, out
    run(shell, "%%on_tpu\nu = t * 2\ntorch_xla.sync()")
    out = capsys.readouterr().out
    assert "(incl. device work)" in out.splitlines()[0], out
    assert "(the cell's code and the device's work)" in out, out


def test_on_tpu_report_names_lines_of_the_cell(shell, capsys):
    capsys.readouterr()
    r = run(
        shell,
        "%%on_tpu -o\n"
        "x = torch.linspace(0, 1, 64)\n"
        "h = torch.histc(x, bins=8)\n"
        "s = (x * 2).sum()\n"
        "print(round(s.item(), 3))\n",
    )
    report = r.result
    assert isinstance(report, tpu_nb.RunReport) and report is tpu_nb.last_report()
    assert report.metrics.fallbacks == {"histc": 1}
    assert report.metrics.host_reads == 1
    assert report.record_errors == 0
    out = capsys.readouterr().out
    assert "64.0" in out
    assert "line 3: fell back to the CPU ×1: torch.histc ran on the CPU (aten::histc, 1×)" in out
    assert (
        "line 5: read from the device ×1: .item() read a device value (1×: 1 scalar read, "
        "once)" in out
    )
    assert "line 5: compiled ×1" in out  # the .item() compiled its graph at line 5


def test_failing_cell_reports_and_raises_and_next_cell_runs(shell, capsys):
    capsys.readouterr()
    r = run(
        shell, "%%on_tpu\na = torch.ones(4)\nb = (a * 3).sum().item()\nraise ValueError('bad')\n"
    )
    assert isinstance(r.error_in_exec, ValueError)
    report = tpu_nb.last_report()
    assert (
        isinstance(report.error, ValueError)
        and report.metrics.compiles + report.metrics.cache_hits >= 1
    )
    captured = capsys.readouterr()
    assert "failed: ValueError" in captured.out
    r2 = run(shell, "%%on_tpu\n(torch.ones(2) + 1).sum().item()")
    assert r2.error_in_exec is None and r2.result == 4.0


def test_no_sync_leaves_work_pending(shell):
    # the default since tpu_nb makes no sync of its own; --no-sync is still accepted
    for flags in ("", " --no-sync"):
        r = run(shell, f"%%on_tpu{flags} -o\npending = torch.ones(8) * 7\n")
        assert r.result.metrics.syncs == 0 and r.result.metrics.executions == 0
        assert "aten::mul" in torch_xla._XLAC._get_xla_tensors_text([shell.user_ns["pending"]])
    r = run(shell, "%%on_tpu --sync --no-sync\n1\n")
    assert "choose one of --sync and --no-sync" in str(r.error_in_exec)


def test_max_graphs_stops_at_the_recompiling_step(shell):
    r = run(
        shell,
        "%%on_tpu --max-graphs 2\n"
        "w = torch.randn(8, 8)\n"
        "torch_xla.sync()\n"  # set-up: its own graph, not the loop's
        "for batch in (4, 4, 6, 4, 9):\n"
        "    out = (torch.ones(batch, 8) @ w).sum()\n"
        "    torch_xla.sync()\n",
    )
    err = r.error_in_exec
    assert isinstance(err, tpu_nb.RecompilationError)
    assert tpu_nb.last_report().record_errors == 0
    # torch_xla's detector stops the step that traces the third graph, before it compiles.
    assert "max_graphs=2" in str(err) and "f32[9,8]" in str(err) and "f32[6,8]" in str(err)
    assert shell.user_ns["batch"] == 9


def test_max_graphs_counts_the_first_step(shell, capsys):
    # The report counts the first step's graph; so does the guard: graph 3 of the sync line
    # fails with --max-graphs 2, whatever the set-up synced before the loop.
    r = run(
        shell,
        "%%on_tpu --max-graphs 2\n"
        "w = torch.randn(8, 7)\n"
        "torch_xla.sync()\n"
        "for batch in (3, 5, 7):\n"
        "    out = (torch.ones(batch, 8) @ w).sum()\n"
        "    torch_xla.sync()\n",
    )
    err = r.error_in_exec
    assert isinstance(err, tpu_nb.RecompilationError), err
    assert shell.user_ns["batch"] == 7
    assert "line 6" in str(err)
    # The traceback ends at the user's line: no contextlib or tpu_nb frames shown.
    shell.showtraceback()
    shown = capsys.readouterr().out
    assert "contextlib.py" not in shown, shown
    assert "tpu_nb/runtime" not in shown and "tpu_nb/ipython" not in shown, shown


@pytest.mark.parametrize(
    "line, words",
    [
        ("--device gpu", "XLA:GPU was removed"),
        ("--device tpu", "no TPU"),
        ("--devices 0", "from 1 to 256"),
        ("--nope", "unrecognized arguments"),
        ("--devices two", "--devices must be a whole number"),
    ],
)
def test_tpu_setup_mistakes_are_one_line_and_change_nothing(shell, line, words):
    from IPython.core.error import UsageError

    before = dict(os.environ)
    with pytest.raises(UsageError, match=words):
        shell.run_line_magic("tpu_setup", line)
    assert dict(os.environ) == before


def test_help_flags_print_help(shell, capsys):
    for magic in ("tpu_setup", "xla_metrics", "tpu_time"):
        shell.run_line_magic(magic, "-h")
        assert "--help" in capsys.readouterr().out
    run(shell, "%%on_tpu --help\nraise AssertionError('must not run')")
    assert "--max-graphs" in capsys.readouterr().out


def test_tpu_setup_shows_environment(shell, capsys):
    shell.run_line_magic("tpu_setup", "--device cpu")
    out = capsys.readouterr().out
    assert "accelerator   CPU" in out and "ERROR" not in out
    assert "runtime       initialized" in out


def test_tpu_setup_install_dry_run_streams_pip(shell, capsys):
    shell.run_line_magic("tpu_setup", "--install --dry-run")
    out = capsys.readouterr().out
    assert "pip install torch==2.9.0 torch-xla==2.9.0 --dry-run" in out
    assert "Requirement already satisfied" in out or "Would install" in out


def test_xla_line_after_plain_cells_and_config_switch(shell, capsys):
    capsys.readouterr()
    run(shell, "w2 = (torch.ones(5, device=torch_xla.device()) * 3).sum().item()")
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("XLA: ")]
    assert len(line) == 1 and "1 host read" in line[0] and "1 host reads" not in line[0]
    # Times in the one format (format_seconds): never "0.000s", which reads as free.
    executed = re.search(r"1 executed \((\S+) (s|ms|µs)\)", line[0])
    assert executed and executed.group(1) != "0", line[0]
    shell.run_line_magic("config", "TpuNb.show_xla_line = False")
    run(shell, "w3 = (torch.ones(6, device=torch_xla.device()) * 3).sum().item()")
    assert "XLA: " not in capsys.readouterr().out
    shell.run_line_magic("config", "TpuNb.show_xla_line = True")
    run(shell, "nothing = 1 + 1")
    assert "XLA: " not in capsys.readouterr().out


def test_xla_metrics_views(shell, capsys):
    run(shell, "r5 = (torch.ones(5, device=torch_xla.device()) + 1).sum().item()")
    capsys.readouterr()
    shell.run_line_magic("xla_metrics", "--since-cell")
    out = capsys.readouterr().out
    assert "XLA work of the previous cell" in out and "scalar reads (.item())       1" in out
    shell.run_line_magic("xla_metrics", "--all")
    out = capsys.readouterr().out
    assert "UncachedCompile" in out and "ExecuteTime" in out
    shell.run_line_magic("xla_metrics", "")
    assert "since the kernel started" in capsys.readouterr().out
    from IPython.core.error import UsageError

    with pytest.raises(UsageError):
        shell.run_line_magic("xla_metrics", "--all --reset")


def test_tpu_time_first_run_apart_and_recompile_warning(shell):
    shell.user_ns["m8"] = torch.randn(8, 8, device=torch_xla.device())
    timing = shell.run_line_magic("tpu_time", "-o -n 3 -r 3 (m8 @ m8).relu().sum()")
    assert isinstance(timing, tpu_nb.DeviceTiming)
    assert timing.first_compiles == 1 and timing.steady_compiles == 0
    assert len(timing.per_run) == 3 and timing.median > 0
    shell.user_ns["sizes"] = iter(range(2, 100))
    varying = shell.run_cell_magic("tpu_time", "-o -n 2 -r 2", "torch.ones(next(sizes), 8).sum()")
    assert varying.recompiles and "STILL RECOMPILING" in varying.summary()


def test_same_scenario_through_library_and_magic(shell):
    code = (
        "torch.manual_seed(0)\n"
        "net = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), "
        "torch.nn.Linear(16, 3))\n"
        "opt = torch.optim.SGD(net.parameters(), lr=0.1)\n"
        "for _ in range(3):\n"
        "    opt.zero_grad()\n"
        "    loss = net(torch.ones(4, 12)).sum()\n"
        "    loss.backward()\n"
        "    opt.step()\n"
        "    torch_xla.sync()\n"
    )
    ns = {"torch": torch, "torch_xla": torch_xla}
    source = "\n" + code  # line 1 is the magic's line
    compiled = compile(source, "<scenario>", "exec")  # the block's own code, as a cell's
    with tpu_nb.on_tpu(code=(compiled,), source=source, filename="<scenario>") as lib:
        exec(compiled, ns)
    magic = run(
        shell,
        "%%on_tpu -o\n"
        + code.replace("net", "net2").replace("opt =", "opt2 =").replace("opt.", "opt2."),
    ).result
    # Transfers are left out: the second run finds small constants in the device-data cache.
    for field in ("executions", "syncs", "host_reads"):
        assert getattr(lib.metrics, field) == getattr(magic.metrics, field), field
    assert (
        lib.metrics.compiles + lib.metrics.cache_hits
        == magic.metrics.compiles + magic.metrics.cache_hits
    )
    # The same findings on the same lines (the library's run compiled what the magic reuses).
    assert lib.findings and {f.line for f in lib.findings} >= {10}
    assert {(f.line, f.kind) for f in magic.findings} <= {(f.line, f.kind) for f in lib.findings}


def test_shuffling_dataloader_inside_on_tpu(shell):
    # DataLoader's sampler builds index tensors with CPU generators: they stay on the CPU
    # (torch.set_default_device breaks this), while the cell's own tensors land on the device.
    r = run(
        shell,
        "%%on_tpu\n"
        "from torch.utils.data import DataLoader, TensorDataset\n"
        "data = TensorDataset(torch.arange(40.0, device='cpu').reshape(20, 2),\n"
        "                     torch.arange(20, device='cpu'))\n"
        "loader = DataLoader(data, batch_size=5, shuffle=True,\n"
        "                    generator=torch.Generator().manual_seed(0))\n"
        "seen = []\n"
        "for x, y in loader:\n"
        "    seen += y.tolist()\n"
        "    w = torch.ones(2)\n"
        "    total = (x.to(w.device) * w).sum()\n"
        "unseeded = [y for _, y in DataLoader(data, batch_size=20, shuffle=True)]\n"
        "(sorted(seen), x.device.type, w.device.type, sorted(unseeded[0].tolist()))",
    )
    assert r.error_in_exec is None, r.error_in_exec
    seen, batch_device, ours, unseeded = r.result
    assert seen == list(range(20)) and unseeded == list(range(20))
    assert (batch_device, ours) == ("cpu", "xla")
    assert tpu_nb.last_report().metrics.host_reads == 0  # no sampler seed read from XLA


def test_on_tpu_graph_shows_the_graph_the_cell_leaves_pending(shell, monkeypatch):
    from tpu_nb.display.graph_view import GraphView
    from tpu_nb.ipython import _on_tpu as magics  # where %%on_tpu shows its views

    shown = []
    monkeypatch.setattr(magics, "display", shown.append)
    r = run(shell, "%%on_tpu --graph -o\nga = torch.ones(4, 4)\ngb = (ga @ ga).relu()\n")
    views = [v for v in shown if isinstance(v, GraphView)]
    assert len(views) == 1
    html = views[0]._repr_html_()
    assert "pending graph" in html and "<svg" in html and "aten::mm" in html
    # Nodes carry the cell's lines (recorded for this cell), named after the cell.
    assert any(node.user_frame and node.user_frame.line == 3 for node in views[0].graph.nodes)
    assert "In [" in html
    assert views[0].graph.pending  # captured before anything ran it
    # No sync of tpu_nb's own: the graph stays pending, and the report says what holds it
    # and which lines traced it (their locations were recorded for --graph).
    report = r.result
    assert report.metrics.executions == report.metrics.syncs == 0
    # (ga, built on the host and moved, holds data: nothing pending)
    assert report.pending.holders == ("gb",) and "traced on lines 2, 3" in str(
        [f.what for f in report.findings if f.kind == "pending"]
    )
    assert "left pending: the next sync or read runs it" in html
    shown.clear()
    r = run(shell, "%%on_tpu --graph --sync -o\ngc = torch.ones(4, 4)\ngd = (gc @ gc).relu()\n")
    (view,) = [v for v in shown if isinstance(v, GraphView)]
    assert "about to run at tpu_nb&#x27;s end-of-cell sync" in view._repr_html_()
    assert r.result.metrics.executions == r.result.metrics.syncs == 1  # asked for: it ran
    assert r.result.synced_at_end and r.result.pending is None


def test_xla_graph_magic(shell, capsys):
    run(shell, "gz = torch.ones(3, device=torch_xla.device()) * 5")
    found = shell.run_line_magic("xla_graph", "-o gz")
    assert "aten::mul" in found.ir_text() and len(found.roots) == 1
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match="is a tensor on cpu, which has no pending graph"):
        shell.run_line_magic("xla_graph", "torch.ones(2, device='cpu')")
    with pytest.raises(UsageError, match="could not evaluate 'no_such_name'"):
        shell.run_line_magic("xla_graph", "no_such_name")
    with pytest.raises(UsageError, match="--budget"):
        shell.run_line_magic("xla_graph", "--budget 0 gz")


def test_buckets_in_rotation_are_not_flagged_and_new_shapes_are(shell, capsys):
    # torch_xla's compile cache lives as long as the process: a graph another test compiled
    # (test_reports' `(torch.ones(13, 8) @ wr).sum()`) is a cache hit here. Arithmetic of this
    # test's own keeps every graph below new.
    cell = (
        "wb = torch.randn(8, 8)\n"
        "torch_xla.sync()\n"
        "for rows in (13, 17, 13, 17, 13, 17):\n"
        "    kept = (torch.ones(rows, 8) @ wb).sum() * 29\n"
        "    torch_xla.sync()\n"
    )
    capsys.readouterr()
    run(shell, "%%on_tpu\n" + cell)
    buckets = capsys.readouterr().out
    assert (
        " | 2 compiled | " in buckets.splitlines()[0]
        or " | 3 compiled | " in buckets.splitlines()[0]
    )  # (set-up,) 13 rows, 17 rows
    assert "RECOMPILED" not in buckets and "what to do" not in buckets, buckets
    assert "each compiled once, then no compile in its next" in buckets
    growing = "(19, 23, 29, 31, 37, 41)"
    run(shell, "%%on_tpu\n" + cell.replace("(13, 17, 13, 17, 13, 17)", growing))
    out = capsys.readouterr().out
    assert "RECOMPILED" in out and "pad or bucket" in out, out
    assert "dim 0: 19 \u2192 23 \u2192 29 \u2192 31 \u2192 37 \u2192 41 (6 shapes)" in out, out
    fresh = "(43, 47, 53, 59, 61, 67)"  # shapes not compiled yet: the same six new graphs
    run(shell, "%%on_tpu --max-graphs 6\n" + cell.replace("(13, 17, 13, 17, 13, 17)", fresh))
    allowed = capsys.readouterr().out
    assert "RECOMPILED" not in allowed, allowed
    assert "another graph of this line, within the 6 --max-graphs allows" in allowed, allowed


def test_xla_line_counts_executions_still_running_at_cell_end(shell, capsys):
    run(shell, "big = torch.randn(700, 700, device=torch_xla.device())\ntorch_xla.sync(wait=True)")
    run(shell, "chain = big @ big @ big @ big @ big @ big")
    capsys.readouterr()
    run(shell, "torch_xla.sync()")  # launches the work and returns at once
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("XLA: ")]
    assert len(line) == 1 and "1 executed" in line[0], line


def test_an_empty_cells_table_says_why_in_html_as_in_text():
    from tpu_nb.display.reports import CellsView

    view = CellsView([])
    assert "no cell did XLA work yet" in repr(view)
    assert "no cell did XLA work yet" in view._repr_html_()


def test_cells_table_layout_does_not_depend_on_timings():
    import re

    from tpu_nb.display.reports import CellsView
    from tpu_nb.runtime.metrics import MetricsDelta

    def table(seconds):
        return repr(
            CellsView(
                [
                    (
                        3,
                        "%%on_tpu",
                        MetricsDelta(
                            compiles=1,
                            compile_seconds=seconds,
                            executions=2,
                            execute_seconds=seconds / 7,
                        ),
                    )
                ]
            )
        )

    def mask(text):
        return re.sub(r"\d+(\.\d+)? ?(s|ms|us)\b", "T", text)

    assert mask(table(0.0099)) == mask(table(0.0108)) == mask(table(12.5))


@pytest.mark.stack
def test_code_magics_follow_ipython_conventions(shell, capsys):
    import ast

    # Code is not variable-expanded ({...} and $x stay as written, as in %timeit).
    shell.run_cell("seen = []")
    shell.run_line_magic("tpu_time", 'seen.append("{1+1}")')
    assert shell.user_ns["seen"][0] == "{1+1}"

    # Registered AST transformers run on the cell's code, as in a plain cell.
    class Negate42(ast.NodeTransformer):
        def visit_Constant(self, node):
            return ast.copy_location(ast.Constant(-42), node) if node.value == 42 else node

    transformer = Negate42()
    shell.ast_transformers.append(transformer)
    try:
        shell.run_cell("%%on_tpu --quiet\nvalue = 42")
    finally:
        shell.ast_transformers.remove(transformer)
    assert shell.user_ns["value"] == -42

    # -o returns the report and it is shown once, as Out[n], with its findings.
    capsys.readouterr()
    result = shell.run_cell("%%on_tpu -o\ny = (torch.ones(3) * 2).sum()\nfloat(y)")
    shown = capsys.readouterr().out
    assert shown.count("XLA: ") == 1, shown
    report = result.result
    assert isinstance(report, tpu_nb.RunReport)
    assert any(f.kind == "host-read" and f.line == 3 for f in report.findings)


def test_load_unload_cycles_leave_no_magics_behind(shell):
    """Each %load_ext/%unload_ext cycle used to leave its TpuMagics (with its state and cell
    history) in shell.configurables."""
    import gc

    from tpu_nb.ipython.magics import TpuMagics

    def alive():
        gc.collect()
        listed = sum(isinstance(c, TpuMagics) for c in shell.configurables)
        return listed, sum(isinstance(o, TpuMagics) for o in gc.get_objects())

    # An earlier test's error may still hold the instance loaded then (sys.last_traceback):
    # the baseline is taken after one cycle, and only growth counts.
    shell.run_line_magic("unload_ext", "tpu_nb")
    shell.run_line_magic("load_ext", "tpu_nb")
    listed, before = alive()
    for _ in range(20):
        shell.run_line_magic("unload_ext", "tpu_nb")
        shell.run_line_magic("load_ext", "tpu_nb")
    assert listed == 1 and alive() == (1, before)
    shell.run_line_magic("unload_ext", "tpu_nb")
    assert alive()[0] == 0 and alive()[1] <= before - 1
    # and every hook it put into torch and torch_xla is gone with it
    from tpu_nb.runtime.probe import probe

    assert probe().installed() == {}
    shell.run_line_magic("load_ext", "tpu_nb")


def test_cell_history_is_bounded(shell, capsys):
    from tpu_nb.ipython.extension import MAX_HISTORY

    watcher = get_state(shell).watcher
    shell.run_cell("_x = torch.ones(1).to(torch_xla.device())")
    start = watcher.cells_seen
    for _ in range(MAX_HISTORY + 5):
        shell.run_cell("_x = torch.ones(1).to(torch_xla.device())")  # a transfer each
    capsys.readouterr()
    assert watcher.cells_seen - start == MAX_HISTORY + 5
    assert len(watcher.history) == MAX_HISTORY
    shell.run_line_magic("xla_metrics", "--cells")
    out = capsys.readouterr().out
    assert f"the last {MAX_HISTORY} of {watcher.cells_seen} cells that did XLA work" in out


def test_xla_graph_diff_names_the_line_that_changed_last_not_the_one_captured_last(shell, capsys):
    # the sync on line 6 changes its graph at the second step, the one on line 4 at the
    # fifth; with --max-graphs, line 6 is captured again after it, with the same graph
    run(
        shell,
        "%%on_tpu --max-graphs 3\nfor i in range(6):\n"
        "    a = torch.ones(4 if i < 4 else 5, device=torch_xla.device()) * 2\n"
        "    torch_xla.sync()\n"
        "    b = torch.ones(4 if i < 1 else 5, device=torch_xla.device()).sin()\n"
        "    torch_xla.sync()\n",
    )
    capsys.readouterr()
    shell.run_line_magic("xla_graph", "--diff")
    out = capsys.readouterr().out
    assert re.search(r"the last two graphs of In \[\d+\], line 4", out), out


def test_xla_graph_diff_draws_the_latest_change_with_what_changed(shell, capsys):
    run(
        shell,
        "%%on_tpu\nfor n in (5, 6):\n    dv = torch.ones(n, 3, device=torch_xla.device()) * 2\n"
        "    torch_xla.sync()\n",
    )
    capsys.readouterr()
    diff = shell.run_line_magic("xla_graph", "--diff -o")
    assert diff.before.hash != diff.after.hash
    assert any(c.status == "changed" and "5" in str(c) and "6" in str(c) for c in diff.changes), (
        diff.changes
    )
    shell.run_line_magic("xla_graph", "--diff")
    out = capsys.readouterr().out
    assert re.search(r"the last two graphs of In \[\d+\], line 4", out), out
