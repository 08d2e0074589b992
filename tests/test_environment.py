"""detect() and setup(): environment facts, problems with exact fixes, all-or-nothing setup."""

import os
from pathlib import Path

import pytest

import tpu_nb
from tpu_nb import TpuNbError


def test_detect_on_this_machine():
    env = tpu_nb.detect()
    assert env.platform == "local"
    assert env.accelerator.kind == "cpu"
    assert env.versions["torch"].startswith("2.9.0")
    assert env.versions["torch_xla"] == "2.9.0"
    assert env.pjrt_device == "CPU"
    assert env.ok, env.report()
    assert "accelerator   CPU" in env.report()


def test_detect_works_without_torch_xla_imported(py):
    out = py(
        """
        import sys, tpu_nb
        env = tpu_nb.detect()
        assert "torch_xla" not in sys.modules and "torch" not in sys.modules, sorted(sys.modules)
        print(env.versions["torch_xla"], env.torch_xla_imported, env.runtime_initialized)
    """,
        cold=True,
    ).stdout
    assert out.split() == ["2.9.0", "False", "False"]


def test_detect_when_torch_xla_cannot_be_imported(py, tmp_path):
    # A torch_xla package that raises on import (as a mismatched _XLAC does) shadows the real one.
    fake = tmp_path / "torch_xla"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "raise ImportError('_XLAC.so: undefined symbol: _ZN5torch4lazy13MetricFnValueB5cxx11Ed')"
    )
    out = py(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        import tpu_nb
        env = tpu_nb.detect()
        print("detect ok", env.versions["torch_xla"])
        try:
            tpu_nb.device()
        except tpu_nb.TpuNbError as e:
            print("ERR", e)
    """).stdout
    assert "detect ok 2.9.0" in out
    err = out.split("ERR ", 1)[1]
    assert "built for different releases" in err
    assert "pip install torch==2.9.0 torch-xla==2.9.0" in err
    assert "Traceback" not in out


def test_problems_each_carry_the_fix(py):
    out = py(
        """
        import tpu_nb
        env = tpu_nb.detect()
        for p in env.problems:
            print(p.code, "|", p.severity, "|", p.fix)
    """,
        env={"XLA_USE_BF16": "1", "PJRT_DEVICE": "CUDA"},
    ).stdout
    rows = dict(line.split(" | ", 1) for line in out.strip().splitlines())
    assert (
        rows["xla-use-bf16"].startswith("warning")
        and "model.to(torch.bfloat16)" in rows["xla-use-bf16"]
    )
    assert rows["xla-gpu"].startswith("error") and "PJRT_DEVICE=CPU" in rows["xla-gpu"]


def test_mismatch_is_reported_with_the_pip_command(py, tmp_path):
    # Metadata of a torch that does not match torch_xla 2.9.0, put in front of the real one.
    dist = tmp_path / "torch-2.10.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.10.0\n")
    out = py(f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        import tpu_nb
        env = tpu_nb.detect()
        p = [p for p in env.problems if p.code == "version-mismatch"][0]
        print(env.ok, "|", p.message, "|", p.fix)
    """).stdout
    ok, message, fix = out.strip().split(" | ")
    assert ok == "False"
    assert "torch 2.10.0 does not match torch_xla 2.9.0" in message
    assert fix.startswith("pip install torch==2.9.0 torch-xla==2.9.0")


