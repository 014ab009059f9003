"""Corpus cases that fail on today's engine, each with the issue-10 defect class it shows.

The tests mark them ``xfail(strict=True)``: CI stays green now and turns red the moment a
fix makes one pass (then remove its line here).  Keys: (model, case) where case is
"faithful" or "<kind>-<depth>" (see evaluate.fault_plan).
"""

from __future__ import annotations

_BN = (
    "issue 10 defect class 3: the exporter folded BatchNorm into the Conv and kept the Conv "
    "initializer names; those weights differ from the torch parameters of the same name and "
    "the summary's answer is the first of them (rule leaf) although every Conv consuming it "
    "passes its own-error check"
)
KNOWN_FAILURES: dict[tuple[str, str], str] = {
    ("convbn", "faithful"): _BN,
    ("convbn", "weight-middle"): _BN + " (the injected conv3.weight is never named)",
    ("convbn", "attribute-deep"): _BN + " (the Conv whose pads were changed is never named)",
    ("convbn", "op-shallow"): _BN + " (the Relu turned Sigmoid is never named)",
    ("rnn_stack", "weight-middle"): (
        "issue 10 defect class 4: the LSTM's weights (one initializer W, made by the exporter) "
        "and the values inside its lowering (Transpose/Squeeze/Concat around ONNX LSTM) have no "
        "torch twin; the rerun blames the GRU downstream (its 'torch inputs' are ONNX values of "
        "the LSTM lowering), not the lstm fx node"
    ),
    ("sparse_features", "op-shallow"): (
        "issue 10 defect class 4: a Mul inside the embedding_bag lowering (a Loop-based "
        "function inlined, nodes n1..n20) is changed; the blame goes to the Cast the optimizer "
        "added after it (no fx metadata) paired with torch's getitem of embedding_bag, not "
        "to the embedding_bag fx node"
    ),
    # real exporter bugs (tests/test_corpus_exporter_bugs.py): model "bug:<id>"
}


def known_failure(model: str, case: str) -> str | None:
    return KNOWN_FAILURES.get((model, case))
