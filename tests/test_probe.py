"""The one interception layer: every hook is installed once, by the probe, and none is left
behind — whatever order runs end in, and wherever an interrupt lands as a run ends."""

from __future__ import annotations

import dataclasses
import os
import signal
import threading

import pytest
import torch
import torch_xla

import tpu_nb
from tpu_nb.runtime import probe as probe_module
from tpu_nb.runtime import sources
from tpu_nb.runtime.probe import READ_METHODS, probe
from tpu_nb.runtime.tracking import _anatomy, _attribution, _policy, _provenance, _run, _store

INNER = __import__("sys").modules["torch_xla.torch_xla"]
# What torch and torch_xla hold before any run: the hooks must give these back.
ORIGINAL_SYNC = torch_xla.sync
ORIGINAL_INNER_SYNC = INNER.sync
ORIGINAL_READS = {name: getattr(torch.Tensor, name) for name in READ_METHODS}
ORIGINAL_UNIQUE = torch.unique


def assert_originals() -> None:
    assert torch_xla.sync is ORIGINAL_SYNC
    assert INNER.sync is ORIGINAL_INNER_SYNC
    for name, original in ORIGINAL_READS.items():
        assert getattr(torch.Tensor, name) is original, name
    assert torch.unique is ORIGINAL_UNIQUE
    # (the defined kinds a loaded extension holds, such as the counter-reset watch, may stay)
    assert not probe().installed().keys() & {*probe_module.KINDS, "factories", "dynamo-trace"}
    assert _run.current_run() is None and probe().active_runs == ()  # no run left live


@pytest.fixture(autouse=True)
def _starts_clean():
    assert_originals()
    yield
    assert_originals()


_widths = iter(range(5, 10_000))


def steps(n: int = 3, width: int = 4) -> float:
    """n steps of a small loop; width=None: a shape not compiled before in this process (so
    every stage of the run's end has compile events to place)."""
    dev = tpu_nb.device()
    w = torch.ones(width or next(_widths), device=dev)
    for _ in range(n):
        w = w * 0.5 + 1
        torch_xla.sync()
    return w.sum().item()


def test_one_hook_per_entry_point_however_many_listen():
    dev = tpu_nb.device()
    with tpu_nb.track() as outer, tpu_nb.track() as inner, tpu_nb.max_graphs(3):
        hooked = torch_xla.sync
        assert hooked is not ORIGINAL_SYNC and hooked.__wrapped__ is ORIGINAL_SYNC
        assert torch.Tensor.item.__wrapped__ is ORIGINAL_READS["item"]
        value = steps(2)
        torch.ones(2, device=dev).sum().item()
    assert value == pytest.approx(4 * 1.75)
    # each subscriber saw every sync once: the loop's two steps (max_graphs' own sync as it
    # starts, with nothing to run, is no step)
    assert outer.syncs == inner.syncs == 2
    assert len(outer.steps) == len(inner.steps) == 2


def test_the_other_hooks_are_kinds_of_the_probe_and_leave_with_their_holder():
    import logging
    import sys

    from tpu_nb.runtime.environment import _defaults, _legacy

    original_randn = torch.randn
    assert "factories" not in probe().installed()
    with tpu_nb.default_device("cpu"), tpu_nb.default_device("cpu"):
        # one set of wrappers however many blocks are open
        assert probe().installed()["factories"] == len(_defaults.FACTORIES) + 2
        assert torch.randn is not original_randn and torch.randn.__wrapped__ is original_randn
    assert "factories" not in probe().installed() and torch.randn is original_randn

    trace = logging.getLogger("torch.__trace")
    handlers = list(trace.handlers)
    with tpu_nb.track(), tpu_nb.track():
        assert probe().installed()["dynamo-trace"] == 1
        assert len(trace.handlers) == len(handlers) + 1  # one handler for both runs' watches
    assert "dynamo-trace" not in probe().installed() and trace.handlers == handlers

    held = "legacy-names" in probe().installed()  # the extension, loaded by an earlier test
    _legacy.install()
    assert probe().installed()["legacy-names"] == 1 and _legacy._finder in sys.meta_path
    if not held:
        _legacy.uninstall()
        assert "legacy-names" not in probe().installed()
        assert _legacy._finder not in sys.meta_path


def _raising_once(original, error_factory):
    fired = []

    def stage(*args, **kwargs):
        if not fired:
            fired.append(True)
            raise error_factory()
        return original(*args, **kwargs)

    return stage, fired


# Stages of a run's end, in the order `track.__exit__` reaches them.
END_STAGES = [
    (_anatomy.Collector, "finish"),
    (_anatomy, "build"),
    (_provenance.Recorder, "stop"),
    (_run, "snapshot"),
    (_run, "_place"),
    (_store.GraphStore, "note_compiles"),
    (_policy, "judge"),
    (_attribution, "findings"),
    (probe_module.Subscription, "close"),
    (probe_module.Probe, "_uninstall"),
]


@pytest.mark.parametrize(("owner", "name"), END_STAGES, ids=[n for _, n in END_STAGES])
def test_an_interrupt_at_any_stage_of_a_runs_end_leaves_no_hook(monkeypatch, owner, name):
    stage, fired = _raising_once(getattr(owner, name), KeyboardInterrupt)
    monkeypatch.setattr(owner, name, stage)
    with pytest.raises(KeyboardInterrupt), tpu_nb.on_tpu(max_graphs=4):
        steps(2, width=None)
    assert fired, f"{name} was not reached"
    assert_originals()


