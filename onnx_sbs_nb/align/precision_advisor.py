"""The precision advisor: which nodes of a model must stay in float32 when it runs in
float16 (or bfloat16), in the converter's own format.

What Polygraphy's ``debug precision`` and ModelOpt's AutoCast do for their runtimes, for a
torch export: the float32 ONNX model is the reference; its low-precision conversion (the
user's, or one made here with onnxconverter-common's ``convert_float_to_float16``) is the
candidate.  Both run side by side node by node (:func:`~onnx_sbs_nb.align.two_models.
two_model_run`) with own errors: each candidate node is rerun on the reference's values of
its inputs cast to its low precision, so its own error is the error *it* makes in that
precision, not the one it inherits.  A node is named when it does not run in that type,
when that own error exceeds the dtype's tolerance, or when its float32 value does not fit
the type (an overflow: compared in the coarser type, an infinity on both sides would look
equal) and the infinities reach a graph output or a failing node (an attention mask of
float32's lowest value is -inf in float16, and its Softmax gives the same zeros).  Ranked:
nodes that do not run, overflows (largest first), nodes fed overflowing values, then by own
error relative to the scale of their values (``max |v|`` of the reference value).  Their
names in the float32 model are the ``node_block_list`` that ``convert_float_to_float16``
takes; the model is converted again with it and its outputs compared with the float32
model's, before and after.  While they disagree, for a few rounds: nodes newly failing are
added, else the producers of the kept nodes' inputs (rounding their outputs already loses
too much), else the node whose own error, within tolerance, is largest relative to its
values (an error the graph amplifies).

bfloat16: onnxconverter-common converts to float16 only.  The advisor makes a bfloat16
model from the float16 conversion (same block list, same Casts, every float16 type and
value turned to bfloat16, the values taken from the float32 model where it has them), and
runs bfloat16 models with the package's torch evaluator (onnxruntime's CPU kernels mostly
lack bfloat16).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx
import torch

from ..compare.diff import compare
from ..compare.tolerances import default_tolerance
from ..errors import SbsInputError
from ..records import KIND_NODE, KIND_OUTPUT, STATUS_ERROR, STATUS_PRECISION_LOSS, Record
from .pairing.onnx_pairing import cast_value
from .pairing.values import onnx_value_types
from .precision_advice import AdvisedNode, OutputError, PrecisionAdvice
from .precision_convert import (
    _FLOAT_TYPES,
    LOW_DTYPES,
    _float16_module,
    convert_model,
    low_precision_of,
)
from .precision_prune import prune_block_list
from .precision_why import why_disagrees
from .source.fx_metadata import fx_name_from_metadata
from .source.loading import load_exported_program, load_inputs, load_onnx_model

# largest finite value of each low-precision type: a float32 value beyond it overflows
_MAX = {"float16": 65504.0, "bfloat16": float(torch.finfo(torch.bfloat16).max)}
Progress = Callable[[str, float], None]


def _module_path(node: onnx.NodeProto) -> str | None:
    for p in node.metadata_props:
        if p.key == "namespace":
            names = [seg.split(":", 1)[0].strip() for seg in p.value.split("/")]
            return (names[-2] or None) if len(names) >= 2 else None
    return None


def _feeds(ep: Any, model: onnx.ModelProto, args: Any, kwargs: Any) -> dict[str, Any]:
    """The float32 model's feeds: by the program's input names when ``ep`` is given."""
    from .two_models import model_feeds

    args, kwargs = load_inputs(args, kwargs)
    if ep is None:
        return model_feeds(model, {**dict(zip(_input_names(model), args)), **kwargs})
    program = load_exported_program(ep)
    flat = [
        x
        for x in torch.utils._pytree.tree_leaves((tuple(args), dict(kwargs)))
        if isinstance(x, torch.Tensor)
    ]
    names = [
        s.arg.name
        for s in program.graph_signature.input_specs
        if s.kind == torch.export.graph_signature.InputKind.USER_INPUT
        and isinstance(s.arg, torch.export.graph_signature.TensorArgument)
    ]
    if len(flat) != len(names):
        raise SbsInputError(
            f"{len(flat)} input tensors for a program that takes {len(names)} ({names})"
        )
    wanted = set(_input_names(model))
    return model_feeds(model, {n: v for n, v in zip(names, flat) if n in wanted})


def _input_names(model: onnx.ModelProto) -> list[str]:
    inits = {i.name for i in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in inits]


def _run_model(model: onnx.ModelProto, feeds: dict[str, Any], exact: bool) -> list[np.ndarray]:
    """The outputs of a whole model as float32 numpy arrays.  ``exact``: run it with the
    torch evaluator, each node's result stored in the precision the model says
    (onnxruntime's CPU computes float16 nodes in float32 and drops the Casts between them
    whatever the optimization level: its outputs would look more precise than the model)."""
    typed = {}
    for inp in model.graph.input:
        if inp.name in feeds:
            typed[inp.name] = cast_value(feeds[inp.name], inp.type.tensor_type.elem_type or None)
    names = [o.name for o in model.graph.output]
    if exact:
        from ..evaluator.evaluator import TorchOnnxEvaluator

        outs = TorchOnnxEvaluator(model).run(
            None, {k: torch.as_tensor(v) for k, v in typed.items()}
        )
        return [_float32(o) for o in outs]
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    sess = _session(model.SerializeToString(), so)
    np_feeds = {k: (v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in typed.items()}
    return [_float32(o) for o in sess.run(names, np_feeds)]


def _float32(v: Any) -> np.ndarray:
    t = torch.as_tensor(v) if not isinstance(v, torch.Tensor) else v
    t = t.detach().cpu()
    return (t.float() if t.is_floating_point() else t).numpy()


def _candidate_outputs(
    ref: list[np.ndarray], model: onnx.ModelProto, feeds: dict[str, Any], atol: float, rtol: float
) -> OutputError:
    """The error of a converted model's outputs, or why it did not run."""
    try:
        got = _run_model(model, feeds, True)
    except Exception as e:  # a kernel the runtime lacks in this type
        return OutputError(None, None, False, _first_line(e))
    return _output_error(ref, got, atol, rtol)


