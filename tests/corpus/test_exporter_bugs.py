"""Real exporter bugs (tests/corpus/exporter_bugs.py), reproduced with the onnxscript
release that had each one, then exported again with this venv's fixed release.

The buggy exports run in .venv-onnxscript-<ver> (scripts/exporter_bug_venvs.sh) and are
read back from files (model.pt2, model.onnx, inputs.pt), as a user would hand them over.
The summary must name the fx node whose lowering is wrong, through a real comparison (a
node the tool could not run is its own limit, never the answer); the fixed export must
pass with no failing pair.
"""

from __future__ import annotations

import pytest

from tests.corpus.checks import assert_bug_named, assert_export_passes
from tests.corpus.exporter_bugs import (
    BUGS,
    OLD_RELEASES,
    export_with_release,
    missing_venv,
    run_on_files,
)
from tests.corpus.known import known_failure

pytestmark = pytest.mark.exporter_bugs


def _param(bug, case):
    reason = known_failure(f"bug:{bug.id}", case)
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(bug, marks=marks, id=bug.id)


@pytest.fixture(scope="session")
def buggy_exports(tmp_path_factory):
    """{release: {bug id: folder}}, one subprocess per old release."""
    out = {}
    for release in OLD_RELEASES:
        if missing_venv(release):
            continue
        names = [b.id for b in BUGS if b.buggy == release]
        out[release] = export_with_release(release, names, tmp_path_factory.mktemp(release))
    return out


@pytest.fixture(scope="session")
def fixed_exports(tmp_path_factory):
    return export_with_release(None, [b.id for b in BUGS], tmp_path_factory.mktemp("fixed"))


@pytest.mark.parametrize("bug", [_param(b, "buggy") for b in BUGS])
def test_buggy_release_is_named(buggy_exports, bug):
    reason = missing_venv(bug.buggy)
    if reason:
        pytest.skip(reason)
    res = run_on_files(buggy_exports[bug.buggy][bug.id], bug.aten_op)
    assert_bug_named(res, bug.buggy, bug)


@pytest.mark.parametrize("bug", [_param(b, "fixed") for b in BUGS])
def test_fixed_release_passes(fixed_exports, bug):
    assert_export_passes(run_on_files(fixed_exports[bug.id], bug.aten_op))


def test_old_releases_have_a_venv_script():
    """The venv list of the script and of the tests agree."""
    from pathlib import Path

    script = (Path(__file__).parents[2] / "scripts" / "exporter_bug_venvs.sh").read_text()
    for release in OLD_RELEASES:
        assert release in script
