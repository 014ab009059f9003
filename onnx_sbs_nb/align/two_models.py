"""Two ONNX models of one program, side by side, node by node.

An export before and after an optimizer, two exporter versions, float32 against float16,
or a model against the graph onnxruntime runs (``optimize=``): the engine's one loop
(``run.py``) with an ONNX model on both sides, paired by names and exporter metadata
(:func:`~onnx_sbs_nb.align.pairing.onnx_pairing.pair_onnx_models`).  Model ``a`` is the
reference (the ``ep_*`` fields of the records), ``b`` the candidate (the ``onnx_*``
fields).  The feeds are ``a``'s inputs; ``b`` gets them cast to its own input types
where they differ (a float16 model fed float32 inputs).
"""

from __future__ import annotations

from typing import Any

import onnx
import torch

from ..convert import to_torch
from ..device import device_name
from ..dtypes import ONNX_TO_TORCH
from ..errors import SbsInputError
from ..records import KIND_WEIGHT, Record, RunStatus
from .contract import MODEL_ACTIONS, RecordStream, RunContract
from .engine.loop import SideBySideRun
from .engine.options import RunOptions
from .engine.runners import OnnxruntimeRunner, make_runner
from .engine.sides import OnnxSide
from .engine.unpaired import unmatched_output_of_two_models
from .judge.precision import onnx_inherited_precision
from .pairing.deployed import deploy
from .pairing.onnx_pairing import cast_value, pair_onnx_models
from .pairing.pairs import Pairing
from .pairing.rules import linking_rules
from .source.loading import load_inputs, load_onnx_model
from .source.model_check import check_model, check_onnxruntime_builds, check_opset


def model_feeds(model: onnx.ModelProto, feeds: Any) -> dict[str, Any]:
    """The graph inputs of ``model`` from what a user passes as its inputs.

    A dict maps input names to tensors; a tuple or list (or a single tensor) gives them
    in the order of the graph's inputs; a path is a ``torch.save``'d file of either
    (read with ``weights_only=True``).  Each must have the input's element type.
    """
    args, kwargs = load_inputs(feeds, None)
    g = model.graph
    inits = {i.name for i in g.initializer}
    inputs = [i for i in g.input if i.name not in inits]
    names = [i.name for i in inputs]
    if len(args) > len(names):
        raise SbsInputError(
            f"{len(args)} positional inputs for a model with {len(names)} inputs ({names})"
        )
    out = dict(zip(names, args))
    unknown = [k for k in kwargs if k not in names]
    if unknown:
        raise SbsInputError(f"feeds name no input of the model: {unknown} (its inputs: {names})")
    twice = [k for k in kwargs if k in out]
    if twice:
        raise SbsInputError(f"inputs {twice} are given both by position and by name")
    out.update(kwargs)
    missing = [n for n in names if n not in out]
    if missing:
        raise SbsInputError(f"feeds lack the model inputs {missing}: pass a dict name -> tensor")
    for inp in inputs:
        value = out[inp.name]
        want = ONNX_TO_TORCH.get(inp.type.tensor_type.elem_type)
        have = getattr(to_torch(value), "dtype", None)
        if want is not None and have is not None and have != want:
            raise SbsInputError(
                f"input {inp.name!r} is {have} but the model expects {want}: convert it"
            )
    return out


def candidate_feeds(
    reference: onnx.ModelProto, candidate: onnx.ModelProto, pairing: Pairing, feeds: dict
) -> dict[str, Any]:
    """The candidate's graph inputs: the reference's feeds, cast to its input types."""
    inits = {i.name for i in candidate.graph.initializer}
    ref_inputs = {i.name for i in reference.graph.input}
    out = {}
    for inp in candidate.graph.input:
        if inp.name in inits:
            continue
        pair = pairing.by_onnx.get(inp.name)
        if pair is None or pair.fx_name not in ref_inputs or pair.fx_name not in feeds:
            raise SbsInputError(
                f"input {inp.name!r} of the second model pairs with no input of the first "
                f"(its inputs: {sorted(feeds)}): the models take different inputs"
            )
        out[inp.name] = cast_value(feeds[pair.fx_name], inp.type.tensor_type.elem_type or None)
    return out


