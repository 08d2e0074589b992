"""In a real kernel: counter resets tpu_nb did not ask for, child processes that import
torch_xla, and `%unload_ext tpu_nb` giving torch_xla back what loading changed.

Marked `stack`: runs on the current stack and on Colab's (ipykernel 6.17, IPython 7.34).
"""

import re

import pytest
from test_kernel import _notebook, _texts, execute

pytestmark = [pytest.mark.stack, pytest.mark.kernel, pytest.mark.timeout(240)]

# Five syncs, a counter reset, five more: ten executions in all.
RESET_CELL = """\
%%on_tpu
x = torch.ones(3)
for i in range(5):
    x = x * 2
    torch_xla.sync()
reset()
for i in range(5):
    x = x * 2
    torch_xla.sync()
"""


def _report(cell) -> str:
    return next(t for k, t in _texts(cell) if k == "display_data")


def test_every_way_of_resetting_the_counters_keeps_the_cells_count():
    # The reset imported by name and the raw entry point saved before the extension loaded
    # are taken first; the saved one is out of tpu_nb's reach, and the report says so.
    paths = {
        "saved": "saved_clear",
        "metrics": "torch_xla.debug.metrics.clear_counters",
        "xlac": "torch_xla._XLAC._clear_xla_counters",
        "by name": "clear_counters",
    }
    cells = [
        "import torch, torch_xla\nfrom torch_xla.debug.metrics import clear_counters\n"
        "saved_clear = torch_xla._XLAC._clear_xla_counters\n"
        "%load_ext tpu_nb\n%tpu_setup --device cpu",
    ]
    for reset in paths.values():
        cells += [f"import torch_xla.debug.metrics\nreset = {reset}", RESET_CELL]
    nb = execute(_notebook(*cells))
    reports = dict(zip(paths, (_report(c) for c in nb.cells[2::2]), strict=True))
    for path, report in reports.items():
        assert re.search(r"\| 10 executed \|", report), (path, report)
        assert re.search(r"executions: 10 \([^0]", report), (path, report)
    for path in ("metrics", "xlac", "by name"):
        assert "could not see" not in reports[path], reports[path]
        found = re.search(r"(\d+) compiled \| 10 executed \| (\d+) cache", reports[path])
        compiled, hits = found.groups()
        assert int(compiled) + int(hits) == 10  # every sync's graph: none lost
    saved = reports["saved"]
    assert "reset where tpu_nb could not see it: compile cache hits, syncs" in saved, saved


CHILD = """\
import subprocess, sys, os
child_code = '''
import torch, torch_xla
def child_compiles_{n}(x):
    return (x * 3 + {n}).sum()
print(child_compiles_{n}(torch.ones({n}, device=torch_xla.device())).item())
'''
"""


# Started before the kernel's first compile: compiles once then, says so, waits for a line
# and compiles again (another size: a graph of its own) while the tracked cell compiles.
EARLY_CHILD = '''\
import subprocess, sys, os
early_code = """
import sys, torch, torch_xla
def child_compiles_5(x):
    return (x * 3 + 5).sum()
print(child_compiles_5(torch.ones(5, device=torch_xla.device())).item(), flush=True)
sys.stdin.readline()
print(child_compiles_5(torch.ones(6, device=torch_xla.device())).item(), flush=True)
"""
early = subprocess.Popen([sys.executable, '-c', early_code], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, text=True)
print(early.stdout.readline().strip())
'''


