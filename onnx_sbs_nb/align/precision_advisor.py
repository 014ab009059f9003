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

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from ..diff import compare, default_tolerance
from ..errors import SbsInputError
from ..records import KIND_NODE, KIND_OUTPUT, STATUS_ERROR, STATUS_PRECISION_LOSS, Record
from .pairing.onnx_pairing import cast_value
from .pairing.values import onnx_value_types
from .precision_casts import repair_round_trips
from .precision_prune import prune_block_list
from .precision_why import why_disagrees
from .source.fx_metadata import fx_name_from_metadata
from .source.loading import load_exported_program, load_inputs, load_onnx_model

LOW_DTYPES = {"float16": onnx.TensorProto.FLOAT16, "bfloat16": onnx.TensorProto.BFLOAT16}
_FLOAT_TYPES = {
    onnx.TensorProto.FLOAT,
    onnx.TensorProto.FLOAT16,
    onnx.TensorProto.BFLOAT16,
    onnx.TensorProto.DOUBLE,
}
INSTALL_HINT = "pip install 'onnx_sbs_nb[precision]'"
# largest finite value of each low-precision type: a float32 value beyond it overflows
_MAX = {"float16": 65504.0, "bfloat16": float(torch.finfo(torch.bfloat16).max)}

Progress = Callable[[str, float], None]


@dataclass
class AdvisedNode:
    """One node of the float32 model whose own error in low precision exceeds tolerance."""

    node: str  # its name in the float32 model (what node_block_list takes)
    op_type: str
    value: str  # the value of the float32 model measured
    # max |candidate - reference| of the node rerun on reference inputs (None: not measured)
    own_error: float | None
    relative_error: float | None  # own_error / max |reference value| (inf: overflow)
    scale: float | None  # max |reference value|
    overflow: bool  # the float32 value does not fit the low-precision type
    # why it is named: "fails" (it does not run in the type), "overflow" (its values),
    # "inputs_overflow" (its inputs' values do not fit), "error" (its own error), "feeds"
    # (added in a later round: it feeds a blocked node, whose error comes from rounding
    # this node's output), "largest" (the outputs disagree and no node fails: its own
    # error, within tolerance, is the largest relative to its values' size)
    reason: str = "error"
    error: str | None = None  # what the runtime said, for "fails"
    atol: float = 0.0  # the absolute tolerance it was measured against
    fx_node: str | None = None  # the fx node it lowers (exporter metadata)
    module: str | None = None  # its module path, e.g. "layers.0.mlp"
    round: int = 0  # the conversion round that found it (0: the first conversion)

    @property
    def why(self) -> str:
        if self.reason == "fails":
            return f"it does not run in the type: {self.error}"
        if self.reason == "overflow":
            return f"its values reach {self.scale:.3g}, beyond the type's largest finite value"
        if self.reason == "inputs_overflow":
            return "its inputs' values do not fit the type (they overflow to infinity)"
        if self.reason == "precision_loss":
            return (
                f"precision loss: own error {_num(self.own_error)}, its inputs' rounding "
                "amplified by the op (computed exactly on them it agrees)"
            )
        if self.reason == "feeds":
            return "it feeds a node kept in float32 whose error comes from rounding its inputs"
        if self.reason == "largest":
            return (
                f"own error {_num(self.own_error)}, {_percent(self.relative_error or 0.0)} of "
                "its values' size: within tolerance, the largest of those the outputs amplify"
            )
        return (
            f"own error {self.own_error:.3g}, {_percent(self.relative_error)} of its values' size"
        )


@dataclass
class OutputError:
    """The largest error over the model's outputs against the float32 model's."""

    err_abs: float | None
    err_rel: float | None
    passed: bool
    error: str | None = None  # the model did not run (the runtime's message)


