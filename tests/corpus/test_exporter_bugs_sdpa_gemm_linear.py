"""Three more real exporter bugs (tests/corpus/exporter_bugs.py, BUGS2), each exported
with a release that has it and with one that does not, then read back from files.

- sdpa_fully_masked_row: a regression of onnxscript 0.6.1 (#2654) still in 0.7.2, the
  release this venv installs: the buggy export is this venv's, the correct one is
  onnxscript 0.6.0's (.venv-onnxscript-0.6.0).
- gemm_beta_bn (optimizer: BatchNorm fused into a Gemm with beta != 1) and
  linear_1d_weight (torch_lib: a 1-D weight leaves an extra axis): buggy in 0.7.0
  (.venv-onnxscript-0.7.0), fixed in 0.7.2.

The buggy export must fail with a culprit whose fx node is the op whose lowering is wrong,
found by a real comparison (never a node the tool could not run); the correct export
must pass with no failing pair.  A missing venv skips with the command that creates it.
"""

from __future__ import annotations

import pytest

from tests.corpus.checks import assert_bug_named, assert_export_passes
from tests.corpus.exporter_bugs import BUGS2, export_with_release, missing_venv, run_on_files
from tests.corpus.known import known_failure

pytestmark = pytest.mark.exporter_bugs


def _param(bug, case):
    reason = known_failure(f"bug:{bug.id}", case)
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(bug, marks=marks, id=bug.id)


class _Exports:
    """Exports each bug model once per release (one subprocess per old release)."""

    def __init__(self, root) -> None:
        self.root = root
        self._done: dict[str | None, dict] = {}

    def folder(self, release: str | None, bug_id: str):
        if release not in self._done:
            names = [b.id for b in BUGS2 if release in (b.buggy, b.fixed_export)]
            sub = self.root / (release or "this-venv")
            self._done[release] = export_with_release(release, names, sub)
        return self._done[release][bug_id]


@pytest.fixture(scope="session")
def exports2(tmp_path_factory) -> _Exports:
    return _Exports(tmp_path_factory.mktemp("bugs2"))


def _skip_without(release):
    reason = missing_venv(release)
    if reason:
        pytest.skip(reason)


@pytest.mark.parametrize("bug", [_param(b, "buggy") for b in BUGS2])
def test_buggy_release_is_named(exports2, bug):
    _skip_without(bug.buggy)
    res = run_on_files(exports2.folder(bug.buggy, bug.id), bug.aten_op)
    assert_bug_named(res, bug.buggy, bug)


@pytest.mark.parametrize("bug", [_param(b, "fixed") for b in BUGS2])
def test_correct_release_passes(exports2, bug):
    _skip_without(bug.fixed_export)
    assert_export_passes(run_on_files(exports2.folder(bug.fixed_export, bug.id), bug.aten_op))


def test_buggy_exports_really_differ(exports2):
    """The reproduction itself: onnxruntime on the buggy export disagrees with torch
    beyond tolerance (or in shape); on the correct export it agrees."""
    import numpy as np
    import onnxruntime as ort
    import torch

    def gap(folder):
        args = torch.load(folder / "inputs.pt")
        ep = torch.export.load(str(folder / "model.pt2"))
        sess = ort.InferenceSession(str(folder / "model.onnx"))
        feeds = {i.name: a.numpy() for i, a in zip(sess.get_inputs(), args)}
        got = sess.run(None, feeds)[0]
        with torch.no_grad():
            want = ep.module()(*args).numpy()
        if got.shape != want.shape:
            return float("inf")
        return float(np.abs(got.astype(np.float64) - want).max())

    checked = 0
    for bug in BUGS2:
        if missing_venv(bug.buggy) or missing_venv(bug.fixed_export):
            continue
        assert gap(exports2.folder(bug.buggy, bug.id)) > 1e-2, bug.id
        assert gap(exports2.folder(bug.fixed_export, bug.id)) < 1e-4, bug.id
        checked += 1
    if not checked:
        pytest.skip("no venv of an old onnxscript release: bash scripts/exporter_bug_venvs.sh")