def _session(data: bytes, so: Any) -> Any:
    """An onnxruntime session of the whole model, or SbsInputError: the advice runs the
    model whole, so an op onnxruntime does not know (or any model it refuses) is bad input,
    said in one line, not a disagreement."""
    import onnxruntime as ort

    try:
        return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    except Exception as e:
        text = " ".join(str(e).split()).split("[ONNXRuntimeError] :", 1)[-1].strip()
        raise SbsInputError(
            f"onnxruntime cannot run the ONNX model ({text[:300]}): the precision advice runs "
            "the whole model with onnxruntime; export it with ops onnxruntime knows"
        ) from None


def _first_line(e: BaseException, limit: int = 200) -> str:
    text = str(e).strip().splitlines()
    line = text[-1] if text else type(e).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _output_error(
    ref: list[np.ndarray], got: list[np.ndarray], atol: float, rtol: float
) -> OutputError:
    err_abs = err_rel = 0.0
    passed = len(ref) == len(got)
    for e, g in zip(ref, got):
        d = compare(e, g, atol=atol, rtol=rtol)
        err_abs = max(err_abs, d.err_abs if d.err_abs is not None else math.inf)
        err_rel = max(err_rel, d.err_rel if d.err_rel is not None else math.inf)
        passed = passed and bool(d.passed)
    return OutputError(err_abs, err_rel, passed)


