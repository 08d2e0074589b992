"""Hosts of a TPU VM slice that are not told their device: they start on the device the
kernel chose, and a host that cannot start is one clear error before any host runs the work.

The fake slice (tests/fake_slice.py) carries a TPU VM's environment with PJRT_DEVICE unset, as
a real TPU VM has: each host's "auto" then picks a TPU this machine does not have (torch_xla:
"libtpu not found").
"""

from __future__ import annotations

import os
import sys
import tempfile

import pytest
from conftest import wait_until
from fake_slice import fake_slice

ray = pytest.importorskip("ray")

import tpu_nb  # noqa: E402
from tpu_nb.runtime.parallel import HostError  # noqa: E402

pytestmark = pytest.mark.timeout(240)
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture(scope="module")
def tpu_vm_slice():
    with fake_slice(2, pod_type="v4-16", topology="2x2x2", pjrt_device=None) as cluster:
        yield cluster


def _device(host):
    import torch_xla.runtime as xr

    return xr.device_type()


def _left_behind() -> set[str]:
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("tpu_nb-host-")}


def test_hosts_run_on_the_device_the_kernel_chose(tpu_vm_slice):
    # This process ran tpu_nb.setup("cpu") (conftest), as %tpu_setup --device cpu does.
    assert tpu_nb.runtime.environment.chosen_device() == "cpu"
    result = tpu_nb.launch_hosts(_device, hosts="all", stream=None)
    assert result.values == ["CPU", "CPU"]


def test_a_host_that_cannot_start_its_device_is_one_host_error(tpu_vm_slice, capsys):
    with pytest.raises(HostError) as caught:
        tpu_nb.launch_hosts(_device, hosts="all", device="auto", stream=print)
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("host 0 of 2 failed: could not start: OSError: libtpu not found")
    assert "device 'auto' chose TPU" in message
    assert "PJRT_DEVICE=CPU" in message and "pip install 'torch_xla[tpu]'" in message
    out = capsys.readouterr()
    assert "Traceback" not in out.out + out.err and "[host" not in out.out
    # Everything released: the slice's bundles free again, no host folder left (the folders
    # are removed by a call the driver does not wait for).
    wait_until(lambda: _left_behind() == set(), timeout=30, what="the host folders to go")
    assert tpu_nb.launch_hosts(_device, hosts="all", stream=None).values == ["CPU", "CPU"]


def test_a_host_whose_set_up_raises_is_one_host_error(tpu_vm_slice):
    # An explicit device the hosts cannot have: each host's own setup() refuses it.
    def work(host):
        return host

    with pytest.raises(HostError, match=r"^host 0 of 2 failed: could not start: ") as caught:
        tpu_nb.launch_hosts(work, hosts="all", device="tpu", stream=None)
    assert "Fix: " in str(caught.value)


def test_an_unknown_device_is_refused_before_any_host_starts(tpu_vm_slice):
    with pytest.raises(tpu_nb.TpuNbUsageError, match="device must be 'auto', 'cpu' or 'tpu'"):
        tpu_nb.launch_hosts(_device, hosts="all", device="gpu", stream=None)
