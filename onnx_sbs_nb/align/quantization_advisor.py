"""The quantization advisor: which nodes to leave out of onnxruntime's int8 quantization,
in its own format (``nodes_to_exclude``), as the precision advisor does for float16.

The float ONNX model is the reference; it is quantized as the user asks
(``quantize_dynamic`` or ``quantize_static`` with a calibration reader over the inputs
given) and both run on those inputs: the output SQNR, ``20 log10(|y| / |y - y_q|)`` over
all the inputs (the measure of onnxruntime's ``qdq_loss_debug``), is what quantization
costs.  Each node the quantizer touches is then ranked by what leaving it in float buys at
the outputs: the model is quantized again with ``nodes_to_exclude=[node]`` and its output
SQNR measured.  A node's own error (the SQNR of its value, less what its inputs carry) is
cheaper, but it does not say what the outputs gain: a large error in a value the graph
ignores costs nothing, and a QDQ pair shared by two nodes stays while either is quantized.
It only picks the nodes to try when there are more than ``max_trials``.

The quantized models run as deployed by default (a default onnxruntime CPU session, graph
optimizations on), or as written (``execution="as-written"``, optimizations off); the
advised model is measured in both and the advice says where they disagree.  Deployed, a
Conv/Gemm left in float but fed by a DequantizeLinear is quantized again by the session
(quantization_exclusion): it is tried with the producer of its input excluded too.

Cost: static calibration runs once (onnxruntime's calibration cache, from 1.32; before,
each quantization calibrates again); then 1 + min(N, max_trials) + at most 2 x budget
quantizations of the model and as many runs over the inputs, for N quantized nodes (plus
up to 3 per Conv/Gemm tried, deployed, for the producers excluded with it).  The
greedy step adds the best-ranked node left, keeps it if the outputs gain at least 1 dB,
and stops at the target SQNR, at the budget (10% of the quantized nodes by default), or
when the next node alone buys less than 1 dB.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from ..errors import SbsInputError
from .pairing.quantized import QUANT_OPS
from .precision_advisor import _feeds, _module_path
from .quantization_advice import EXECUTIONS, LITTLE_DB, QuantizationAdvice, QuantNode
from .quantization_exclusion import WEIGHT_BIAS_QUANTIZATION, helpers, requantized_in_session
from .source.fx_metadata import fx_name_from_metadata
from .source.loading import load_onnx_model

MODES = ("dynamic", "static")
FORMATS = ("QDQ", "QOperator")
TYPES = {"int8": "QInt8", "uint8": "QUInt8"}
# ops that only move or select values: leaving one in float changes no rounding the graph
# does not also do around it, so they are not tried
_MOVES = {
    "Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Slice", "Split", "Concat",
    "Pad", "MaxPool", "Identity", "Resize",
}  # fmt: skip
_QUANT_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear"}
Progress = Callable[[str, float], None]


def _refuse_quantized(onx: Any, model: onnx.ModelProto) -> None:
    """An already-quantized model is no reference: quantizing it again fails deep in
    onnxruntime (two nodes with the same name) or measures nothing; say so first."""
    found = sorted({n.op_type for n in model.graph.node if n.op_type in QUANT_OPS})
    if not found:
        return
    what = Path(onx).name if isinstance(onx, (str, Path)) else "the model"
    raise SbsInputError(
        f"{what} is already quantized (it has {'/'.join(found)} nodes): pass the float "
        "model, the one it was quantized from"
    )


def _samples(inputs: Any, ep: Any, model: onnx.ModelProto) -> list[dict[str, np.ndarray]]:
    """The feeds of each input: a list of input tuples, dicts or tensors (a tuple, a dict
    or a tensor alone is one input)."""
    if isinstance(inputs, tuple | dict | torch.Tensor | np.ndarray):
        inputs = [inputs]
    if not isinstance(inputs, list) or not inputs:
        raise SbsInputError(
            "no inputs to calibrate and measure on: pass a list of the model's inputs, e.g. "
            "[(x1,), (x2,)] or [{'x': x1}, {'x': x2}] (a few dozen representative ones)"
        )
    out = []
    for item in inputs:
        if isinstance(item, dict):
            args, kwargs = (), item
        elif isinstance(item, tuple | list):
            args, kwargs = tuple(item), None
        else:
            args, kwargs = (item,), None
        feeds = _feeds(ep, model, args, kwargs)
        out.append({k: np.asarray(torch.as_tensor(v).detach().cpu()) for k, v in feeds.items()})
    return out


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """onnxruntime's quantizer logs its pre-processing hint on the root logger each call."""

    def drop(record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR

    root = logging.getLogger()
    root.addFilter(drop)
    try:
        yield
    finally:
        root.removeFilter(drop)


class _Quantizer:
    """Quantizes the float model (saved once: the quantizer writes its weights out of a
    ModelProto it is given) with the user's settings and an exclusion list."""

    def __init__(self, model: onnx.ModelProto, samples: list[dict], mode: str, kw: dict):
        self.dir = tempfile.TemporaryDirectory(prefix="sbs-quant-")
        self.path = Path(self.dir.name) / "float.onnx"
        onnx.save(model, str(self.path))
        self.samples, self.mode, self.kw = samples, mode, kw
        self.count = 0
        self.cache: Path | None = None
        if mode == "static":
            from onnxruntime.quantization import quantize_static

            if "calibration_cache_path" in inspect.signature(quantize_static).parameters:
                self.cache = Path(self.dir.name) / "calibration.json"

    def _reader(self) -> Any:
        from onnxruntime.quantization import CalibrationDataReader

        samples = self.samples

        class Reader(CalibrationDataReader):
            def __init__(self) -> None:
                self.it = iter(samples)

            def get_next(self) -> dict | None:
                return next(self.it, None)

        return Reader()

    def __call__(self, exclude: list[str]) -> onnx.ModelProto:
        from onnxruntime import quantization as q

        self.count += 1
        out = Path(self.dir.name) / f"q{self.count}.onnx"
        with _quiet():
            try:
                if self.mode == "dynamic":
                    q.quantize_dynamic(self.path, out, nodes_to_exclude=exclude, **self.kw)
                else:
                    extra = {"calibration_cache_path": self.cache} if self.cache else {}
                    q.quantize_static(
                        self.path, out, self._reader(), nodes_to_exclude=exclude, **self.kw, **extra
                    )
            except SbsInputError:
                raise
            except Exception as e:
                raise SbsInputError(
                    f"onnxruntime's quantize_{self.mode} failed on the model "
                    f"({type(e).__name__}: {str(e).strip()[:300]}): check the settings "
                    "(quant_format, types, per_channel) or the model's ops"
                ) from None
        return onnx.load(str(out))

    def close(self) -> None:
        self.dir.cleanup()


def _run(
    model: onnx.ModelProto,
    samples: list[dict],
    names: list[str],
    optimized: bool,
    disabled: tuple[str, ...] = (),
) -> list:
    """Per input, the values ``names`` of ``model`` as float64 arrays; ``optimized``: in a
    default CPU session (all graph optimizations, as deployed, less the optimizers named in
    ``disabled``), else as written."""
    import onnxruntime as ort

    m = onnx.ModelProto()
    m.CopyFrom(model)
    have = {o.name for o in m.graph.output}
    for name in names:
        if name not in have:
            m.graph.output.append(onnx.ValueInfoProto(name=name))
    so = ort.SessionOptions()
    if not optimized:  # QDQ computed as written, in float: the same on every CPU
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    try:
        extra = {"disabled_optimizers": list(disabled)} if disabled else {}
        sess = ort.InferenceSession(
            m.SerializeToString(), so, providers=["CPUExecutionProvider"], **extra
        )
    except Exception as e:
        text = " ".join(str(e).split()).split("[ONNXRuntimeError] :", 1)[-1].strip()
        raise SbsInputError(
            f"onnxruntime cannot run the model ({text[:300]}): the quantization advice runs "
            "the float and the quantized models whole; export it with ops onnxruntime knows"
        ) from None
    wanted = {i.name for i in sess.get_inputs()}
    return [
        [
            np.asarray(v, dtype=np.float64)
            for v in sess.run(names, {k: v for k, v in s.items() if k in wanted})
        ]
        for s in samples
    ]


def sqnr(ref: list[np.ndarray], got: list[np.ndarray]) -> float:
    """20 log10(|ref| / |ref - got|) over all the arrays (inf: identical)."""
    a = np.concatenate([np.ravel(x) for x in ref]) if ref else np.zeros(0)
    b = np.concatenate([np.ravel(x) for x in got]) if got else np.zeros(0)
    noise = float(np.linalg.norm(a - b))
    if not math.isfinite(noise):
        return -math.inf
    if noise == 0.0:
        return math.inf
    return 20.0 * math.log10(max(float(np.linalg.norm(a)), 1e-30) / noise)


class _Measure:
    """The float model's outputs on the inputs, and a quantized model's SQNR against them."""

    def __init__(self, model: onnx.ModelProto, samples: list[dict], execution: str):
        floats = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE}
        self.outputs = [
            o.name for o in model.graph.output if o.type.tensor_type.elem_type in floats
        ]
        if not self.outputs:
            raise SbsInputError("the model has no float output: there is nothing to measure")
        self.samples, self.execution = samples, execution
        self.ref = _run(model, samples, self.outputs, False)

    def outputs_sqnr(
        self, q: onnx.ModelProto, execution: str | None = None, disabled: tuple[str, ...] = ()
    ) -> dict[str, float]:
        optimized = (execution or self.execution) == "deployed"
        got = _run(q, self.samples, self.outputs, optimized, disabled)
        return {
            name: sqnr([r[k] for r in self.ref], [g[k] for g in got])
            for k, name in enumerate(self.outputs)
        }

    def __call__(self, q: onnx.ModelProto) -> float:
        return min(self.outputs_sqnr(q).values())


