"""User code vs library: decided by where a module was imported from, not by its path's words."""

from __future__ import annotations

import json
import os
import sys

import pytest

from tpu_nb.runtime import sources


@pytest.fixture
def target_dir(tmp_path, monkeypatch):
    """A `pip install --target` folder on sys.path holding one distribution, `fancylib`."""
    target = tmp_path / "target"
    (target / "fancylib").mkdir(parents=True)
    (target / "fancylib" / "core.py").write_text("x = 1\n")
    info = target / "fancylib-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fancylib\nVersion: 1.0\n")
    (info / "top_level.txt").write_text("fancylib\n")
    (info / "RECORD").write_text("fancylib/core.py,,\n")
    monkeypatch.syspath_prepend(str(target))
    return target


def test_a_target_folder_on_the_path_is_library_code(target_dir):
    assert sources.is_library(str(target_dir / "fancylib" / "core.py"))
    assert sources.short_path(str(target_dir / "fancylib" / "core.py")) == "fancylib/core.py"


def test_code_next_to_it_that_no_distribution_names_is_the_users(target_dir):
    mine = target_dir / "my_helpers.py"  # on the same path entry, not installed
    mine.write_text("y = 2\n")
    assert not sources.is_library(str(mine))


def test_words_in_a_path_do_not_decide(tmp_path, monkeypatch):
    # A user's project whose folder happens to be called site-packages-notes is user code.
    folder = tmp_path / "site-packages-notes"
    folder.mkdir()
    (folder / "train.py").write_text("z = 3\n")
    monkeypatch.syspath_prepend(str(folder))
    assert not sources.is_library(str(folder / "train.py"))


def test_stdlib_installed_packages_and_tpu_nb_are_libraries():
    assert sources.is_library(json.__file__)
    assert sources.is_library(pytest.__file__)
    assert sources.is_library(sources.__file__)
    assert sources.is_library("<frozen importlib._bootstrap>")


def test_notebook_cells_and_scripts_are_the_users(tmp_path):
    assert not sources.is_library("/tmp/ipykernel_123/2783419911.py")
    assert not sources.is_library("<ipython-input-3-60aea9fe9df2>")
    script = tmp_path / "train.py"
    script.write_text("")
    assert not sources.is_library(str(script))


def test_cells_are_named_by_the_registered_namer():
    def namer(path):
        return "In [7]" if path == "/tmp/ipykernel_1/42.py" else None

    sources.add_file_namer(namer)
    try:
        assert sources.short_path("/tmp/ipykernel_1/42.py") == "In [7]"
        assert sources.short_path(os.__file__) == "os.py"
    finally:
        sources.remove_file_namer(namer)
    assert sources.short_path("/tmp/ipykernel_1/42.py") == "42.py"
    assert sys.modules["tpu_nb.runtime.sources"] is sources