class TwoModelRun(SideBySideRun, RunContract):
    """Two ONNX models of one program, side by side: ``a`` the reference, ``b`` the
    candidate.  No torch program: nothing to rerun a node in or to replay against."""

    KIND = "two_models"
    LABEL = "two ONNX models of one program"
    APPLIES = MODEL_ACTIONS
    NOT_HERE = "it compares two ONNX models, with no torch program to rerun a node in"

    def _emit(self, rec: Record) -> Record:
        unmatched_output_of_two_models(rec)
        return super()._emit(rec)


def two_model_run(
    onx_a: Any,
    onx_b: Any,
    feeds: Any,
    options: RunOptions | None = None,
    *,
    status: RunStatus | None = None,
    **option_kwargs: Any,
) -> TwoModelRun:
    """The run of :func:`run_aligned_onnx`, to iterate (``status``, ``stop()``)."""
    options = RunOptions.from_kwargs(options, **option_kwargs)
    if options.replay is not None:
        raise SbsInputError(
            "replay bundles are written for a torch program against its export: "
            "run_aligned(ep, onx, args, replay=...) instead"
        )
    a, b = load_onnx_model(onx_a), load_onnx_model(onx_b)
    # a model that cannot run is refused, not run into not-computed records: the checks of
    # run_aligned, on both models
    ort = isinstance(make_runner(options.runner, "cpu"), OnnxruntimeRunner)
    checked = []
    for label, model in (("a (the reference)", a), ("b (the candidate)", b)):
        try:
            checked.append(check_model(model))
            if ort:
                check_opset(model)
                check_onnxruntime_builds(model)
        except SbsInputError as e:
            raise SbsInputError(f"model {label}: {e}") from None
    a, b = checked
    feeds_a = model_feeds(a, feeds)
    deployment = deploy(b, options)  # optimize=: b as onnxruntime runs it
    if deployment is not None:
        b = deployment.model
    device = options.device
    if device is None and any(
        isinstance(v, torch.Tensor) and v.device.type == "cuda" for v in feeds_a.values()
    ):
        device = "cuda"
    device = device_name(device)
    pairing = pair_onnx_models(a, b)
    if deployment is not None:
        deployment.link(pairing, pair_onnx_models(a, deployment.original))
    strong = linking_rules()
    if not any(p.rule in strong for p in pairing.by_onnx.values()):
        raise SbsInputError(
            "the two models share no value name, exporter metadata or weight name: they are "
            "not two exports of one program"
        )
    unknown = set(options.reset_names) - set(pairing.by_onnx) - set(pairing.by_fx)
    if unknown:
        raise SbsInputError(
            f"reset_names {sorted(unknown)[:5]} name no paired value of either model"
        )
    reference = OnnxSide(a, make_runner(options.runner, device), device, feeds_a)
    if any(p.cast_to is not None and p.kind == KIND_WEIGHT for p in pairing.by_onnx.values()):
        # models of two precisions, the reference the float16 one (float32 kept at its
        # outputs): its float32 values inherit float16's tolerance, as a candidate's do
        g = reference.graph
        reference.inherited = onnx_inherited_precision(a, g.inputs, g.outputs)
    feeds_b = candidate_feeds(a, b, pairing, feeds_a)
    candidate = OnnxSide(b, make_runner(options.runner, device), device, feeds_b)
    run = TwoModelRun(reference, candidate, pairing, options, status)
    run.deployment = deployment
    if deployment is not None:
        run.status.extra["deployed"] = deployment.summary()
    return run


def run_aligned_onnx(
    onx_a: Any, onx_b: Any, feeds: Any, options: RunOptions | None = None, **option_kwargs: Any
) -> RecordStream:
    """Runs two ONNX models of one program side by side; yields one Record per pair.

    ``a`` is the reference (``ep_*`` fields), ``b`` the candidate (``onnx_*`` fields);
    ``feeds``: ``a``'s inputs (dict, tuple, tensor or ``.pt`` path), cast for ``b``.
    Options are those of :func:`~onnx_sbs_nb.run_aligned` (``optimize=`` runs ``b`` as
    onnxruntime optimizes it), except ``replay``.  Validation happens at this call.
    The iterator returned holds the run as ``.run``.
    """
    return RecordStream(two_model_run(onx_a, onx_b, feeds, options, **option_kwargs))


__all__ = ["TwoModelRun", "candidate_feeds", "model_feeds", "run_aligned_onnx", "two_model_run"]
