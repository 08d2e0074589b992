"""Do no harm: `%%on_tpu` and the extension ask the device for exactly what the same code asks
without them, and what they print points at the user's code.

Figures are torch_xla's own counters, read directly (torch_xla._XLAC), never through tpu_nb.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch_xla

import tpu_nb

pytestmark = pytest.mark.timeout(300)

# torch_xla's counters for the work a cell asks of the device.
RAW = {
    "compiles": "UncachedCompile",
    "cache_hits": "CachedCompile",
    "executions": "ExecuteComputation",
    "syncs": "MarkStep",
    "host_reads": "aten::_local_scalar_dense",
}


def raw() -> dict[str, int]:
    return {k: torch_xla._XLAC._xla_counter_value(n) or 0 for k, n in RAW.items()}


def counted(shell, cell: str, *, settle: bool = False):
    """Run `cell`; its result and the raw counters' deltas around it. `settle`: the test
    waits for the device before reading them (torch_xla counts an execution on its own
    thread once it has run: a sync returns before that)."""
    before = raw()
    result = shell.run_cell(cell)
    if settle:
        import torch_xla.core.xla_model as xm

        xm.wait_device_ops()  # torch_xla's own wait, not tpu_nb's (the spies count those)
    after = raw()
    assert result.error_before_exec is None and result.error_in_exec is None, result.error_in_exec
    return result, {k: after[k] - before[k] for k in after}


@pytest.mark.stack
def test_a_read_in_an_on_tpu_cell_does_the_plain_cells_work_and_no_more(shell, capsys):
    """`acc = (x * 2).mean(); print(acc.item())`: one compile, one execution, no sync, one
    read — with or without %%on_tpu. A sync at the cell's end ran acc's graph again (after
    `.item()` torch_xla leaves the tensor pending): 2 compiles and 2 executions."""
    cell = "acc = (x * 2).mean(); print(acc.item())\n"
    work = {}
    # each run on a fresh size, so that each compiles what it asks for (no cache in between)
    for size, how in ((11, "plain"), (12, "%%on_tpu"), (13, "%%on_tpu -o")):
        shell.run_cell(f"x = torch.arange({size}.0, device=torch_xla.device())")
        counted(shell, "torch_xla.sync()", settle=True)
        prefix = "" if how == "plain" else f"{how}\n"
        result, work[how] = counted(shell, prefix + cell)
        assert f"{size - 1:.1f}" in capsys.readouterr().out.splitlines()
    assert work["plain"] == {
        "compiles": 1,
        "cache_hits": 0,
        "executions": 1,
        "syncs": 0,
        "host_reads": 1,
    }
    assert work["%%on_tpu"] == work["%%on_tpu -o"] == work["plain"]
    report = result.result
    # the report's figures are those counters, and it says what the cell left pending
    m = report.metrics
    assert (m.compiles, m.executions, m.syncs, m.host_reads) == (1, 1, 0, 1)
    assert report.pending is not None and "acc" in report.pending.holders
    # run again: everything cached, still the same work
    _, again = counted(shell, "%%on_tpu\n" + cell)
    _, plain_again = counted(shell, cell)
    assert again == plain_again == {**work["plain"], "compiles": 0, "cache_hits": 1}


@pytest.mark.stack
def test_sync_is_opt_in_and_named_as_tpu_nbs_own(shell, capsys):
    shell.run_cell("x = torch.arange(17.0, device=torch_xla.device()); torch_xla.sync()")
    result, work = counted(shell, "%%on_tpu --sync -o\nacc = (x * 2).mean(); print(acc.item())")
    # asked for: a sync the plain cell does not make, which runs acc's graph again
    assert work["syncs"] == 1 and work["executions"] == 2
    report = result.result
    assert report.synced_at_end and report.pending is None
    text = repr(shell.display_formatter.formatters["text/plain"](report))
    assert "tpu_nb's end-of-cell sync (--sync)" in text
    assert "user torch_xla.sync" not in text, text
    (end,) = [f for f in report.findings if f.place == "end of cell"]
    assert "by tpu_nb's end-of-cell sync" in end.what and end.kind == "compile"


@pytest.mark.stack
def test_work_left_pending_is_named_by_its_variables_and_counted_where_it_runs(shell):
    result, work = counted(
        shell,
        "%%on_tpu -o\n"
        "lin = torch.nn.Linear(3, 2)\n"  # built on the host, moved: its weights are data
        "y = lin(torch.ones(1, 3))\n"
        "z = y * 2\n"
        "z = z + 1\n",
    )
    assert work["executions"] == work["syncs"] == work["compiles"] == 0
    report = result.result
    pending = [f for f in report.findings if f.kind == "pending"]
    assert [(f.line, f.what) for f in pending if f.line] == [(3, "y holds work not run yet")]
    # z is assigned on two lines: said so, at the end of the cell
    assert any(f.what.startswith("z (assigned on lines 4, 5) holds") for f in pending), pending
    (graph,) = [f for f in pending if "IR nodes" in f.what]
    # what is pending: the forward and the two ops after it
    assert graph.place == "end of cell" and "aten::addmm" in graph.what, graph.what
    assert "the next sync or value read runs it" in graph.what
    assert not graph.hint  # a fact, no advice
    # A later cell's read runs it, and that cell counts it.
    _, later = counted(shell, "z.sum().item()")
    assert later["executions"] == 1 and later["compiles"] + later["cache_hits"] == 1


@pytest.mark.stack
def test_an_attribute_named_like_a_pending_variable_names_no_variable(shell):
    """`t.view(2, 2)` calls a method: an earlier cell's variable `view`, holding work of its
    own, is not the cell's, and its work is not this cell's to report."""
    shell.run_cell("view = torch.arange(6.0, device=torch_xla.device()) * 3")
    result, _ = counted(
        shell,
        "%%on_tpu -o\nt = torch.ones(4, device=torch_xla.device())\nt.add_(1)\n"
        "flat = t.view(2, 2)\n",
    )
    pending = [f.what for f in result.result.findings if f.kind == "pending"]
    assert not [w for w in pending if w.startswith("view")], pending
    assert any(w.startswith("flat holds work not run yet") for w in pending), pending
    (graph,) = [w for w in pending if "IR nodes" in w]
    assert "aten::mul" not in graph, graph  # `view`'s multiplication is the earlier cell's
    shell.run_cell("del view")


@pytest.mark.stack
def test_a_cells_value_no_variable_holds_is_named_with_its_pending_work(shell):
    """`conv1d(signal, edge)` on a cell's last line: its result is pending until IPython
    shows it, after the report; the report names it with the rest, and counts no more work
    than the plain cell does. A value a variable holds is named by the variable alone."""
    setup = (
        "signal = torch.arange(16.0, device=torch_xla.device()).reshape(1, 1, 16)\n"
        "edge = torch.tensor([[[1.0, 0.0, -1.0]]], device=torch_xla.device())\n"
    )
    _, plain = counted(shell, setup + "torch.nn.functional.conv1d(signal, edge)\n", settle=True)
    result, work = counted(
        shell, "%%on_tpu\n" + setup + "torch.nn.functional.conv1d(signal, edge)\n", settle=True
    )
    # the plain cell compiled the graph the tracked one finds in the cache
    looked_up = [w["compiles"] + w["cache_hits"] for w in (work, plain)]
    assert looked_up[0] == looked_up[1] and work["executions"] == plain["executions"], work
    assert work["syncs"] == plain["syncs"] and work["host_reads"] == plain["host_reads"]
    report = tpu_nb.last_report()
    pending = [f.what for f in report.findings if f.kind == "pending"]
    assert any(w.startswith("the cell's value holds work not run yet") for w in pending), pending
    (graph,) = [w for w in pending if "IR nodes" in w]
    assert "aten::convolution" in graph or "aten::conv" in graph, graph
    counted(shell, "%%on_tpu\n" + setup + "out = torch.nn.functional.conv1d(signal, edge)\nout\n")
    pending = [f.what for f in tpu_nb.last_report().findings if f.kind == "pending"]
    assert not [w for w in pending if "the cell's value" in w], pending
    assert any(w.startswith("out holds work not run yet") for w in pending), pending


@pytest.mark.stack
def test_a_plain_cell_waits_for_the_device_only_for_the_line_it_prints(shell, monkeypatch, capsys):
    import tpu_nb.runtime.environment as environment

    waits = []
    real_wait = environment.wait_device_ops

    def counting_wait(*args, **kwargs):  # a spy on tpu_nb's own function: the real wait runs
        waits.append(1)
        return real_wait(*args, **kwargs)

    monkeypatch.setattr(environment, "wait_device_ops", counting_wait)
    shell.run_cell("x = torch.arange(5.0, device=torch_xla.device()); torch_xla.sync()")
    capsys.readouterr()
    waits.clear()
    _, shown = counted(shell, "(x * 3).sum().item()")
    assert len(waits) == 1 and "XLA: " in capsys.readouterr().out
    shell.run_line_magic("config", "TpuNb.show_xla_line = False")
    try:
        waits.clear()
        _, quiet = counted(shell, "(x * 3).sum().item()")
        _, synced = counted(shell, "y = x * 4; torch_xla.sync()", settle=True)
        assert waits == [] and "XLA: " not in capsys.readouterr().out
    finally:
        shell.run_line_magic("config", "TpuNb.show_xla_line = True")
    assert {**shown, "compiles": 0, "cache_hits": 0} == {**quiet, "compiles": 0, "cache_hits": 0}
    assert synced["syncs"] == synced["executions"] == 1


# -- warnings and tracebacks point at the user's line ----------------------------------------


WARNING_CELL = """\
t = torch.ones(3, requires_grad=True, device=torch_xla.device()).sum()
v = float(t)
c = torch.tensor(t)
def helper(u):
    return torch.tensor(u)
