"""Corpus cases that fail on today's engine, each with the issue-10 defect class it shows.

The tests mark them ``xfail(strict=True)``: CI stays green now and turns red the moment a
fix makes one pass (then remove its line here).  Keys: (model, case) where case is
"faithful" or "<kind>-<depth>" (see evaluate.fault_plan).
"""

from __future__ import annotations

# Every case the corpus has found so far passes: defects A (the exporter's preparation in
# the wrong grad mode), B (complex values unpaired) and C (bfloat16 outputs through
# onnxruntime) are fixed and their cases run as plain tests (tests/corpus/test_zoo_engine_defects.py).
KNOWN_FAILURES: dict[tuple[str, str], str] = {}


def known_failure(model: str, case: str) -> str | None:
    return KNOWN_FAILURES.get((model, case))
