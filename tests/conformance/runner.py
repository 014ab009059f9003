"""Runs one case of ``onnx.backend.test.case.node.collect_testcases()`` in the evaluator.

The installed onnx wheel carries the definitions of the node suite but not its data
files: ``collect_testcases`` regenerates model, inputs and expected outputs in memory.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import torch

from onnx_sbs_nb.convert import to_numpy as torch_to_numpy
from onnx_sbs_nb.convert import to_torch as numpy_to_torch
from onnx_sbs_nb.evaluator.compiled import MissingKernelError
from onnx_sbs_nb.evaluator.evaluator import TorchOnnxEvaluator

PASS, WRONG, UNSUPPORTED = "pass", "wrong", "unsupported"


@dataclass
class CaseResult:
    name: str
    ops: list[str]
    status: str
    message: str = ""


def collect_cases() -> list[Any]:
    from onnx.backend.test.case.node import collect_testcases

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [tc for tc in collect_testcases() if tc.kind == "node"]


def case_ops(tc: Any) -> list[str]:
    ops = [n.op_type for n in tc.model.graph.node]
    return sorted(set(ops))


def case_op_map(cases: list[Any]) -> dict[str, str]:
    """The op each case tests: the single node's op, or (for ``*_expanded`` cases, which
    decompose an op into a function body) the op of the case it expands."""
    single = {
        tc.name: tc.model.graph.node[0].op_type for tc in cases if len(tc.model.graph.node) == 1
    }
    res = {}
    for tc in cases:
        if tc.name in single:
            res[tc.name] = single[tc.name]
            continue
        base = tc.name
        for suffix in ("_expanded_ver", "_expanded"):
            if suffix in base:
                base = base[: base.index(suffix)] + base[base.index(suffix) + len(suffix) :]
                base = base.rstrip("_0123456789") if suffix == "_expanded_ver" else base
        if base in single:
            res[tc.name] = single[base]
        else:
            # name the op of the graph that looks most specific: the rarest op in it
            ops = [n.op_type for n in tc.model.graph.node]
            res[tc.name] = _guess_from_name(tc.name, ops)
    return res


def _guess_from_name(name: str, ops: list[str]) -> str:
    flat = name.replace("test_", "").replace("_", "").lower()
    for op_type in sorted(set(ops), key=len, reverse=True):
        if flat.startswith(op_type.lower()):
            return op_type
    return ops[0] if ops else "?"


def _as_array(value: Any) -> Any:
    """Data sets hold numpy arrays, TensorProtos (exotic dtypes), lists (sequences), None."""
    if isinstance(value, onnx.TensorProto):
        return onnx.numpy_helper.to_array(value)
    if isinstance(value, list):
        return [_as_array(v) for v in value]
    return value


def _has_strings(value: Any) -> bool:
    if isinstance(value, list):
        return any(_has_strings(v) for v in value)
    return isinstance(value, np.ndarray) and (value.dtype == np.object_ or value.dtype.kind in "SU")


def _to_torch(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, list):
        return [_to_torch(v) for v in value]
    if _has_strings(value):
        # string tensors travel through the evaluator as numpy object arrays
        return np.asarray(value).astype(object)
    return numpy_to_torch(np.asarray(value))


def compare(expected: Any, got: Any, rtol: float, atol: float) -> str | None:
    """None when equal (dtype and shape exactly, values within tolerance), else why not."""
    if expected is None or got is None:
        return None if expected is None and got is None else f"expected {expected!r}, got {got!r}"
    if isinstance(expected, list):
        if not isinstance(got, list) or len(got) != len(expected):
            return f"expected a sequence of {len(expected)}, got {type(got).__name__}"
        for e, g in zip(expected, got):
            msg = compare(e, g, rtol, atol)
            if msg:
                return msg
        return None
    if _has_strings(np.asarray(expected)):
        return _compare_strings(np.asarray(expected), got)
    if not isinstance(got, torch.Tensor):
        return f"expected a tensor, got {type(got).__name__}"
    exp = np.asarray(expected)
    res = torch_to_numpy(got)
    if res.dtype != exp.dtype:
        return f"dtype: expected {exp.dtype}, got {res.dtype}"
    if res.shape != exp.shape:
        return f"shape: expected {exp.shape}, got {res.shape}"
    if exp.dtype.kind == "V" or exp.dtype.type.__module__.startswith("ml_dtypes"):
        exp, res = exp.astype(np.float32), res.astype(np.float32)
    if not np.allclose(res, exp, rtol=rtol, atol=atol, equal_nan=True):
        bad = ~np.isclose(res, exp, rtol=rtol, atol=atol, equal_nan=True)
        diff = np.abs(res.astype(np.float64) - exp.astype(np.float64))[bad]
        return f"values: {int(bad.sum())} / {bad.size} differ, max abs diff {np.nanmax(diff):.3g}"
    return None


def _compare_strings(expected: np.ndarray, got: Any) -> str | None:
    if not isinstance(got, np.ndarray) or not _has_strings(got) and got.size:
        return f"expected a string tensor, got {type(got).__name__}"
    if got.shape != expected.shape:
        return f"shape: expected {expected.shape}, got {got.shape}"
    exp, res = expected.astype(str), got.astype(str)
    if not np.array_equal(exp, res):
        return f"values: {int((exp != res).sum())} / {exp.size} differ"
    return None


def run_case(tc: Any, **evaluator_options: Any) -> CaseResult:
    ops = case_ops(tc)
    model: onnx.ModelProto = tc.model
    try:
        ev = TorchOnnxEvaluator(model, **evaluator_options)
    except MissingKernelError as e:
        return CaseResult(tc.name, ops, UNSUPPORTED, str(e)[:300])
    except TypeError as e:
        return CaseResult(tc.name, ops, UNSUPPORTED, f"TypeError: {e}"[:300])
    except Exception as e:
        return CaseResult(tc.name, ops, WRONG, f"construction: {type(e).__name__}: {e}"[:300])
    names = ev.input_names
    for inputs, outputs in tc.data_sets:
        inputs, outputs = _as_array(list(inputs)), _as_array(list(outputs))
        try:
            feeds = {n: _to_torch(v) for n, v in zip(names, inputs)}
            got = ev.run(None, feeds)
        except TypeError as e:
            return CaseResult(tc.name, ops, UNSUPPORTED, f"TypeError: {e}"[:300])
        except Exception as e:
            # a kernel that does not handle a variant (an image format) says so with
            # NotImplementedError: unsupported, not a wrong result
            unsupported = "has no torch dtype" in str(e) or isinstance(
                e.__cause__, NotImplementedError
            )
            status = UNSUPPORTED if unsupported else WRONG
            return CaseResult(tc.name, ops, status, f"run: {type(e).__name__}: {e}"[:300])
        for i, (exp, res) in enumerate(zip(outputs, got)):
            msg = compare(exp, res, tc.rtol, tc.atol)
            if msg:
                return CaseResult(tc.name, ops, WRONG, f"output {i}: {msg}")
    return CaseResult(tc.name, ops, PASS)


def run_all(cases: list[Any] | None = None, **evaluator_options: Any) -> list[CaseResult]:
    cases = collect_cases() if cases is None else cases
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [run_case(tc, **evaluator_options) for tc in cases]
