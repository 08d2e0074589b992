"""The default device of %%on_tpu reaches the cell's own code and the modules it builds, never
library code or other cells' functions: the same work as the code written with device=."""

from __future__ import annotations

import pytest

import tpu_nb
from tpu_nb.runtime.errors import TpuNbError

EARLIER_CELL = """
import threading
import torch, torch_xla
dev = torch_xla.device()
def helper_from_earlier_cell():
    return torch.zeros(2)
def collate(batch):
    return torch.tensor(batch)
"""


def _devices(shell, body: str) -> dict:
    shell.run_cell(EARLIER_CELL)
    result = shell.run_cell("%%on_tpu --quiet\n" + body)
    assert result.error_in_exec is None, result.error_in_exec
    return {k: str(v) for k, v in shell.user_ns["seen"].items()}


@pytest.mark.stack
def test_only_the_cells_own_code_gets_the_device(shell):
    seen = _devices(
        shell,
        """
def own_helper():
    return torch.ones(2)
class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.register_buffer("pos", torch.arange(3))
loader = torch.utils.data.DataLoader([[1, 2], [3, 4]], batch_size=1,
                                     collate_fn=lambda b: torch.tensor(b))
other = []
thread = threading.Thread(target=lambda: other.append(torch.zeros(1)))
thread.start(); thread.join()
seen = {
    "cell line": torch.randn(2).device,
    "function defined in the cell": own_helper().device,
    "nn.Linear built here": torch.nn.Linear(2, 2).weight.device,
    "module's buffer": Tiny().pos.device,
    "function from an earlier cell": helper_from_earlier_cell().device,
    "collate_fn called by DataLoader": next(iter(loader)).device,
    "collate_fn from an earlier cell": collate([1]).device,
    "another thread": other[0].device,
    "explicit device=": torch.zeros(1, device="cpu").device,
}
""",
    )
    assert seen == {
        "cell line": "xla:0",
        "function defined in the cell": "xla:0",
        "nn.Linear built here": "xla:0",
        "module's buffer": "xla:0",
        "function from an earlier cell": "cpu",
        "collate_fn called by DataLoader": "cpu",
        "collate_fn from an earlier cell": "cpu",
        "another thread": "cpu",
        "explicit device=": "cpu",
    }


@pytest.mark.stack
def test_adamw_state_stays_where_torch_puts_it(shell):
    # AdamW makes its step counters with torch.tensor(0.0): on the CPU, as without tpu_nb,
    # so optimizer.step() does not read them back from the device every step.
    step = """
model = torch.nn.Linear(4, 2){to}
opt = torch.optim.AdamW(model.parameters())
reads = torch_xla._XLAC._xla_counter_value("aten::_local_scalar_dense") or 0
for _ in range(3):
    model(torch.ones(1, 4{dev})).sum().backward()
    opt.step(); opt.zero_grad()
    torch_xla.sync()
reads = (torch_xla._XLAC._xla_counter_value("aten::_local_scalar_dense") or 0) - reads
seen = {{"step": next(iter(opt.state.values()))["step"].device, "weight": model.weight.device,
        "reads": reads}}
"""
    magic = _devices(shell, step.format(to="", dev=""))
    shell.run_cell(step.format(to=".to(dev)", dev=", device=dev"))
    plain = {k: str(v) for k, v in shell.user_ns["seen"].items()}
    assert magic == plain == {"step": "cpu", "weight": "xla:0", "reads": "0"}


def test_default_device_rejects_what_is_not_a_device():
    with pytest.raises(TpuNbError, match="Fix: default_device()"), tpu_nb.default_device("foo"):
        pass


def test_default_device_in_a_script_covers_the_block_and_restores(py):
    out = py("""
        import torch, torch_xla, tpu_nb
        def library_like():
            return torch.zeros(1).device          # same file: the block's own code
        with tpu_nb.default_device():
            inside = torch.zeros(1).device, library_like(), torch.nn.Linear(2, 2).weight.device
        print("RESULT", *inside, torch.zeros(1).device, torch.zeros.__module__)
    """).stdout
    assert out.split("RESULT")[-1].split() == ["xla:0", "xla:0", "xla:0", "cpu", "torch"]


def test_a_tensor_the_block_moves_names_the_users_line_in_torch_xlas_ir(py):
    # torch_xla records the line that made each tensor (the graph view's `location=`, with
    # XLA_IR_DEBUG=1 as %%on_tpu --graph has it): the user's line, as `.to(dev)` written
    # there would record, never tpu_nb's mover
    out = py(
        """
        import torch, torch_xla, tpu_nb
        with tpu_nb.default_device():
            moved = torch.randn(3, 5)
        text = torch_xla._XLAC._get_xla_tensors_text([moved * 2])
        print("RESULT", next(r for r in text.splitlines() if "device_data" in r and "[3,5]" in r))
        """,
        env={"XLA_IR_DEBUG": "1"},
    ).stdout
    data = out.split("RESULT")[-1]
    assert "_defaults.py" not in data and "_on_host_then_moved" not in data, data
    assert "location=<module>@tpu_nb_test_" in data and ".py:4," in data, data