def test_doctor_exit_status(py):
    import subprocess
    import sys

    ROOT = Path(__file__).resolve().parents[1]
    ok = subprocess.run(
        [sys.executable, "-m", "tpu_nb", "doctor"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert ok.returncode == 0 and "no problems found" in ok.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "tpu_nb", "doctor"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PJRT_DEVICE": "GPU"},
    )
    assert bad.returncode == 1
    assert "XLA:GPU" in bad.stdout and "fix: set PJRT_DEVICE=TPU or PJRT_DEVICE=CPU" in bad.stdout


@pytest.mark.parametrize(
    "device, words",
    [
        ("gpu", "XLA:GPU was removed from torch_xla 2.9"),
        ("cuda", "XLA:GPU was removed from torch_xla 2.9"),
        ("tpuu", "unknown device 'tpuu'. Fix: use one of 'auto', 'tpu', 'cpu'"),
        ("tpu", "this machine has no TPU"),
    ],
)
def test_setup_bad_device_is_one_line_and_changes_nothing(device, words):
    before = dict(os.environ)
    with pytest.raises(TpuNbError) as info:
        tpu_nb.setup(device, num_devices=2, ir_debug=True)
    assert words in str(info.value) and "\n" not in str(info.value)
    assert dict(os.environ) == before


def test_setup_bad_num_devices():
    with pytest.raises(TpuNbError, match="whole number from 1 to 256"):
        tpu_nb.setup("cpu", num_devices=0)


def test_setup_fresh_process_sets_everything_and_is_idempotent(py):
    out = py(
        """
        import os, tpu_nb
        env = tpu_nb.setup("cpu", num_devices=4, ir_debug=True)
        again = tpu_nb.setup("cpu", num_devices=4, ir_debug=True)
        print(sorted(env.applied)); print(again.applied, again.not_applied)
        for k in ("PJRT_DEVICE", "CPU_NUM_DEVICES", "PT_XLA_DEBUG_LEVEL", "XLA_IR_DEBUG",
                  "XLA_HLO_DEBUG"):
            print(k, os.environ[k])
        print(env.debug_file.endswith(f"compile-analysis-{os.getpid()}.log"))
        import torch, torch_xla, torch_xla.runtime as xr
        print("devices", xr.global_runtime_device_count())
        t = torch.ones(3, device=torch_xla.device()) + 1
        print("location" in torch_xla._XLAC._get_xla_tensors_text([t]))
    """,
        env={"PJRT_DEVICE": None},
    ).stdout.splitlines()
    assert "PJRT_DEVICE=CPU" in out[0] and "CPU_NUM_DEVICES=4" in out[0]
    assert out[1] == "() ()"
    assert out[2:7] == [
        "PJRT_DEVICE CPU",
        "CPU_NUM_DEVICES 4",
        "PT_XLA_DEBUG_LEVEL 1",
        "XLA_IR_DEBUG 1",
        "XLA_HLO_DEBUG 1",
    ]
    assert out[7:] == ["True", "devices 4", "True"]


def test_setup_after_runtime_started_names_what_cannot_apply(py):
    out = py("""
        import tpu_nb, torch, torch_xla
        (torch.ones(2, device=torch_xla.device()) * 2).sum().item()    # started and compiled
        env = tpu_nb.setup("cpu", num_devices=4, ir_debug=True)
        for line in env.not_applied: print("NOT", line)
        for line in env.applied: print("APPLIED", line)
        print([p.code for p in env.problems])
        t = torch.ones(2, device=torch_xla.device()) + 1
        print("IR", torch_xla._XLAC._get_xla_tensors_text([t]))
    """).stdout
    assert "NOT CPU_NUM_DEVICES=4 (now unset): the XLA runtime already started" in out
    assert "NOT PT_XLA_DEBUG_LEVEL=1 (now unset): a graph was already compiled" in out
    # Source locations can still be switched on: they apply to graphs traced from now on.
    assert "APPLIED XLA_IR_DEBUG=1" in out and "APPLIED XLA_HLO_DEBUG=1" in out
    assert "PJRT_DEVICE" not in out  # already CPU: nothing to change
    assert "location=" in out.split("IR ", 1)[1]
    assert "runtime-initialized" in out


def test_setup_after_start_but_before_compile_still_turns_on_analysis(py):
    out = py("""
        import os, tpu_nb, torch, torch_xla
        d = torch_xla.device()                 # runtime started, nothing compiled
        env = tpu_nb.setup("cpu")
        print(env.applied)
        with tpu_nb.track() as r:
            (torch.ones(2, device=d) * 2).sum().item()
        print(len(r.compile_events), r.compile_events[0].kind)
    """).stdout.splitlines()
    assert "PT_XLA_DEBUG_LEVEL=1" in out[0]
    assert out[1] == "1 value-access"


def test_inherited_cpu_num_devices_is_held_to_the_devices_bound(py):
    """A CPU_NUM_DEVICES already in the environment is checked like --devices: a typo would
    otherwise allocate until std::bad_alloc at the first device use."""
    out = py(
        """
        import os, tpu_nb
        from tpu_nb.runtime import TpuNbError
        for value in ("100000000000", "5000", "0", "-1", "abc", "4.5", " "):
            os.environ["CPU_NUM_DEVICES"] = value
            before = dict(os.environ)
            try:
                tpu_nb.setup("cpu")
                print("ACCEPTED", repr(value))
            except TpuNbError as exc:
                message = str(exc)
                print("REFUSED", "\\n" not in message and "Fix:" in message,
                      dict(os.environ) == before, message)
        os.environ["CPU_NUM_DEVICES"] = "100000000000"
        try:
            tpu_nb.device()               # the first device use sets up on its own
        except TpuNbError as exc:
            print("DEVICE", str(exc).split(".")[0])
        print("OVERRIDE", tpu_nb.setup("cpu", num_devices=2).cpu_num_devices)
        os.environ["CPU_NUM_DEVICES"] = "4"
        print("FINE", tpu_nb.setup("cpu").cpu_num_devices)
        """
    ).stdout.splitlines()
    assert not [line for line in out if line.startswith("ACCEPTED")], out
    refused = [line for line in out if line.startswith("REFUSED")]
    assert len(refused) == 7 and all(line.startswith("REFUSED True True") for line in refused)
    assert "CPU_NUM_DEVICES='100000000000' in the environment is not a device count" in out[0]
    assert any(line.startswith("DEVICE CPU_NUM_DEVICES='100000000000' in the") for line in out)
    assert "OVERRIDE 2" in out and "FINE 4" in out
