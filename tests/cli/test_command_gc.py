"""The ``onnx-sbs`` process tunes Python's garbage collector for one run
(``cli/gc.py``), and gives it back as it was."""

from __future__ import annotations

import gc
import importlib.metadata

import pytest

from onnx_sbs_nb import __main__ as entry
from onnx_sbs_nb.cli import main as cli
from onnx_sbs_nb.cli.gc import YOUNG_THRESHOLD, one_command_gc


def _state() -> tuple:
    return gc.isenabled(), gc.get_threshold(), gc.get_freeze_count()


def test_imports_collect_nothing_then_are_frozen_and_young_collections_are_rarer():
    before = _state()
    assert before[2] == 0, "the test process froze objects: this test assumes it did not"
    with one_command_gc() as imports_done:
        assert not gc.isenabled()  # importing torch walks nothing
        imported = [object() for _ in range(3)]  # what the imports leave behind
        imports_done()
        assert gc.isenabled()
        assert gc.get_threshold()[0] == max(before[1][0], YOUNG_THRESHOLD)
        assert gc.get_threshold()[1:] == before[1][1:]
        assert gc.get_freeze_count() > 0  # the modules are out of every later collection
        # the run's own garbage is still collected
        cycle: list = []
        cycle.append(cycle)
        del cycle
        assert gc.collect() >= 1
    assert _state() == before
    del imported


def test_the_collector_is_given_back_after_a_failure():
    before = _state()
    with pytest.raises(RuntimeError), one_command_gc() as imports_done:
        imports_done()
        raise RuntimeError("the command failed")
    assert _state() == before
    with pytest.raises(RuntimeError), one_command_gc():
        raise RuntimeError("the imports failed")  # before imports_done: still restored
    assert _state() == before


def test_a_host_that_froze_objects_itself_keeps_them_frozen(monkeypatch):
    """Neither unfrozen nor joined by ours.  (Calls are watched rather than the frozen
    count: a frozen object may still die, and with a whole test process frozen one does
    now and then.)"""
    gc.freeze()
    try:
        calls: list[str] = []
        monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
        monkeypatch.setattr(gc, "unfreeze", lambda: calls.append("unfreeze"))
        before = _state()[:2]
        with one_command_gc() as imports_done:
            imports_done()
            assert calls == []
        assert calls == [] and _state()[:2] == before and gc.get_freeze_count() > 0
    finally:
        monkeypatch.undo()
        gc.unfreeze()


def test_a_disabled_collector_stays_disabled():
    gc.disable()
    try:
        with one_command_gc() as imports_done:
            imports_done()
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_the_command_runs_with_the_tuned_collector(monkeypatch):
    seen = {}

    def fake_main() -> int:
        seen["state"] = _state()
        return 7

    before = _state()
    monkeypatch.setattr(cli, "main", fake_main)
    assert entry.main() == 7
    enabled, thresholds, frozen = seen["state"]
    assert enabled and thresholds[0] >= YOUNG_THRESHOLD and frozen > 0
    assert _state() == before


def test_the_console_script_is_the_tuned_entry():
    (script,) = [
        e for e in importlib.metadata.entry_points(group="console_scripts") if e.name == "onnx-sbs"
    ]
    assert script.value == "onnx_sbs_nb.__main__:main"
    assert script.load() is entry.main