def _touched(model: onnx.ModelProto, q: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The nodes of ``model`` the quantizer changed: gone (replaced by integer ops, or a
    Relu folded into a QuantizeLinear's range) or fed by a DequantizeLinear."""
    by_name = {n.name: n for n in q.graph.node if n.name}
    producer = {o: n for n in q.graph.node for o in n.output if o}
    out = []
    for node in model.graph.node:
        if not node.name or node.op_type in _QUANT_OPS or node.op_type == "Constant":
            continue
        twin = by_name.get(node.name)
        if twin is None or twin.op_type != node.op_type:
            out.append(node)
        elif any(
            i in producer and producer[i].op_type == "DequantizeLinear" for i in twin.input if i
        ):
            out.append(node)
    return out


def _value_sqnr(
    model: onnx.ModelProto, q: onnx.ModelProto, samples: list[dict], nodes: list[onnx.NodeProto]
) -> dict[str, tuple[float | None, float | None]]:
    """node -> (SQNR of its output in the quantized model, its own SQNR): the float model's
    values matched by name with the quantized model's (the quantizer keeps the names of the
    values it does not remove)."""
    produced = {o for n in q.graph.node for o in n.output if o}
    inits = {i.name for i in model.graph.initializer}
    values = {o for n in model.graph.node for o in n.output if o} | {
        i.name for i in model.graph.input
    }
    # a value as its consumers see it: after its QuantizeLinear/DequantizeLinear pair (a
    # Relu folded into the pair's range leaves its name on the Add before it)
    twin = {}

    def read(v: str) -> str | None:
        dq = f"{v}_DequantizeLinear_Output"
        return dq if dq in produced else v if v in produced else None

    for n in nodes:
        for v in [*n.input, *n.output]:
            if v and v not in inits and read(v):
                twin[v] = read(v)
    # a node whose output the quantizer renamed: its twin writes the value of the Relu folded
    # into its pair (that Relu's name), or feeds the QuantizeLinear of a graph output
    by_name = {n.name: n for n in q.graph.node if n.name}
    alias: dict[str, str] = {}
    for n in nodes:
        t = by_name.get(n.name)
        if t is None or any(o in twin for o in n.output):
            continue
        for o in t.output:
            v = o.removesuffix("_QuantizeLinear_Input")
            if v in values and read(v):
                twin[v] = read(v)
                alias[n.name] = v
    names = sorted(twin)
    if not names:
        return {}
    ref = _run(model, samples, names, False)
    got = _run(q, samples, [twin[v] for v in names], False)
    db = {name: sqnr([r[k] for r in ref], [g[k] for g in got]) for k, name in enumerate(names)}
    out: dict[str, tuple[float | None, float | None]] = {}
    for n in nodes:
        outs = [db[o] for o in n.output if o in db] or (
            [db[alias[n.name]]] if alias.get(n.name) in db else []
        )
        if not outs:
            out[n.name] = (None, None)
            continue
        value = min(outs)
        ins = [db[i] for i in n.input if i in db]
        # noise-to-signal powers add along the graph (to first order): what the node adds
        nsr = 10 ** (-value / 10) - max((10 ** (-x / 10) for x in ins), default=0.0)
        own = math.inf if nsr <= 0 else -10 * math.log10(nsr)
        out[n.name] = (value, own)
    return out


def _settings(
    mode: str, quant_format: str, per_channel: bool, weight_type: str, activation_type: str | None,
    reduce_range: bool, op_types: list[str] | None, extra_options: dict | None,
) -> tuple[dict[str, Any], dict[str, Any]]:  # fmt: skip
    """(the quantizer's keyword arguments, the settings as the advice shows them)."""
    from onnxruntime.quantization import QuantFormat, QuantType

    if mode not in MODES:
        raise SbsInputError(f"mode must be 'dynamic' or 'static', not {mode!r}")
    if quant_format not in FORMATS:
        raise SbsInputError(f"quant_format must be 'QDQ' or 'QOperator', not {quant_format!r}")
    for what, t in (("weight_type", weight_type), ("activation_type", activation_type)):
        if t is not None and t not in TYPES:
            raise SbsInputError(f"{what} must be 'int8' or 'uint8', not {t!r}")
    kw: dict[str, Any] = {
        "per_channel": per_channel,
        "reduce_range": reduce_range,
        "weight_type": getattr(QuantType, TYPES[weight_type]),
        "op_types_to_quantize": list(op_types) if op_types else None,
        "extra_options": dict(extra_options or {}),
    }
    shown = {"per_channel": per_channel, "weight_type": weight_type, "reduce_range": reduce_range}
    if mode == "static":
        kw["quant_format"] = getattr(QuantFormat, quant_format)
        shown["quant_format"] = quant_format
        if activation_type is not None:
            kw["activation_type"] = getattr(QuantType, TYPES[activation_type])
            shown["activation_type"] = activation_type
    elif activation_type is not None:
        raise SbsInputError("activation_type is for mode='static' (dynamic picks uint8 itself)")
    return kw, shown


def _quant_node(node: onnx.NodeProto, values: dict) -> QuantNode:
    value, own = values.get(node.name, (None, None))
    return QuantNode(
        node=node.name,
        op_type=node.op_type if not node.domain else f"{node.domain}::{node.op_type}",
        gain_db=None,
        sqnr_excluded=None,
        value_sqnr=value,
        own_sqnr=own,
        tried=False,
        fx_node=fx_name_from_metadata(node),
        module=_module_path(node),
    )


def _budget(budget: int | float, quantizable: int) -> int:
    if isinstance(budget, bool) or not isinstance(budget, int | float) or budget < 0:
        raise SbsInputError(f"budget must be a node count or a fraction in (0, 1), not {budget!r}")
    if isinstance(budget, float) and budget < 1:
        return max(1, int(budget * quantizable))
    return int(budget)


def _pre_rank(n: QuantNode) -> tuple[bool, float]:
    own = n.own_sqnr
    return (own is None, math.inf if own is None else own)


def _try(n: QuantNode, model: onnx.ModelProto, quantize: _Quantizer, measure: _Measure) -> None:
    """Quantizes with ``n`` excluded and measures the outputs.  Deployed, a node a default
    session would quantize again takes its helpers along (quantization_exclusion)."""
    q = quantize([n.node])
    if measure.execution == "deployed":
        n.with_nodes, q, kept = helpers(model, n.node, quantize, [], q)
        n.requantized = not kept
    n.sqnr_excluded = measure(q)
    n.tried = True


def _alternative(
    ranked: list[QuantNode], chosen: list[str], requantized: list[str], advised: onnx.ModelProto,
    quantize: _Quantizer, measure: _Measure,
) -> dict[str, Any]:  # fmt: skip
    """The advised nodes without the helpers a default session needs, deployed with that
    session's WeightBiasQuantization off (it alone quantizes them again; the other fusions
    stay): often better, as a helper moves a QDQ pair onto a value it may not suit."""
    if measure.execution == "deployed":
        helped = {h for n in ranked if n.node in chosen for h in n.with_nodes}
        primaries = [x for x in chosen if x not in helped]
        if len(primaries) == len(chosen):
            return {}
        model = quantize(primaries)
    elif requantized:
        primaries, model = list(chosen), advised
    else:
        return {}
    disabled = (WEIGHT_BIAS_QUANTIZATION,)
    got = min(measure.outputs_sqnr(model, "deployed", disabled).values())
    return {"nodes_to_exclude": primaries, "disabled_optimizers": list(disabled), "sqnr_db": got}


def _greedy(
    ranked: list[QuantNode], quantize: _Quantizer, measure: _Measure, before: float,
    budget: int, target: float | None, progress: Progress | None,
) -> tuple[list[str], float, onnx.ModelProto | None, list[dict]]:  # fmt: skip
    """Adds the best-ranked nodes while each buys at least LITTLE_DB, up to ``budget`` nodes
    (and 2 x budget tries), until the output SQNR reaches ``target``."""
    chosen: list[str] = []
    current, model, steps = before, None, []
    tries = 0
    for n in ranked:
        if len(chosen) >= budget or tries >= 2 * budget:
            break
        if target is not None and current >= target:
            break
        if n.gain_db is None or n.gain_db < LITTLE_DB:
            break  # ranked by gain: nothing left buys enough alone
        new = [x for x in n.group if x not in chosen]
        if not new or len(chosen) + len(new) > budget:
            continue  # already in, or with its helpers over the budget
        tries += 1
        trial = quantize([*chosen, *new])
        got = measure(trial)
        kept = got - current >= LITTLE_DB
        steps.append({"node": n.node, "sqnr_db": got, "kept": kept})
        if progress is not None:
            progress("greedy", tries / (2 * budget))
        if kept:
            chosen.extend(new)
            current, model = got, trial
    return chosen, current, model, steps


def advise_quantization(
    onx: Any,
    inputs: Any,
    *,
    mode: str = "static",
    ep: Any = None,
    quant_format: str = "QDQ",
    per_channel: bool = False,
    weight_type: str = "int8",
    activation_type: str | None = None,
    reduce_range: bool = False,
    op_types_to_quantize: list[str] | None = None,
    extra_options: dict[str, Any] | None = None,
    budget: int | float = 0.1,
    target_db: float | None = None,
    target_gain_db: float | None = None,
    max_trials: int = 32,
    execution: str = "deployed",
    progress: Progress | None = None,
    optimized: bool | None = None,
) -> QuantizationAdvice:
    """Which nodes of the float model ``onx`` to leave out of int8 quantization.

    ``inputs``: the inputs to calibrate on (static) and measure on: a list of input tuples,
    dicts (name -> tensor) or tensors; ``ep``: the ExportedProgram ``onx`` came from, when
    the inputs are given by the program's input names.  ``mode``, ``quant_format``,
    ``per_channel``, ``weight_type``, ``activation_type``, ``reduce_range``,
    ``op_types_to_quantize``, ``extra_options``: onnxruntime's quantizer arguments.
    ``budget``: the most nodes to exclude (a fraction of the quantized nodes, or a count);
    the search stops once the output SQNR reaches ``target_db`` or gains ``target_gain_db``
    (default: neither, the budget).  ``max_trials``: the most single exclusions tried.
    ``execution``: where the quantized models run: ``"deployed"`` (default), a default
    onnxruntime CPU session, graph optimizations on, as a quantized model is deployed (QDQ
    pairs fused into integer kernels, which differ by CPU; its optimizers quantize again a
    Conv/Gemm left in float but fed by a DequantizeLinear, so such a node is excluded with its
    input's producer); ``"as-written"``: optimizations off, the QDQ graph computed as written
    in float (what onnxruntime's ``qdq_loss_debug`` measures).  The advised models are
    measured in the other execution too; the advice says where the two disagree.
    ``optimized``: the former name, True for "deployed", False for "as-written".
    """
    start = time.monotonic()
    kw, shown = _settings(
        mode, quant_format, per_channel, weight_type, activation_type, reduce_range,
        op_types_to_quantize, extra_options,
    )  # fmt: skip
    if max_trials < 1:
        raise SbsInputError("max_trials must be at least 1")
    if optimized is not None:
        execution = "deployed" if optimized else "as-written"
    if execution not in EXECUTIONS:
        raise SbsInputError(f"execution must be 'deployed' or 'as-written', not {execution!r}")
    model = load_onnx_model(onx)
    _refuse_quantized(onx, model)
    samples = _samples(inputs, ep, model)
    measure = _Measure(model, samples, execution)
    quantize = _Quantizer(model, samples, mode, kw)
    try:
        if progress is not None:
            progress("quantize", 0.0)
        full = quantize([])
        touched = _touched(model, full)
        if not touched:
            ops = sorted({n.op_type for n in model.graph.node})
            raise SbsInputError(
                f"onnxruntime's quantize_{mode} quantizes no node of this model (its ops: "
                f"{', '.join(ops[:20])}): nothing to advise; "
                + (
                    "quantize_dynamic quantizes MatMul, Conv, Gather, Attention, LSTM (not "
                    "Gemm): try mode='static'"
                    if mode == "dynamic"
                    else "pass op_types_to_quantize naming ops the model has"
                )
            )
        outputs_before = measure.outputs_sqnr(full)
        before = min(outputs_before.values())
        values = _value_sqnr(model, full, samples, touched)
        nodes = [_quant_node(n, values) for n in touched if n.op_type not in _MOVES]
        to_try = sorted(nodes, key=_pre_rank)[:max_trials]
        for k, n in enumerate(to_try):
            _try(n, model, quantize, measure)
            n.gain_db = n.sqnr_excluded - before
            if progress is not None:
                progress("rank", (k + 1) / len(to_try))
        ranked = sorted(
            nodes, key=lambda n: (not n.tried, -(n.gain_db if n.gain_db is not None else 0.0))
        )
        limit = _budget(budget, len(touched))
        target = target_db
        if target_gain_db is not None:
            target = (
                before + target_gain_db if target is None else min(target, before + target_gain_db)
            )
        chosen, after, advised, steps = _greedy(
            ranked, quantize, measure, before, limit, target, progress
        )
        advised = advised if advised is not None else full
        outputs_after = measure.outputs_sqnr(advised) if chosen else dict(outputs_before)
        other = {}
        if chosen:  # the other execution's word on the same two models
            name = "as-written" if execution == "deployed" else "deployed"
            other = {
                "execution": name,
                "before": min(measure.outputs_sqnr(full, name).values()),
                "after": min(measure.outputs_sqnr(advised, name).values()),
            }
        requantized = [x for x in chosen if requantized_in_session(advised, x) is not None]
        alternative = (
            _alternative(ranked, chosen, requantized, advised, quantize, measure) if chosen else {}
        )
        ops = sorted({n.op_type for n in touched})
        return QuantizationAdvice(
            mode=mode,
            settings=shown,
            quantizable=len(touched),
            nodes=ranked,
            nodes_to_exclude=chosen,
            op_types_to_quantize=list(op_types_to_quantize or ops),
            before=before,
            after=after,
            outputs_before=outputs_before,
            outputs_after=outputs_after,
            budget=limit,
            target_db=target,
            samples=len(samples),
            quantizations=quantize.count,
            elapsed=time.monotonic() - start,
            model=advised,
            steps=steps,
            execution=execution,
            other=other,
            requantized=requantized,
            alternative=alternative,
        )
    finally:
        quantize.close()


__all__ = ["advise_quantization", "sqnr"]
