"""In a real kernel: `--max-graphs N` stops the cell at the step where the report's own count
for the line passes N (eager, `torch.compile` and `torch_xla.compile`), and a function past
Dynamo's recompile limit is named with its line and its eager fallback.

One kernel for all of it (a kernel and Dynamo's first import cost seconds); every function
has arithmetic of its own, so no graph below is a cache hit of another's.

Marked `stack`: runs on the current stack and on Colab's (ipykernel 6.17, IPython 7.34).
"""

import re

import pytest
from test_kernel import _notebook, _texts, execute

pytestmark = [pytest.mark.stack, pytest.mark.kernel, pytest.mark.timeout(300)]

SETUP = """\
%load_ext tpu_nb
%tpu_setup --device cpu
import torch, torch_xla, tpu_nb
from tpu_nb.display.reports import group_findings
OWN = ("compile", "warm-up", "state", "variant", "recompile", "growing")

def line_count(line):
    # what the report's rows say line `line` compiled (its inputs' graphs are a row apart)
    rows = group_findings(list(tpu_nb.last_report().findings))
    return sum(g.count for g in rows if g.line == line and g.kind in OWN)

def eager(x):
    y = (x * 2 + 1).sum()
    torch_xla.sync()
    return y

def by_dynamo_f(x):
    return (x * 2 + 3).sum()
by_dynamo = torch.compile(by_dynamo_f, backend="openxla")

def by_torch_xla_f(x):
    return (x * 2 + 5).sum()
by_torch_xla = torch_xla.compile(by_torch_xla_f)

def past_limit_f(x):
    return (x * 3 - 7).sum()
past_limit = torch.compile(past_limit_f, backend="openxla")
"""

# A new size at each step; cell line 4 calls the function.
LOOP = """\
%%on_tpu {options}
for n in range(1, {last}):
    x = torch.ones(n)
    out = {fn}(x)
    torch_xla.sync()
"""
COUNTED = ("eager", "by_dynamo", "by_torch_xla")


def test_max_graphs_and_dynamos_limit_count_as_the_report_does():
    cells = [SETUP]
    for fn in COUNTED:
        cells += [LOOP.format(options="--max-graphs 2", last=21, fn=fn), "print(n, line_count(4))"]
    cells += [
        "import torch._dynamo\ntorch._dynamo.config.recompile_limit = 2",
        LOOP.format(options="", last=7, fn="past_limit"),
    ]
    nb = execute(_notebook(*cells), allow_errors=True)
    for i, fn in enumerate(COUNTED):
        stopped, counted = nb.cells[1 + 2 * i], nb.cells[2 + 2 * i]
        errors = [t for k, t in _texts(stopped) if k == "error"]
        assert len(errors) == 1 and errors[0].startswith("RecompilationError: "), (fn, errors)
        step, graphs = _texts(counted)[0][1].split()
        # Stopped at the step of the line's third graph, not before or after; the report's
        # rows count the graphs the limit counted.
        assert step == "3", (fn, errors)
        if fn == "by_torch_xla":  # its own detector stops the trace before graph 3 compiles
            assert graphs == "2" and "more than 2 distinct graphs traced" in errors[0]
        else:
            assert graphs == "3", (fn, graphs)
            assert "line 4 compiled graph 3 (max_graphs=2)" in errors[0], errors
    report = next(t for k, t in _texts(nb.cells[-1]) if k == "display_data")
    head = re.search(r"past_limit_f \([^)]*\), called at cell line 4: (\d+) graphs", report)
    assert head and head.group(1) == "2", report  # the limit's two, not the one it gave up on
    assert "? (?:0)" not in report, report
    stopped = re.search(
        r"Dynamo stopped compiling it \(recompile_limit reached.*\) and runs it eagerly from "
        r"then on: (\d+) XLA compiles of its eager code",
        report,
    )
    assert stopped and stopped.group(1) == "4", report  # sizes 3 to 6, each its own graph