h = helper(t)
"""


@pytest.mark.stack
def test_a_torch_warning_names_the_users_line_not_tpu_nb(py):
    """float() of a tensor that requires grad warns once per process (TORCH_WARN_ONCE): a
    fresh process with a real shell, which runs the cell under %%on_tpu."""
    out = py(
        """
        import json, linecache, warnings
        from IPython.testing.globalipapp import start_ipython
        ip = start_ipython()
        ip.run_line_magic("load_ext", "tpu_nb")
        ip.run_line_magic("tpu_setup", "--device cpu")
        ip.run_cell("import torch, torch_xla")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = ip.run_cell("%%on_tpu\\n" + CELL)
        assert result.error_in_exec is None, result.error_in_exec
        found = [
            dict(file=w.filename, line=w.lineno, text=linecache.getline(w.filename, w.lineno),
                 shown=warnings.formatwarning(w.message, w.category, w.filename, w.lineno))
            for w in caught
            if "requires_grad=True to a scalar" in str(w.message)
            or "To copy construct from a tensor" in str(w.message)
        ]
        print(json.dumps(found))
        """.replace("CELL", repr(WARNING_CELL))
    ).stdout
    caught = json.loads(out.strip().splitlines()[-1])
    assert len(caught) == 3, caught
    for w in caught:
        assert "tpu_nb" not in w["file"], w
        assert "tpu_nb" not in w["shown"], w
    # where each warning says it came from is the cell's own line, as Python displays it
    assert [w["text"].strip() for w in caught] == [
        "v = float(t)",
        "c = torch.tensor(t)",
        "return torch.tensor(u)",
    ]
    lines = ["%%on_tpu", *WARNING_CELL.splitlines()]
    assert [w["line"] for w in caught] == [
        lines.index(text) + 1
        for text in ("v = float(t)", "c = torch.tensor(t)", "    return torch.tensor(u)")
    ]


@pytest.mark.stack
def test_an_error_raised_through_a_wrapper_shows_no_tpu_nb_frame(shell, capsys):
    capsys.readouterr()
    result = shell.run_cell("%%on_tpu\nbad = torch.ones(2)\nint(bad)\n")
    assert isinstance(result.error_in_exec, ValueError)
    shown = capsys.readouterr()
    text = shown.out + shown.err
    assert "int(bad)" in text, text
    assert "tpu_nb/runtime" not in text, text


def test_track_in_a_script_makes_no_sync_and_the_same_work(py):
    """In a script, `with tpu_nb.track():` around code that leaves work pending does what the
    code does without it (compared by raw counters, each in its own process)."""
    code = f"""
        import json, sys, torch, torch_xla, tpu_nb
        tpu_nb.setup("cpu")
        X = torch_xla._XLAC
        names = {RAW!r}
        x = torch.arange(9.0, device=torch_xla.device()); torch_xla.sync()
        X._xla_wait_device_ops([])  # its execution is counted when it ends: before `before`
        before = {{k: X._xla_counter_value(n) or 0 for k, n in names.items()}}
        if sys.argv[-1] == "track":
            with tpu_nb.track() as report:
                acc = (x * 2).mean(); v = acc.item()
            assert report.pending.holders == ("acc",), report.pending
        else:
            acc = (x * 2).mean(); v = acc.item()
        after = {{k: X._xla_counter_value(n) or 0 for k, n in names.items()}}
        print(json.dumps({{k: after[k] - before[k] for k in after}}))
    """
    plain = json.loads(py(code).stdout.splitlines()[-1])
    tracked = json.loads(
        py(code.replace('sys.argv[-1] == "track"', "True")).stdout.splitlines()[-1]
    )
    assert (
        plain
        == tracked
        == {
            "compiles": 1,
            "cache_hits": 0,
            "executions": 1,
            "syncs": 0,
            "host_reads": 1,
        }
    )
    assert tpu_nb  # imported for the conftest's setup


def test_a_sync_tpu_nb_did_not_see_ran_everything_and_sync_true_adds_none():
    """`sync = torch_xla.sync` bound before the run holds the function tpu_nb does not hook:
    the counters then cannot tell whether work is left, the block's tensors can. --sync adds
    no sync when everything ran, and one when work is really left."""
    unhooked = torch_xla.sync
    x = torch.ones(4, device=tpu_nb.device())
    with tpu_nb.track(sync=True) as ran_all:
        y = x * 2
        unhooked()
    assert not ran_all.synced_at_end and ran_all.metrics.syncs == 1, ran_all.summary()
    with tpu_nb.track(sync=True) as left:
        y = x * 3
        unhooked()
        z = y + 1  # noqa: F841 - work left after the sync
    assert left.synced_at_end and left.metrics.syncs == 2, left.summary()
    with tpu_nb.track() as named:
        y = x * 4
        unhooked()
        w = y + 1  # noqa: F841
    assert named.pending is not None and named.pending.holders == ("w",)


@pytest.mark.stack
def test_showing_an_on_tpu_cells_value_runs_its_pending_work_and_is_counted(shell, capsys):
    """The cell's value is shown after the report: what that runs (the value's pending
    graph) gets its own XLA line, as a plain cell's line counts it."""
    capsys.readouterr()
    _, magic = counted(shell, "%%on_tpu\nshown = torch.ones(2, 3) * 3 + 1\nshown\n")
    out = capsys.readouterr().out
    (line,) = [ln for ln in out.splitlines() if ln.startswith("XLA after the report")]
    assert "XLA after the report (showing the cell's value): 1 compiled" in line, out
    _, plain = counted(
        shell, "shown = torch.ones(2, 3, device=torch_xla.device()) * 3 + 1\nshown\n"
    )
    assert {**magic, "compiles": 0, "cache_hits": 0} == {**plain, "compiles": 0, "cache_hits": 0}
    assert magic["compiles"] + magic["cache_hits"] == plain["compiles"] + plain["cache_hits"] == 1


