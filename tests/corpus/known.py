"""Corpus cases that fail on today's engine, each with the issue-10 defect class it shows.

The tests mark them ``xfail(strict=True)``: CI stays green now and turns red the moment a
fix makes one pass (then remove its line here).  Keys: (model, case) where case is
"faithful" or "<kind>-<depth>" (see evaluate.fault_plan).
"""

from __future__ import annotations

_PREPARATION = (
    "the exporter's preparation is reproduced with grad enabled (align/program.py "
    "prepare_program); for swin it raises 'Cannot view a tensor with shape [4, 16, 2, 8] and "
    "strides (256, 8, 128, 1) as (4, 16, 16)' (SDPA with a relative-position mask that "
    "requires grad takes another path than under no_grad, where the export ran), the engine "
    "falls back to ep.run_decompositions() (linear -> addmm, SDPA decomposed), pairs that "
    "program's names with the ONNX names anyway and compares values that only share a name: "
    "view_7|view_7 (Reshape) status=fail err=own=0.339 own_inputs_from=linear_2 (19 values "
    "paired, 278 torch-only, 134 onnx-only); own errors of gelu/gelu_1/unsqueeze_12 (3.7e-4 "
    "to 8e-3) are measured on inputs recomputed through 19-50 lowerings. "
    "See tests/test_corpus2_defects.py (A)"
)
_BF16 = (
    "a Cast whose output is bfloat16 (RMSNorm's type_as, float32 in) runs in onnxruntime and "
    "ends status=error 'Cast failed: RuntimeError: No corresponding Numpy type for Tensor "
    "Type. bfloat16'; the culprit is that Cast (rule error) whatever the fault. Nodes with "
    "bfloat16 inputs are already rerun in the torch evaluator ('onnxruntime: no bfloat16 "
    "input through numpy'), outputs are not. See tests/test_corpus2_defects.py (C)"
)
KNOWN_FAILURES: dict[tuple[str, str], str] = {
    # second zoo (tests/corpus/zoo2.py)
    ("swin", "faithful"): "false alarm: " + _PREPARATION,
    ("swin", "weight-middle"): "culprit view_7 (a name-only pair), not fc1.bias: " + _PREPARATION,
    ("swin", "attribute-deep"): "culprit view_7, not layer_norm_5: " + _PREPARATION,
    ("swin", "op-shallow"): "culprit view_7, not the Softmax in SDPA: " + _PREPARATION,
    ("fft", "op-middle"): (
        "fault Add->Sub inside the lowering of the complex product mul (fx mul is "
        "complex64[2x3x9], its ONNX value float32[2x3x9x2], never paired); the first failing "
        "record is _fft_c2r (err=own=2.81, own_inputs_from='_fft_r2c, mul'), and as mul has "
        "no record the culprit does not give way to it: names _fft_c2r (fft_irfft). See "
        "tests/test_corpus2_defects.py (B)"
    ),
    ("bf16", "faithful"): "false alarm: " + _BF16,
    ("bf16", "weight-deep"): "culprit the Cast error, not val_10 (out.weight): " + _BF16,
    ("bf16", "attribute-shallow"): "culprit the Cast error, not softmax: " + _BF16,
    ("bf16", "op-middle"): "culprit the Cast error, not the Sigmoid of silu: " + _BF16,
}


def known_failure(model: str, case: str) -> str | None:
    return KNOWN_FAILURES.get((model, case))
