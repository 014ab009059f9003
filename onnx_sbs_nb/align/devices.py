"""The same ONNX model run two ways (two devices, or two runtimes), node by node.

"Does my model give the same numbers on CUDA as on CPU?" is the question here. Each node
runs on the *reference* side's inputs on both sides, so each record holds the node's own
discrepancy, and a second, propagated comparison follows the candidate side alone
(``err_abs``: propagated through the candidate's own values; ``err_abs2``: the node alone).
The records use the usual fields: ``ep_*`` describe the reference run, ``onnx_*`` the
candidate run.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from ..convert import convert, device_of, initializer_value
from ..device import resolve_device
from ..diff import compare, shape_type
from ..records import (
    KIND_INPUT,
    KIND_NODE,
    KIND_OUTPUT,
    STATUS_ERROR,
    STATUS_FAIL,
    STATUS_OK,
    Record,
)
from .loading import SbsInputError, load_onnx_model
from .runners import ModelContext, make_runner


def run_onnx_on_two_devices(
    onx: Any,
    feeds: dict[str, Any],
    *,
    reference: tuple[Any, str] = ("onnxruntime", "cpu"),
    candidate: tuple[Any, str] = ("torch", "cuda"),
    atol: float | None = None,
    rtol: float | None = None,
) -> Iterator[Record]:
    """Yields one Record per ONNX value, comparing the candidate run with the reference.

    ``reference`` / ``candidate``: (runner, device), e.g. ("torch", "cpu") and
    ("torch", "cuda"), or ("onnxruntime", "cpu") and ("torch", "cpu").
    """
    model = load_onnx_model(onx)
    for _, dev in (reference, candidate):
        resolve_device(dev)
    g = model.graph
    inits = {i.name for i in g.initializer}
    missing = [i.name for i in g.input if i.name not in inits and i.name not in feeds]
    if missing:
        raise SbsInputError(f"feeds lack the model inputs {missing}: pass a dict name -> tensor")
    sides = []
    for runner_spec, dev in (reference, candidate):
        runner = make_runner(runner_spec, str(dev))
        ctx = ModelContext.from_model(model, str(dev))
        env = {n: convert(v, runner.value_kind, dev) for n, v in feeds.items()}
        for i in g.initializer:
            env[i.name] = initializer_value(i, runner.value_kind, dev)
        sides.append((runner, ctx, env, str(dev)))
    return _iterate(model, feeds, sides, atol, rtol)


def _iterate(model, feeds, sides, atol, rtol) -> Iterator[Record]:
    g = model.graph
    inits = {i.name for i in g.initializer}
    last_use: dict[str, int] = {}
    for k, node in enumerate(g.node):
        for i in node.input:
            last_use[i] = k
    outputs = {o.name for o in g.output}
    step = 0
    for name in feeds:
        yield Record(
            ep_name=name,
            onnx_name=name,
            onnx_op_type="input",
            kind=KIND_INPUT,
            paired_by="name",
            status=STATUS_OK,
            passed=True,
            err_abs=0.0,
            step=step,
            ep_device=sides[0][3],
            onnx_device=sides[1][3],
        )
        step += 1
    (r_run, r_ctx, r_env, r_dev), (c_run, c_ctx, c_env, c_dev) = sides
    for k, node in enumerate(g.node):
        name = node.name or f"{node.op_type}_{k}"
        try:
            ins = [r_env[i] if i else None for i in [*node.input, *r_ctx.free_variables(node)]]
            t = time.perf_counter()
            r_out = r_run.prepare(node, r_ctx)(ins)
            r_time = time.perf_counter() - t
        except Exception as e:
            err = f"reference side: {type(e).__name__}: {e}"
            r_out = None
        try:
            c_fn = c_run.prepare(node, c_ctx)
            prop_in = [c_env[i] if i else None for i in [*node.input, *c_ctx.free_variables(node)]]
            t = time.perf_counter()
            c_out = c_fn(prop_in)
            c_time = time.perf_counter() - t
            own_out = None
            if r_out is not None:
                own_in = [
                    convert(v, c_run.value_kind, c_dev) if v is not None else None for v in ins
                ]
                own_out = c_fn(own_in)
        except Exception as e:
            err = f"candidate side: {type(e).__name__}: {e}"
            c_out = None
        for j, o in enumerate(node.output):
            if not o:
                continue
            rec = Record(
                ep_name=o,
                onnx_name=o,
                ep_target=node.op_type,
                onnx_op_type=node.op_type,
                onnx_id_node=k,
                ep_id_node=k,
                onnx_id_output=j,
                onnx_domain=node.domain or None,
                kind=KIND_OUTPUT if o in outputs else KIND_NODE,
                paired_by="name",
                ep_device=r_dev,
                onnx_device=c_dev,
                err_dev=0.0 if r_dev == c_dev else 1.0,
                step=step,
                comment=f"{name}: {c_run.name}@{c_dev} vs {r_run.name}@{r_dev}",
            )
            step += 1
            if r_out is None or c_out is None:
                rec.status, rec.error = STATUS_ERROR, err
                yield rec
                continue
            rv, cv = r_out[j], c_out[j]
            r_env[o] = rv
            c_env[o] = cv
            rec.ep_time_run, rec.onnx_time_run = r_time, c_time
            rec.ep_shape_type, rec.onnx_shape_type = shape_type(rv), shape_type(cv)
            rec.ep_device, rec.onnx_device = device_of(rv), device_of(cv)
            if isinstance(rv, list) or isinstance(cv, list):
                rec.status = STATUS_OK
                yield rec
                continue
            d = compare(rv, cv, atol, rtol)
            rec.err_abs, rec.err_rel, rec.err_nan = d.err_abs, d.err_rel, d.err_nan
            rec.err_h01, rec.err_h001, rec.atol, rec.rtol = d.err_h01, d.err_h001, d.atol, d.rtol
            rec.passed = d.passed
            rec.status = STATUS_OK if d.passed else STATUS_FAIL
            if own_out is not None:
                d2 = compare(rv, own_out[j], atol, rtol)
                rec.err_abs2, rec.err_rel2, rec.err_nan2 = d2.err_abs, d2.err_rel, d2.err_nan
                rec.err_h012, rec.err_h0012, rec.passed2 = d2.err_h01, d2.err_h001, d2.passed
            yield rec
        for i in node.input:
            if last_use.get(i) == k and i not in inits:
                r_env.pop(i, None)
                c_env.pop(i, None)


__all__ = ["run_onnx_on_two_devices"]