@pytest.mark.parametrize(("owner", "name"), END_STAGES, ids=[n for _, n in END_STAGES])
def test_a_real_sigint_at_any_stage_of_a_runs_end_leaves_no_hook(monkeypatch, owner, name):
    original = getattr(owner, name)
    fired = []

    def stage(*args, **kwargs):
        if not fired:
            fired.append(True)
            os.kill(os.getpid(), signal.SIGINT)  # delivered at the next check: in the stage
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, stage)
    with pytest.raises(KeyboardInterrupt), tpu_nb.on_tpu():
        steps(2, width=None)
    assert fired
    assert_originals()


def test_an_interrupt_inside_the_run_also_leaves_no_hook():
    with pytest.raises(KeyboardInterrupt), tpu_nb.track() as report:
        steps(1)
        raise KeyboardInterrupt
    assert report.complete and isinstance(report.error, KeyboardInterrupt)
    assert_originals()


def test_runs_ended_out_of_order_leave_the_originals():
    first, second = tpu_nb.track("first"), tpu_nb.track("second")
    a = first.__enter__()
    b = second.__enter__()
    steps(2)
    first.__exit__(None, None, None)  # the outer run ends first
    assert torch_xla.sync is not ORIGINAL_SYNC  # the second still listens
    steps(1)
    second.__exit__(None, None, None)
    assert a.syncs == 2 and b.syncs == 3
    assert_originals()


def test_a_thread_run_outliving_the_cells_run_leaves_the_originals():
    started, release, done = threading.Event(), threading.Event(), threading.Event()
    reports = []

    def background():
        with tpu_nb.track("background") as report:
            started.set()
            release.wait(30)
            steps(1)
        reports.append(report)
        done.set()

    thread = threading.Thread(target=background)
    thread.start()
    assert started.wait(30)
    with tpu_nb.track("cell") as cell:
        steps(1)
    assert cell.complete
    assert torch_xla.sync is not ORIGINAL_SYNC  # the background run still listens
    release.set()
    assert done.wait(60)
    thread.join(30)
    assert reports and reports[0].complete
    assert_originals()


def test_after_an_interrupted_end_a_long_loop_runs_on_the_originals(monkeypatch):
    stage, fired = _raising_once(_anatomy.build, KeyboardInterrupt)
    monkeypatch.setattr(_anatomy, "build", stage)
    tracker = tpu_nb.track()
    with pytest.raises(KeyboardInterrupt), tracker:
        steps(1)
    assert fired
    assert_originals()
    recording = tracker.recorder.recording
    syncs, reads = recording.syncs, sum(o.calls for o in recording.occurrences.values())
    dev = tpu_nb.device()
    t = torch.zeros((), device=dev)
    for _ in range(20_000):
        torch_xla.sync()
        t.item()
    # no hook of the ended run saw the loop: nothing recorded, nothing kept
    assert recording.syncs == syncs
    assert sum(o.calls for o in recording.occurrences.values()) == reads
    assert all(probe().listeners[kind] == () for kind in probe_module.KINDS)
    assert_originals()


def test_the_report_is_empty_during_the_run_and_complete_and_frozen_after():
    with tpu_nb.on_tpu("cell") as report:
        run = _run.current_run()  # what a live view follows
        assert run is not None and run.report is report and not report.complete
        assert report.anatomy is None and isinstance(run.collector, _anatomy.Collector)
        with pytest.raises(dataclasses.FrozenInstanceError):
            report.name = "renamed while running"
        steps(2)
    assert _run.current_run() is None
    assert report.complete and report.name == "cell"
    assert isinstance(report.anatomy, tpu_nb.Anatomy) and len(report.steps) == 2
    assert isinstance(report.findings, tuple) and isinstance(report.occurrences, tuple)
    assert all(isinstance(o, _provenance.Occurrence) for o in report.occurrences)
    assert isinstance(report.compile_events, tuple) and report.line_calls
    with pytest.raises(TypeError):  # read-only mappings, not dicts behind a guard
        report.line_calls[("x", 1)] = 2  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.wall_seconds = 0.0
    copy = dataclasses.replace(report, name="copy")
    assert copy.name == "copy" and copy.metrics == report.metrics
    assert tpu_nb.last_report() is report


def test_a_run_that_raised_is_frozen_too():
    with pytest.raises(ValueError), tpu_nb.track() as report:
        raise ValueError("boom")
    assert isinstance(report.error, ValueError)
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.error = None


def test_the_call_site_rule_is_one_for_every_hook():
    import json
    import sys

    def helper():  # user code calling a library (json) that calls back into user code
        return json.loads("2", parse_int=lambda s: sys._getframe(0))

    callback = helper()
    library = callback.f_back  # json's decoder
    assert sources.is_library(library.f_code.co_filename)
    assert sources.user_frame(callback) is callback  # the callback is the user's own code
    assert sources.user_frame(library).f_code.co_name == "helper"
    # seen from inside json, within a run tracked from this test: the line is this test's,
    # the helper is the user frame under it, json's function the library frame that did it
    here = sys._getframe(0)
    line, user, lib, _ = sources.call_site(library, root=here)
    assert line is here and user.f_code.co_name == "helper" and lib is library
    assert sources.tracked_frame(library, root=here) is here
    assert sources.tracked_frame(library, root=None) is None