@dataclass
class PrecisionAdvice:
    """What :func:`advise_precision` found: the ranked nodes, the block list, the outputs'
    error before and after, and the advised model."""

    dtype: str
    atol: float
    rtol: float
    nodes: list[AdvisedNode]  # ranked, worst first
    node_block_list: list[str]
    op_block_list: list[str]  # the op types of the named nodes, to add to the converter's
    kept: list[str]  # nodes the given conversion already kept in float32
    before: OutputError  # the conversion as given (or made without a block list)
    after: OutputError | None  # converted again with node_block_list (None: no need)
    rounds: int
    compared: int  # low-precision nodes whose own error was measured
    converted_here: bool  # whether the first candidate was converted by the advisor
    keep_io_types: bool
    elapsed: float = 0.0
    model: onnx.ModelProto | None = field(default=None, repr=False)  # the advised model
    # the records of the first round: the float32 model against the conversion as given
    records: list[Record] = field(default_factory=list, repr=False)
    # when the advised conversion still disagrees: why, naming the node and its op
    unresolved: str | None = None

    @property
    def agrees(self) -> bool:
        """The advised conversion's outputs agree with the float32 model's."""
        return (self.after or self.before).passed

    @property
    def verdict(self) -> str:
        return "agrees" if self.agrees else "disagrees"

    def convert_kwargs(self) -> dict[str, Any]:
        """The arguments of ``convert_float_to_float16`` for the advised model.

        ``advice.model`` is that conversion with two repairs onnxconverter-common 1.16
        needs: the weights of the blocked nodes stay float32 (it converts and clamps them
        to +-1e4 too), and graph outputs keep their float32 type (it leaves a blocked
        node's output in float16)."""
        return {"keep_io_types": self.keep_io_types, "node_block_list": list(self.node_block_list)}

    def to_dict(self) -> dict[str, Any]:
        d = {
            "dtype": self.dtype,
            "verdict": self.verdict,
            "atol": self.atol,
            "rtol": self.rtol,
            "node_block_list": list(self.node_block_list),
            "op_block_list": list(self.op_block_list),
            "keep_io_types": self.keep_io_types,
            "kept": list(self.kept),
            "nodes": [{**asdict(n), "why": n.why} for n in self.nodes],
            "before": asdict(self.before),
            "after": asdict(self.after) if self.after is not None else None,
            "rounds": self.rounds,
            "compared": self.compared,
            "converted_here": self.converted_here,
            "elapsed": self.elapsed,
            "unresolved": self.unresolved,
        }
        return _json_safe(d)

    def to_text(self, limit: int = 20) -> str:
        lines = [
            f"precision advice ({self.dtype}): {self.verdict.upper()} - "
            f"{len(self.node_block_list)} node(s) to keep in float32 of {self.compared} "
            f"measured (tolerance atol {self.atol:g}, rtol {self.rtol:g})"
        ]
        lines.append(
            f"  outputs as converted{'' if self.converted_here else ' (given)'}: "
            f"{_out_text(self.before)}"
        )
        if self.after is not None:
            lines.append(f"  outputs with the block list: {_out_text(self.after)}")
        if self.nodes:
            lines.append("  nodes to keep in float32, worst first:")
            for k, n in enumerate(self.nodes[:limit], 1):
                where = ", ".join(
                    x for x in (n.fx_node and f"fx {n.fx_node}", n.module and f"in {n.module}") if x
                )
                lines.append(
                    f"  {k:>3}. {n.node} ({n.op_type}){' ' + where if where else ''}: {n.why}"
                )
            if len(self.nodes) > limit:
                lines.append(f"       ... and {len(self.nodes) - limit} more")
            lines.append(f"  node_block_list = {self.node_block_list!r}")
            lines.append(f"  op types: {', '.join(self.op_block_list)}")
        else:
            lines.append(f"  no node's own error in {self.dtype} exceeds the tolerance")
        if self.kept:
            lines.append(f"  kept in float32 by the given conversion: {len(self.kept)} node(s)")
        if self.unresolved:
            lines.append(f"  why it still disagrees: {self.unresolved}")
        return "\n".join(lines)


def _percent(x: float) -> str:
    return "overflow" if not math.isfinite(x) else f"{100 * x:.3g}%"


def _out_text(o: OutputError) -> str:
    if o.error:
        return f"FAILED to run ({o.error})"
    return f"{'agree' if o.passed else 'DISAGREE'} (max abs error {_num(o.err_abs)}, rel {_num(o.err_rel)})"


