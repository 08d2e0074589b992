"""SPMD can only be switched on before the XLA runtime starts: later, torch_xla 2.9 crashes the
process (SIGSEGV) at the next XLA work. tpu_nb refuses instead, and validates every SPMD
request completely before switching (the switch cannot be undone).

Each scenario runs in a fresh process (the switch is process-wide; a crash must not take the
test run down): a real IPython shell with the extension, on XLA:CPU with 4 devices.

Not marked `stack`: what is checked is the runtime's refusal and validation, the same under any
IPython; `%%on_tpu --spmd` itself runs on Colab's stack in test_kernel.py, its usage errors in
test_bad_input.py.
"""

from __future__ import annotations

import json

SHELL = """
import json, os, sys
import tpu_nb
from IPython.core.error import UsageError
from IPython.testing.globalipapp import start_ipython
ip = start_ipython()
ip.run_line_magic("load_ext", "tpu_nb")
ip.run_line_magic("tpu_setup", "--device cpu --devices 4")
ip.run_cell("import torch, torch_xla, tpu_nb")

def magic_error(line, cell="ran = True"):
    try:
        ip.run_cell_magic("on_tpu", line, cell)
    except UsageError as exc:
        return str(exc)
    return None

def state():
    return {"spmd": os.environ.get("XLA_USE_SPMD"), "started": tpu_nb.detect().runtime_initialized,
            "ran": "ran" in ip.user_ns}
"""


def _result(proc) -> dict:
    return json.loads(proc.stdout.split("RESULT", 1)[1].strip().splitlines()[0])


def test_spmd_after_xla_work_is_refused_and_the_kernel_lives_on(py):
    proc = py(
        SHELL
        + """
ip.run_cell("w = torch.randn(8, 8, device=torch_xla.device()); before = (w @ w).sum().item()")
refused = magic_error("--spmd")
try:
    tpu_nb.launch(lambda spmd: 1, mode="spmd")
    api = None
except tpu_nb.TpuNbError as exc:
    api = str(exc)
after = state()
ip.run_cell("again = (w @ w).sum().item()\\n"
            "fresh = (torch.ones(3) * 2).to(torch_xla.device()).sum().item()")
print("RESULT", json.dumps({"magic": refused, "api": api, "state": after,
                            "same": ip.user_ns["again"] == ip.user_ns["before"],
                            "fresh": ip.user_ns["fresh"]}))
""",
        timeout=300,
    )
    assert proc.returncode == 0
    out = _result(proc)
    for message in (out["magic"], out["api"]):
        assert message.startswith(
            "cannot switch to SPMD: this process already used the XLA "
            "device without it, and torch_xla 2.9 crashes the process "
            "(SIGSEGV) at the next XLA work when SPMD is switched on"
        )
        assert (
            "Fix: restart the kernel and run the SPMD cell (%%on_tpu --spmd, or "
            "launch(..., mode='spmd')) before any other XLA work" in message
        )
        assert "\n" not in message
    assert out["state"] == {"spmd": None, "started": True, "ran": False}
    assert out["same"] and out["fresh"] == 6.0


def test_invalid_spmd_requests_leave_the_process_as_it_was_then_a_valid_one_works(py):
    proc = py(
        SHELL
        + """
errors = [magic_error(line) for line in ("--spmd 0", "--spmd abc", "--spmd 2x2x2",
                                         "--spmd 512")]
from tpu_nb.runtime.parallel import spmd_context
api = []
for devices, mesh in (("all", "3"), (0, None), (True, None), (4, "2x3")):
    try:
        spmd_context(devices, mesh)
    except tpu_nb.TpuNbError as exc:
        api.append(str(exc))
untouched = state()
ip.run_cell_magic("on_tpu", "--spmd 2x2 --quiet",
                  "batch = shard_batch(torch.arange(32.0).reshape(8, 4))\\n"
                  "total = (batch * 2).sum().item()")
print("RESULT", json.dumps({"errors": errors, "api": api, "untouched": untouched,
                            "after": state(), "devices": ip.user_ns["spmd"].devices,
                            "total": ip.user_ns["total"]}))
""",
        timeout=300,
    )
    out = _result(proc)
    assert all(e and "Fix:" in e and "\n" not in e for e in out["errors"] + out["api"])
    assert "mesh '0' is not a shape like 4 or 2x2" in out["errors"][0]
    assert "mesh '2x2x2'" in out["errors"][2] and "mesh '512'" in out["errors"][3]
    assert out["api"][0] == ("a 3x1 mesh needs 3 devices; this runtime has 4. Fix: --spmd 4.")
    assert out["api"][1].startswith("devices must be 'all' or a whole number from 1 to 256; got 0.")
    assert "got True" in out["api"][2]
    assert out["api"][3].startswith("a 2x3 mesh has 6 devices, not 4.")
    assert out["untouched"] == {"spmd": None, "started": False, "ran": False}
    assert out["after"]["spmd"] == "1" and out["devices"] == 4 and out["total"] == 992.0


def test_a_second_spmd_cell_needs_no_switch_and_a_new_count_is_refused(py):
    proc = py(
        SHELL
        + """
ip.run_cell_magic("on_tpu", "--spmd --quiet", "a = shard_batch(torch.ones(8, 2)).sum().item()")
ip.run_cell_magic("on_tpu", "--spmd 4 --quiet", "b = shard_batch(torch.ones(8, 2)).sum().item()")
print("RESULT", json.dumps({"a": ip.user_ns["a"], "b": ip.user_ns["b"],
                            "other": magic_error("--spmd 2")}))
""",
        timeout=300,
    )
    out = _result(proc)
    assert out["a"] == out["b"] == 16.0
    assert out["other"] == (
        "SPMD over 2 devices, but the runtime started with 4. Fix: restart "
        "the kernel and run %tpu_setup --devices 2 (tpu_nb.setup('cpu', "
        "num_devices=2)) before the first XLA computation."
    )