def _tracked_then_rebound(steps: int) -> bool:
    """A function that tracks a loop, then drops its tensor: whether it was freed as soon as
    the function let go of it (as it is without tpu_nb)."""
    import weakref

    import torch

    dev = torch_xla.device()
    with tpu_nb.track():
        for i in range(steps):
            big = torch.full((256, 256), float(i), device=dev) * 2  # rebound every step
            torch_xla.sync()
            gone = weakref.ref(big)
    # the run's end looked for work left pending in this frame's variables
    big = None
    return gone() is None


def test_reading_a_functions_variables_keeps_none_of_them_alive():
    """tpu_nb reads the tracked function's variables (pending work at the end, shapes at a
    sync, a compiled call's arguments). Before Python 3.13 that leaves a snapshot on the
    frame holding every value it saw: a tensor the function rebinds would stay in memory, and
    a pending one would join the next sync's graph."""
    assert _tracked_then_rebound(3)


@pytest.mark.stack
def test_work_an_earlier_cell_left_pending_is_named_at_the_first_sync(shell):
    # An earlier cell leaves `w` pending; the loop's first sync runs it with its first step,
    # in a graph unlike the line's own. Named, and kept out of the line's pattern.
    shell.run_cell(
        "dev = torch_xla.device()\n"
        "x = torch.arange(3.0).to(dev)\n"
        "embed = torch.nn.Embedding(100, 16).to(dev)\n"
        "lengths = (5, 9, 5, 12, 9, 7)\n"
        "sentences = [torch.arange(n) % 100 for n in lengths]\n"
        "torch_xla.sync()"  # nothing pending but what the next cell leaves
    )
    assert shell.run_cell("w = (x.exp() * 3).mean()", store_history=True).success
    left_by = shell.execution_count - 1
    assert shell.run_cell("w2 = w", store_history=True).success  # another name for it
    result, work = counted(
        shell,
        "%%on_tpu -o\n"
        "for tokens in sentences:\n"
        "    vector = embed(tokens.to(dev)).mean(dim=0)\n"
        "    torch_xla.sync()\n",
    )
    report = result.result
    assert report.earlier is not None and "w" in report.earlier.holders
    (earlier,) = [f for f in report.findings if f.kind == "earlier"]
    assert earlier.line == 4 and f"`w` (In [{left_by}])" in earlier.what
    own = [f for f in report.findings if f.kind in ("compile", "warm-up", "recompile")]
    # the line's own graphs: one per length (9, 5, 12, 7), the repeated 9 a cache hit
    assert sum(f.count for f in own) == 4 == work["compiles"] - 1
    assert work["cache_hits"] == 1
    assert "4 graphs" in next(f.pattern for f in own if f.pattern)
    # Nothing pending at the start: no such finding.
    result, _ = counted(
        shell,
        "%%on_tpu -o\nfor t in sentences[:2]:\n    y = embed(t.to(dev))\n    torch_xla.sync()\n",
    )
    assert result.result.earlier is None
    assert not [f for f in result.result.findings if f.kind == "earlier"]
    # Pending again, but the cell rebinds its only holder before its first sync: that work is
    # dropped, never run, and the first step is not blamed on it.
    assert shell.run_cell("w = (x.exp() * 5).mean()").success
    result, work = counted(
        shell,
        "%%on_tpu -o\nw = x.sum()\nfor t in sentences[:2]:\n    y = embed(t.to(dev))\n"
        "    torch_xla.sync()\n",
        settle=True,
    )
    assert result.result.earlier is None and work["executions"] == 2
    said = [f.what for f in result.result.findings]
    assert not [f for f in result.result.findings if f.kind == "earlier"], said
    assert "earlier cells" not in str(result.result)
