"""Real exporter bugs still in this venv's release, with no release that fixes them
(tests/corpus/exporter_bugs.py, BUGS_LIVE): the export made here is wrong today.

- cross_entropy_label_smoothing: torch_lib's aten_cross_entropy_loss drops
  ``label_smoothing``; the control is the same classifier without smoothing.
- avg_pool_divisor_override: aten_avg_pool2d drops ``divisor_override``; the control
  pools with the window's size.
- scatter_reduce_mean: aten_scatter_reduce writes the last source instead of the mean;
  the control reduces with ``amax``.
- mean_dim_int_dtype: aten_mean_dim averages an int64 mask in integers and casts after;
  the control casts the mask first.
- log_sigmoid_large_negative: aten_log_sigmoid is Log(Sigmoid(x)), -inf below about -17;
  the control writes the same loss with ``softplus``.
- erfcx_lower_tail: aten_special_erfcx cancels (1 - Erf(x)) to nothing, so log_ndtr's
  lower tail is wrong; the control's scores stay above -1.

The buggy export must fail with a culprit whose fx node is the op whose lowering is
wrong; the control must pass with no failing pair.  Once this venv installs a later
release, the bug is exported with the release that has it (its venv, made by
scripts/exporter_bug_venvs.sh; skipped with that command when absent).
"""

from __future__ import annotations

import pytest

from tests.corpus.checks import assert_bug_named, assert_export_passes
from tests.corpus.exporter_bugs import (
    BUGS_LIVE,
    LIVE_CONTROLS,
    export_release,
    export_with_release,
    missing_venv,
    run_on_files,
)

pytestmark = pytest.mark.exporter_bugs


@pytest.fixture(scope="session")
def live_exports(tmp_path_factory):
    """Exports per release, once: the bug with the release that has it (this venv's, or
    its own venv once this venv moves on), the control with this venv's."""
    done: dict = {}

    def folder(release, name):
        release = export_release(release)
        reason = missing_venv(release)
        if reason:
            pytest.skip(reason)
        key = (release, name)
        if key not in done:
            root = tmp_path_factory.mktemp(f"live-{release or 'this-venv'}")
            done[key] = export_with_release(release, [name], root)[name]
        return done[key]

    return folder


@pytest.mark.parametrize("bug", [pytest.param(b, id=b.id) for b in BUGS_LIVE])
def test_live_bug_is_named(live_exports, bug):
    res = run_on_files(live_exports(bug.buggy, bug.id), bug.aten_op)
    assert_bug_named(res, bug.buggy, bug)


@pytest.mark.parametrize("bug", [pytest.param(b, id=b.id) for b in BUGS_LIVE])
def test_its_control_passes(live_exports, bug):
    folder = live_exports(None, LIVE_CONTROLS[bug.id])
    assert_export_passes(run_on_files(folder, bug.aten_op))