def _scales(model: onnx.ModelProto, feeds: dict[str, Any]) -> dict[str, float]:
    """max |v| of every float value the float32 model computes (onnxruntime, unoptimized)."""
    import onnxruntime as ort

    types = {vi.name: vi.type.tensor_type.elem_type for vi in model.graph.value_info}
    types.update({o.name: o.type.tensor_type.elem_type for o in model.graph.output})
    produced = [o for n in model.graph.node for o in n.output if o]
    wanted = [o for o in produced if types.get(o, onnx.TensorProto.FLOAT) in _FLOAT_TYPES]
    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    for name in wanted:
        if name not in have:
            m.graph.output.append(onnx.ValueInfoProto(name=name))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    sess = _session(m.SerializeToString(), so)
    np_feeds = {k: (v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in feeds.items()}
    names = [o.name for o in sess.get_outputs()]
    out = {}
    for name, v in zip(names, sess.run(names, np_feeds)):
        v = np.asarray(v)
        if v.dtype.kind == "f" and v.size:
            finite = v[np.isfinite(v)]
            out[name] = float(np.abs(finite).max()) if finite.size else math.inf
    return out


# ---------------------------------------------------------------- the advisor


def _measure(
    reference: onnx.ModelProto,
    candidate: onnx.ModelProto,
    feeds: dict[str, Any],
    dtype: str,
    atol: float | None,
    rtol: float | None,
    scales: dict[str, float],
    runner: str,
    progress: Progress | None,
    phase: str,
) -> tuple[dict[str, AdvisedNode], set[str], int, list[Record], dict[str, AdvisedNode]]:
    """(reference node -> advised node, nodes the candidate keeps in float32, how many
    low-precision nodes were measured, the run's records, the measured nodes within
    tolerance with their own error relative to their values' size)."""
    from .two_models import two_model_run

    producer = {o: n for n in reference.graph.node for o in n.output if o}
    run = two_model_run(
        reference, candidate, feeds, own_error=True, runner=runner, atol=atol, rtol=rtol
    )
    cand_types = onnx_value_types(candidate)
    found: dict[str, AdvisedNode] = {}
    within: dict[str, AdvisedNode] = {}
    failed: set[str] = set()  # own error beyond tolerance, or no run at all
    overflows: set[str] = set()  # values beyond the type's range
    kept: set[str] = set()
    measured: set[str] = set()
    limit = _MAX[dtype]
    with np.errstate(over="ignore"):  # reference values cast to float16 may overflow
        records = list(_with_progress(run, progress, phase))
    for rec in records:
        if rec.kind not in (KIND_NODE, KIND_OUTPUT) or rec.onnx_op_type == "Cast":
            continue
        ref_node = producer.get(rec.ep_name or "")
        if ref_node is None or not ref_node.name or ref_node.op_type == "Cast":
            continue
        cand_type = (rec.onnx_shape_type or "").split("[", 1)[0]
        ref_type = (rec.ep_shape_type or "").split("[", 1)[0]
        if rec.status == STATUS_ERROR:
            declared = cand_types.get(rec.onnx_name or "")
            if declared is not None and declared[0] == LOW_DTYPES[dtype]:
                measured.add(ref_node.name)
                failed.add(ref_node.name)
                found[ref_node.name] = _advised(
                    ref_node, rec.ep_name or "", None, None, scales.get(rec.ep_name or ""),
                    False, "fails", error=_error_line(rec.error),
                )  # fmt: skip
            continue
        if ref_type not in ("float32", "float64"):
            continue
        if cand_type in ("float32", "float64"):
            kept.add(ref_node.name)
            continue
        if cand_type != dtype:
            continue
        scale = scales.get(rec.ep_name)
        overflow = scale is not None and math.isfinite(scale) and scale > limit
        own = rec.err_abs2
        if own is None and not overflow:
            continue
        measured.add(ref_node.name)
        # an overflow: the candidate's infinities against finite values (compared in the
        # low-precision type, both sides would read infinite)
        own = math.inf if own is None or overflow else own
        if overflow:
            overflows.add(ref_node.name)
        elif rec.passed2 is not False:
            if scale and math.isfinite(own):  # within tolerance: a fallback, if needed
                node = _advised(
                    ref_node, rec.ep_name or "", own, own / scale, scale, False, "largest"
                )
                node.atol = rec.atol or 0.0
                prev = within.get(ref_node.name)
                if prev is None or _rank(node) < _rank(prev):
                    within[ref_node.name] = node
            continue
        else:
            failed.add(ref_node.name)
        if overflow:
            rel, reason = math.inf, "overflow"
        else:
            rel = own / scale if scale else (math.inf if own else 0.0)
            fed = [scales.get(i, 0.0) for i in ref_node.input if i]
            reason = "inputs_overflow" if any(f > limit for f in fed) else "error"
            if reason == "error" and rec.status == STATUS_PRECISION_LOSS:
                reason = "precision_loss"
        node = _advised(
            ref_node, rec.ep_name or "", float(own), float(rel), scale, overflow, reason
        )
        prev = found.get(ref_node.name)
        if prev is None or _rank(node) < _rank(prev):
            found[ref_node.name] = node
    harmless = _harmless_overflows(reference, overflows - failed, failed, overflows)
    for name in harmless:
        found.pop(name, None)
    for name in found:
        within.pop(name, None)
    return found, kept, len(measured), records, within


def _advised(
    node: onnx.NodeProto,
    value: str,
    own: float | None,
    rel: float | None,
    scale: float | None,
    overflow: bool,
    reason: str,
    error: str | None = None,
) -> AdvisedNode:
    return AdvisedNode(
        node=node.name,
        op_type=node.op_type if not node.domain else f"{node.domain}::{node.op_type}",
        value=value,
        own_error=own,
        relative_error=rel,
        scale=scale,
        overflow=overflow,
        reason=reason,
        error=error,
        fx_node=fx_name_from_metadata(node),
        module=_module_path(node),
    )


def _error_line(error: str | None) -> str:
    lines = [x for x in (error or "").strip().splitlines() if x.strip()]
    return lines[0][:200] if lines else "it failed to run"


def _harmless_overflows(
    reference: onnx.ModelProto, candidates: set[str], failed: set[str], overflows: set[str]
) -> set[str]:
    """The overflowing nodes whose infinities change nothing: they reach no graph output
    and no node whose own error fails, through nodes that overflow too (or Casts).  An
    attention mask of float32's lowest value becomes -inf in float16, and the Softmax it
    feeds gives the same zeros."""
    nodes = {n.name: n for n in reference.graph.node if n.name}
    consumers: dict[str, list[str]] = {}
    for n in reference.graph.node:
        for i in n.input:
            if i and n.name:
                consumers.setdefault(i, []).append(n.name)
    outputs = {o.name for o in reference.graph.output}
    passing = {"Cast", "Identity"}
    harmless = set()
    for start in candidates:
        seen, todo, matters = {start}, [start], False
        while todo and not matters:
            node = nodes[todo.pop()]
            for o in node.output:
                if o in outputs:
                    matters = True
                    break
                for c in consumers.get(o, ()):
                    if c in failed:
                        matters = True
                        break
                    if c not in seen and (c in overflows or nodes[c].op_type in passing):
                        seen.add(c)
                        todo.append(c)
                if matters:
                    break
        if not matters:
            harmless.add(start)
    return harmless


def _with_progress(run: Any, progress: Progress | None, phase: str) -> Any:
    last = 0.0
    for rec in run:
        if progress is not None and time.monotonic() - last > 0.1:
            last = time.monotonic()
            progress(phase, run.status.fraction)
        yield rec
    if progress is not None:
        progress(phase, 1.0)


_REASON_ORDER = {
    "fails": 0,
    "overflow": 1,
    "inputs_overflow": 2,
    "error": 3,
    "precision_loss": 3,
    "feeds": 4,
    "largest": 5,
}


def _rank(n: AdvisedNode) -> tuple[int, bool, float, float, float]:
    """Worst first: nodes that do not run in the type, values that overflow (largest
    first), nodes fed overflowing values, then by own error relative to the values' size,
    then those added later."""
    rel = 0.0 if n.relative_error is None else n.relative_error
    own = 0.0 if n.own_error is None else n.own_error
    rel = math.inf if math.isnan(rel) else rel
    own = math.inf if math.isnan(own) else own
    scale = n.scale if n.scale is not None and n.reason == "overflow" else 0.0
    # a fallback's values all below the tolerance (1e-40s) come after the others
    tiny = n.reason == "largest" and n.scale is not None and n.scale < n.atol
    return (_REASON_ORDER.get(n.reason, 5), tiny, -scale, -rel, -own)


def _outputs_overflow(model: onnx.ModelProto, scales: dict[str, float], dtype: str) -> str | None:
    """A graph output the model declares in ``dtype`` whose float32 values do not fit it:
    no node kept in float32 helps (the output itself overflows)."""
    producer = {o: n for n in model.graph.node for o in n.output if o}
    for out in model.graph.output:
        scale = scales.get(out.name, 0.0)
        if out.type.tensor_type.elem_type != LOW_DTYPES[dtype] or not scale > _MAX[dtype]:
            continue
        node = producer.get(out.name)
        op = f" ({node.op_type})" if node is not None else ""
        return (
            f"graph output {out.name}{op} is {dtype} and its values reach {scale:.3g}, beyond "
            f"the type's largest finite value: no node kept in float32 helps; keep the "
            "outputs in float32 (keep_io_types=True)"
        )
    return None


def _largest(within: dict[str, AdvisedNode], block: set[str]) -> dict[str, AdvisedNode]:
    """The node, not kept yet, whose own error (within tolerance) is the largest relative
    to its values' size: what is left to try when the outputs disagree and no node fails."""
    left = [n for n in within.values() if n.node not in block and n.own_error]
    if not left:
        return {}
    best = min(left, key=_rank)
    return {best.node: best}


def _upstream(
    reference: onnx.ModelProto, block: set[str], scales: dict[str, float]
) -> dict[str, AdvisedNode]:
    """The nodes computing the float inputs of the blocked nodes, not blocked yet."""
    producer = {o: n for n in reference.graph.node for o in n.output if o}
    by_name = {n.name: n for n in reference.graph.node if n.name}
    out: dict[str, AdvisedNode] = {}
    for b in sorted(block):
        node = by_name.get(b)
        for i in node.input if node is not None else ():
            p = producer.get(i)
            if (
                p is None
                or not p.name
                or p.name in block
                or p.name in out
                or p.op_type in ("Cast", "Constant")
                or i not in scales
            ):
                continue
            out[p.name] = AdvisedNode(
                node=p.name,
                op_type=p.op_type if not p.domain else f"{p.domain}::{p.op_type}",
                value=i,
                own_error=None,
                relative_error=None,
                scale=scales[i],
                overflow=False,
                reason="feeds",
                fx_node=fx_name_from_metadata(p),
                module=_module_path(p),
            )
    return out


def _low_precision_model(
    reference: onnx.ModelProto, converted: Any, dtype: str, keep_io_types: bool | None
) -> tuple[onnx.ModelProto, bool]:
    """The model in ``dtype``: the ``converted`` one checked, else ``reference`` converted
    here; and whether it keeps float32 inputs and outputs."""
    if converted is None:
        keep_io_types = True if keep_io_types is None else keep_io_types
        return convert_model(reference, dtype, (), keep_io_types), keep_io_types
    candidate = load_onnx_model(converted)
    have = low_precision_of(candidate)
    if have != dtype:
        raise SbsInputError(
            f"the converted model computes in {have or 'float32'}, not {dtype}: pass dtype={have!r}"
            if have
            else "the converted model is not in low precision"
        )
    if keep_io_types is None:
        keep_io_types = all(
            i.type.tensor_type.elem_type not in (LOW_DTYPES[dtype],)
            for i in [*candidate.graph.input, *candidate.graph.output]
        )
    return candidate, keep_io_types


def advise_precision(
    ep: Any,
    onx: Any,
    args: Any,
    dtype: str = "float16",
    *,
    kwargs: dict[str, Any] | None = None,
    converted: Any = None,
    keep_io_types: bool | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    max_rounds: int = 4,
    runner: str | None = None,
    progress: Progress | None = None,
) -> PrecisionAdvice:
    """Which nodes of ``onx`` must stay in float32 for it to run in ``dtype``.

    ``ep``: the ExportedProgram (or ``.pt2`` path) ``onx`` was exported from, or None: it
    gives the names of the inputs ``args``/``kwargs`` feed.  ``onx``: the float32 ONNX
    model (the reference).  ``converted``: the user's own low-precision conversion of it
    (the first candidate); without it, ``onx`` is converted here (``keep_io_types``,
    default True).  ``atol``/``rtol``: the tolerance of a node's own error and of the
    outputs (default: ``dtype``'s).  Converts again with the block list found, up to
    ``max_rounds`` times, until the outputs agree or no new node is named.
    """
    start = time.monotonic()
    if dtype not in LOW_DTYPES:
        raise SbsInputError(f"dtype must be one of {sorted(LOW_DTYPES)}, not {dtype!r}")
    if max_rounds < 1:
        raise SbsInputError("max_rounds must be at least 1")
    reference = load_onnx_model(onx)
    low = low_precision_of(reference)
    if low is not None:
        raise SbsInputError(
            f"the model is already in {low}: give the float32 export as the model and this "
            "one as the converted model (converted=..., --converted)"
        )
    _float16_module()  # the advisor converts again in any case: fail before running
    d_atol, d_rtol = default_tolerance(dtype)
    atol = d_atol if atol is None else atol
    rtol = d_rtol if rtol is None else rtol
    bf16 = dtype == "bfloat16"
    runner = runner or ("torch" if bf16 else "onnxruntime")
    feeds = _feeds(ep, reference, args, kwargs)
    candidate, keep_io_types = _low_precision_model(reference, converted, dtype, keep_io_types)
    if progress is not None:
        progress("reference", 0.0)
    scales = _scales(reference, feeds)
    ref_out = _run_model(reference, feeds, False)
    before = _candidate_outputs(ref_out, candidate, feeds, atol, rtol)

    found, kept, measured, records, within = _measure(
        reference, candidate, feeds, dtype, atol, rtol, scales, runner, progress, "round 1"
    )
    nodes = dict(found)
    if not nodes and not before.passed:
        nodes = _largest(within, set())
    block = set(nodes) | kept
    after: OutputError | None = None
    model = candidate if not nodes else None
    rounds = 1
    while nodes and rounds <= max_rounds:
        model = convert_model(reference, dtype, sorted(block), keep_io_types)
        after = _candidate_outputs(ref_out, model, feeds, atol, rtol)
        if after.passed or rounds == max_rounds:
            break
        rounds += 1
        more, _, _, _, within = _measure(
            reference, model, feeds, dtype, atol, rtol, scales, runner, progress, f"round {rounds}"
        )
        new = {k: v for k, v in more.items() if k not in block}
        if not new:  # the blocked nodes are fed values rounded too coarsely: go upstream
            new = _upstream(reference, block, scales)
        if not new:  # errors within tolerance that the graph amplifies: the largest
            new = _largest(within, block)
        if not new:
            break
        for v in new.values():
            v.round = rounds - 1
        nodes.update(new)
        block |= set(new)
    later = [n.node for n in sorted(nodes.values(), key=lambda n: -n.round) if n.round > 0]
    if later and after is not None and after.passed:

        def agrees_without(trial: set[str]) -> tuple[bool, Any]:
            m = convert_model(reference, dtype, sorted(trial), keep_io_types)
            out = _candidate_outputs(ref_out, m, feeds, atol, rtol)
            return out.passed, (m, out)

        block, dropped, result = prune_block_list(later, block, agrees_without)
        for name in dropped:
            nodes.pop(name, None)
        if result is not None:
            model, after = result
    unresolved = None
    final = after or before
    if not final.passed:
        last = records if model is None or model is candidate else None
        if last is None:
            last = _measure(
                reference, model, feeds, dtype, atol, rtol, scales, runner, progress, "why"
            )[3]
        kept_values = {n.value for n in nodes.values()}
        unresolved = _outputs_overflow(model or candidate, scales, dtype) or why_disagrees(
            last, dtype, kept_values
        )
    ranked = sorted(nodes.values(), key=_rank)
    ops: list[str] = []
    for n in ranked:
        if n.op_type not in ops:
            ops.append(n.op_type)
    order = {n.node: k for k, n in enumerate(ranked)}
    block_list = sorted(block, key=lambda b: (order.get(b, len(order)), b))
    return PrecisionAdvice(
        dtype=dtype,
        atol=atol,
        rtol=rtol,
        nodes=ranked,
        node_block_list=block_list if nodes else sorted(kept),
        op_block_list=ops,
        kept=sorted(kept),
        before=before,
        after=after,
        rounds=rounds,
        compared=measured,
        converted_here=converted is None,
        keep_io_types=bool(keep_io_types),
        elapsed=time.monotonic() - start,
        model=model,
        records=records,
        unresolved=unresolved,
    )


__all__ = ["advise_precision"]
