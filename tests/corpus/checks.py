"""The assertions of a zoo case, shared by the zoo test files: a faithful export has no
failing pair, verdict "pass" and a summary that names nothing; a fault is named."""

from __future__ import annotations

import pytest

from .evaluate import Outcome
from .known import known_failure


def case(model: str, case_id: str, *values, prefix: str = ""):
    """A pytest param for one (model, case), xfail(strict=True) when known to fail."""
    reason = known_failure(model, case_id)
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(model, *values, marks=marks, id=f"{prefix}{model}-{case_id}")


def assert_faithful(out: Outcome) -> None:
    bad = "\n".join(b.line() for b in out.bad[:10])
    assert not out.bad, f"{len(out.bad)} failing pairs on a faithful export:\n{bad}"
    assert out.verdict == "pass", out.summary_text
    assert out.named is None, f"the summary names {out.named.label()}\n{out.summary_text}"


def assert_named(out: Outcome) -> None:
    fault = out.fault
    named = out.named.label() if out.named else "nothing"
    assert out.verdict == "fail", f"{fault.what}: verdict {out.verdict}\n{out.summary_text}"
    assert out.correct, (
        f"injected {fault.what} [{fault.op_type} at {fault.position}]; the summary names "
        f"{named}\n{out.summary_text}"
    )


def assert_bug_named(res, release: str, bug) -> None:
    """A buggy export: FAIL, no tool error, and the summary names the wrong lowering."""
    assert res.verdict == "fail", res.summary_text
    errors = [b.line() for b in res.bad if b.status == "error"]
    assert not errors, "\n".join(errors)
    named = res.named.label() if res.named else "nothing"
    assert res.names_op, (
        f"onnxscript {release}: the lowering of {bug.aten_op} is wrong ({bug.what}); the "
        f"summary names {named} (fx targets {res.named_targets})\n{res.summary_text}"
    )


def assert_export_passes(res) -> None:
    """A correct export: no failing pair, PASS, nothing named."""
    bad = "\n".join(b.line() for b in res.bad[:8])
    assert not res.bad, f"{len(res.bad)} failing pairs on the correct export:\n{bad}"
    assert res.verdict == "pass", res.summary_text
    assert res.named is None, res.summary_text
