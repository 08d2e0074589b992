"""Old tutorials' code: removed torch_xla names say their replacement, spawn failures point to
%%on_tpu --replicas and tpu_nb.launch. The tables are checked against the installed torch_xla."""

from __future__ import annotations

import importlib

import pytest

from tpu_nb.runtime.environment import _legacy as legacy


@pytest.mark.parametrize("key", sorted(legacy.REMOVED))
def test_removed_names_are_really_gone_and_their_replacements_exist(key):
    module_name, name = key
    module = importlib.import_module(module_name)
    legacy.uninstall()
    try:
        assert not hasattr(module, name), f"{module_name}.{name} exists again: update the table"
    finally:
        legacy.install()
    _resolve(legacy.REMOVED[key])


@pytest.mark.parametrize("key", sorted(legacy.DEPRECATED))
def test_deprecated_names_still_exist_and_their_replacements_exist(key):
    module_name, name = key
    assert hasattr(importlib.import_module(module_name), name)
    _resolve(legacy.DEPRECATED[key])


def _resolve(expression: str):
    """'torch_xla.runtime.world_size()' -> the callable it names exists."""
    dotted = expression.split("(")[0]
    module_name, attr = dotted.rsplit(".", 1)
    assert callable(getattr(importlib.import_module(module_name), attr))


@pytest.mark.stack
def test_removed_name_in_a_cell_says_its_replacement(shell):
    legacy.uninstall()
    shell.run_line_magic("reload_ext", "tpu_nb")  # loading the extension installs it
    shell.run_cell("import torch_xla.core.xla_model as xm")
    result = shell.run_cell("xm.xrt_world_size()")
    err = result.error_in_exec
    assert isinstance(err, AttributeError)
    assert "torch_xla.runtime.world_size()" in str(err)
    # Names that exist are untouched; an unknown name is a plain AttributeError.
    assert shell.run_cell("xm.mark_step").error_in_exec is None
    other = shell.run_cell("xm.no_such_name").error_in_exec
    assert isinstance(other, AttributeError) and "tpu_nb" not in str(other)


def test_import_after_install_is_patched(py):
    out = py("""
        import sys
        from tpu_nb.runtime.environment import _legacy as legacy
        legacy.install()
        import torch_xla.core.xla_model as xm
        try:
            xm.get_ordinal()
        except AttributeError as exc:
            print("MSG", exc)
        legacy.uninstall()
        try:
            xm.get_ordinal()
        except AttributeError as exc:
            print("AFTER", exc)
    """).stdout
    assert "MSG" in out and "torch_xla.runtime.global_ordinal()" in out
    assert "AFTER" in out and "global_ordinal" not in out.split("AFTER", 1)[1]


def test_spawn_after_the_runtime_started_points_to_launch(py):
    # The classic notebook failure: xmp.spawn once the kernel has touched XLA.
    out = py(
        """
        from tpu_nb.runtime.environment import _legacy as legacy
        legacy.install()
        import torch, torch_xla
        import torch_xla.distributed.xla_multiprocessing as xmp
        torch.ones(2, device=torch_xla.device()) + 1
        torch_xla.sync()
        def work(index):
            pass
        try:
            xmp.spawn(work, nprocs=8, start_method="fork")
        except Exception as exc:
            print("ERR", type(exc).__name__, exc)
    """,
        timeout=120,
    ).stdout
    assert "ERR" in out, out
    assert "%%on_tpu --replicas" in out and "tpu_nb.launch" in out