def test_a_child_process_never_writes_into_the_kernels_compile_log():
    # torch_xla reads PT_XLA_DEBUG_* at a process's first compile, so a child started before
    # the kernel's first compile inherits them; one started after it does not.
    nb = _notebook(
        "%load_ext tpu_nb\n%tpu_setup --device cpu\nimport torch, torch_xla",
        EARLY_CHILD,
        "%%on_tpu\ndef kernel_compiles(n):\n    return (torch.ones(n) * 5).sum().item()\n"
        "early.stdin.write('go\\n'); early.stdin.close()\n"
        "for n in range(2, 12):\n    kernel_compiles(n)\nlater = early.stdout.read().strip()\n"
        "early.wait()",
        CHILD.format(n=9)
        + "out = subprocess.run([sys.executable, '-c', child_code], capture_output=True, "
        "text=True)\nprint(out.returncode, out.stdout.strip())",
        "from tpu_nb.runtime.backend import current\n"
        "print(open(current().process.compile_log_path()).read().count('kernel_compiles'), "
        "sorted(k for k in os.environ if k.startswith('PT_XLA_DEBUG')))\n"
        # a child's frames are in `python -c`'s file, <string>; the kernel's are its cells'
        "print('(<str' + 'ing>:' in open(current().process.compile_log_path()).read())\n"
        "import tpu_nb\nprint(len(tpu_nb.last_report().compile_events), early.returncode, later)",
    )
    execute(nb)
    assert _texts(nb.cells[1]) == [("stdout", "40.0\n")]  # compiled before the kernel did
    assert re.search(r"\| 10 compiled \|", _report(nb.cells[2]))
    assert _texts(nb.cells[3]) == [("stdout", "0 108.0\n")]
    text = "".join(t for k, t in _texts(nb.cells[4]) if k == "stdout")
    counts, child_in_log, cell_events = text.splitlines()
    # the tracked cell's compile events: its own, none of the child's (which compiled again)
    assert cell_events == "10 0 48.0"
    in_log, env = counts.split(" ", 1)
    assert child_in_log == "False"  # no child's compile in the kernel's log
    assert int(in_log) >= 5  # the kernel's log works...
    assert env == "[]"  # ...and children are not handed it once it is latched


def test_unload_gives_torch_xla_its_counter_reset_back_and_says_what_stays():
    nb = _notebook(
        "import torch, torch_xla, torch_xla.debug.metrics\n"
        "raw = torch_xla._XLAC._clear_xla_counters\n"
        "own = torch_xla.debug.metrics.clear_counters\n"
        "%load_ext tpu_nb\n%tpu_setup --device cpu",
        "print(torch_xla._XLAC._clear_xla_counters is raw)\n"
        "print((torch.ones(2, device=torch_xla.device()) + 1).sum().item())",
        "%unload_ext tpu_nb",
        "print(torch_xla._XLAC._clear_xla_counters is raw)\n"
        "import torch_xla.debug.metrics as met\nmet.clear_counters()\n"
        "assert met.clear_counters is own\n"
        "assert met.clear_counters.__module__ == 'torch_xla.debug.metrics'\n"
        "assert not hasattr(met.clear_counters, '__wrapped__')\n"
        "v = (torch.ones(2, device=torch_xla.device()) * 3).sum().item()",
    )
    execute(nb)
    assert _texts(nb.cells[1])[0][1].startswith("False\n4.0\n")  # wrapped while loaded
    ((kind, line),) = _texts(nb.cells[2])
    assert kind == "stdout" and len(line.strip().splitlines()) == 1
    assert "keeps writing compile analysis" in line and "Fix: restart the kernel" in line
    assert _texts(nb.cells[3]) == [("stdout", "True\n")]  # no XLA line: nothing is watching


def test_unload_before_any_compile_takes_the_debug_settings_back():
    nb = _notebook(
        "import os\nbefore = {k: v for k, v in os.environ.items() if k.startswith('PT_XLA')}\n"
        "%load_ext tpu_nb\n%tpu_setup --device cpu\n"
        "print(sorted(k for k in os.environ if k.startswith('PT_XLA_DEBUG')))",
        "%unload_ext tpu_nb\n"
        "print({k: v for k, v in os.environ.items() if k.startswith('PT_XLA')} == before)",
    )
    execute(nb)
    first = _texts(nb.cells[0])[-1][1]
    assert "PT_XLA_DEBUG_FILE" in first and "PT_XLA_DEBUG_LEVEL" in first
    assert _texts(nb.cells[1]) == [("stdout", "True\n")]