def _num(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"


def _json_safe(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _json_safe(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_json_safe(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    return v


# ---------------------------------------------------------------- conversion


def _float16_module() -> Any:
    try:
        from onnxconverter_common import float16
    except ImportError:
        raise SbsInputError(
            "converting a model to float16 needs onnxconverter-common: " + INSTALL_HINT
        ) from None
    return float16


def convert_model(
    model: onnx.ModelProto,
    dtype: str = "float16",
    node_block_list: list[str] | tuple[str, ...] = (),
    keep_io_types: bool = True,
) -> onnx.ModelProto:
    """``model`` (float32) converted to ``dtype`` except the nodes of ``node_block_list``.

    float16: onnxconverter-common's ``convert_float_to_float16``.  bfloat16: the same
    conversion (its large-value clamp lifted), every float16 type, Cast and value then
    turned to bfloat16, values taken from ``model`` where it holds them in float32.
    """
    float16 = _float16_module()
    if dtype not in LOW_DTYPES:
        raise SbsInputError(f"dtype must be one of {sorted(LOW_DTYPES)}, not {dtype!r}")
    import warnings

    bf16 = dtype == "bfloat16"
    kw = {"max_finite_val": 3.0e38, "min_positive_val": 1e-38} if bf16 else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "the float32 number ... will be truncated"
        out = float16.convert_float_to_float16(
            model, keep_io_types=keep_io_types, node_block_list=list(node_block_list), **kw
        )
    if bf16:
        out = _float16_to_bfloat16(out, model)
    if node_block_list:
        _keep_blocked_weights(out, model)
        repair_round_trips(out)  # float32 between two blocked nodes, not float16
    if keep_io_types:
        _keep_output_types(out, model)
    return out


def _keep_output_types(model: onnx.ModelProto, original: onnx.ModelProto) -> None:
    """Graph outputs in their original float type (``keep_io_types``).

    onnxconverter-common drops the Casts around a blocked node that computes a graph
    output as unnecessary, leaving the Cast down to float16 in their place: the output
    is float16, and values a float32 node computed overflow there.  That Cast is turned
    back to the output's type (or one is added).
    """
    g = model.graph
    want = {o.name: o.type.tensor_type.elem_type for o in original.graph.output}
    producers = {o: n for n in g.node for o in n.output if o}
    for out in g.output:
        elem = want.get(out.name)
        if elem is None or elem not in _FLOAT_TYPES or out.type.tensor_type.elem_type == elem:
            continue
        node = producers.get(out.name)
        if node is None:
            continue
        to = [a for a in node.attribute if a.name == "to"]
        if node.op_type == "Cast" and node.domain in ("", "ai.onnx") and to:
            to[0].i = elem
        else:
            low = f"{out.name}_before_cast"
            node.output[list(node.output).index(out.name)] = low
            g.node.append(onnx.helper.make_node("Cast", [low], [out.name], to=elem))
        out.type.tensor_type.elem_type = elem


def _keep_blocked_weights(model: onnx.ModelProto, original: onnx.ModelProto) -> None:
    """The weights of the nodes kept in float32 in float32 again.

    onnxconverter-common casts a blocked node's inputs before it converts the weights, so
    it no longer sees them as the blocked node's: every float weight is converted (and
    clamped to +-max_finite_val, 1e4), then cast back up.  Each such Cast is given the
    original float32 weight instead (a Cast to float of a float is the value itself).
    """
    g = model.graph
    low = {onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}
    inits = {i.name: i for i in g.initializer}
    originals = {i.name: i for i in original.graph.initializer}
    added: dict[str, str] = {}
    for node in g.node:
        if node.op_type != "Cast" or node.domain not in ("", "ai.onnx"):
            continue
        to = next((a.i for a in node.attribute if a.name == "to"), None)
        name = node.input[0] if node.input else ""
        init, orig = inits.get(name), originals.get(name)
        if to != onnx.TensorProto.FLOAT or init is None or init.data_type not in low:
            continue
        if orig is None or orig.data_type != onnx.TensorProto.FLOAT:
            continue
        if name not in added:
            copy = onnx.TensorProto()
            copy.CopyFrom(orig)
            copy.name = added[name] = f"{name}_float32"
            g.initializer.append(copy)
        node.input[0] = added[name]
    if added:
        used = {i for n in g.node for i in n.input} | {o.name for o in g.output}
        keep = [i for i in g.initializer if i.name in used]
        if len(keep) != len(g.initializer):
            del g.initializer[:]
            g.initializer.extend(keep)


def _to_bf16_tensor(t: onnx.TensorProto, original: onnx.TensorProto | None) -> None:
    import ml_dtypes

    src = original if original is not None else t
    values = onnx.numpy_helper.to_array(src).astype(np.float32).astype(ml_dtypes.bfloat16)
    new = onnx.numpy_helper.from_array(values, t.name)
    meta = list(t.metadata_props)
    t.CopyFrom(new)
    t.metadata_props.extend(meta)


def _float16_to_bfloat16(model: onnx.ModelProto, original: onnx.ModelProto) -> onnx.ModelProto:
    f16, bf16 = onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16
    inits = {i.name: i for i in original.graph.initializer}
    nodes = {n.name: n for n in original.graph.node if n.name}

    def retype(t: onnx.TypeProto) -> None:
        if t.HasField("tensor_type") and t.tensor_type.elem_type == f16:
            t.tensor_type.elem_type = bf16

    def graph(g: onnx.GraphProto) -> None:
        for i in g.initializer:
            if i.data_type == f16:
                _to_bf16_tensor(i, inits.get(i.name))
        for vi in [*g.input, *g.output, *g.value_info]:
            retype(vi.type)
        for n in g.node:
            orig = nodes.get(n.name)
            for a in n.attribute:
                if a.type == onnx.AttributeProto.TENSOR and a.t.data_type == f16:
                    o = None
                    if orig is not None:
                        o = next((x.t for x in orig.attribute if x.name == a.name), None)
                    _to_bf16_tensor(
                        a.t, o if o is not None and o.data_type in _FLOAT_TYPES else None
                    )
                elif a.type == onnx.AttributeProto.INT and a.name in ("to", "dtype") and a.i == f16:
                    a.i = bf16
                elif a.type == onnx.AttributeProto.GRAPH:
                    graph(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    for sub in a.graphs:
                        graph(sub)

    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph(out.graph)
    return out


# ---------------------------------------------------------------- reading models


def low_precision_of(model: onnx.ModelProto) -> str | None:
    """'float16' or 'bfloat16' when most float weights and values of ``model`` are."""
    counts: dict[int, int] = {}
    for i in model.graph.initializer:
        if i.data_type in _FLOAT_TYPES:
            counts[i.data_type] = counts.get(i.data_type, 0) + 1
    for vi in [*model.graph.value_info, *model.graph.output]:
        t = vi.type.tensor_type.elem_type
        if t in _FLOAT_TYPES:
            counts[t] = counts.get(t, 0) + 1
    if not counts:
        return None
    best = max(counts, key=counts.__getitem__)
    return next((k for k, v in LOW_DTYPES.items() if v == best), None)


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


def write_advice(advice: PrecisionAdvice, path: Any) -> None:
    """The advice as JSON (``node_block_list``, ``op_block_list``, the ranked nodes...),
    written whole or not at all; a link at ``path`` is replaced, not followed."""
    from ..files import write_text_atomic

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(advice.to_dict(), indent=2) + "\n")


def save_advised_model(advice: PrecisionAdvice, path: Any) -> None:
    """The model converted with the advised block list, written whole or not at all."""
    from ..files import atomic_path

    if advice.model is None:
        raise SbsInputError("the advice holds no model to save")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        onnx.save(advice.model, str(tmp))


__all__ = [
    "AdvisedNode",
    "OutputError",
    "PrecisionAdvice",
    "advise_precision",
    "convert_model",
    "low_precision_of",
    "save_advised_model",
    "write_advice",
]
