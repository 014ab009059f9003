"""Real exporter bugs still in this venv's release, with no release that fixes them
(tests/corpus/exporter_bugs.py, BUGS_LIVE): the export made here is wrong today.

- cross_entropy_label_smoothing: torch_lib's aten_cross_entropy_loss drops
  ``label_smoothing``; the control is the same classifier without smoothing.

The buggy export must fail with a culprit whose fx node is the op whose lowering is
wrong; the control must pass with no failing pair.
"""

from __future__ import annotations

import pytest

from tests.corpus.checks import assert_bug_named, assert_export_passes
from tests.corpus.exporter_bugs import BUGS_LIVE, LIVE_CONTROLS, export_with_release, run_on_files

pytestmark = pytest.mark.exporter_bugs


@pytest.fixture(scope="session")
def live_exports(tmp_path_factory):
    names = [b.id for b in BUGS_LIVE] + [LIVE_CONTROLS[b.id] for b in BUGS_LIVE]
    return export_with_release(None, names, tmp_path_factory.mktemp("live"))


@pytest.mark.parametrize("bug", [pytest.param(b, id=b.id) for b in BUGS_LIVE])
def test_live_bug_is_named(live_exports, bug):
    res = run_on_files(live_exports[bug.id], bug.aten_op)
    assert_bug_named(res, bug.buggy, bug)


@pytest.mark.parametrize("bug", [pytest.param(b, id=b.id) for b in BUGS_LIVE])
def test_its_control_passes(live_exports, bug):
    assert_export_passes(run_on_files(live_exports[LIVE_CONTROLS[bug.id]], bug.aten_op))
