"""AlignedRun: the run users make, their torch program against its ONNX export.

It loads and checks what the user gives (``loading.py``, ``guards.py``), reproduces the
program the exporter lowered (``program.py``), pairs values (``names.py``) and hands the
two sides to the one loop (``loop.py``).  The post-run actions (rerun a node in torch,
replay bundles, node details) live in ``post/actions.py``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import onnx
import torch

from ..device import device_name
from ..records import KIND_INPUT, Record, RunStatus, join_comments
from . import screen, warm_screen
from .contract import PROGRAM_ACTIONS, RecordStream, RunContract
from .engine.decomposed_values import DecomposedValues
from .engine.loop import SideBySideRun
from .engine.options import RunOptions
from .engine.runners import OnnxruntimeRunner, make_runner
from .engine.setup_cache import (
    cached_fx_tables,
    cached_onnx_tables,
    cached_pairing,
    cached_provenance,
    checked_model,
)
from .engine.sides import FxSide, OnnxSide
from .engine.user_outputs import UserOutputs
from .judge.judging import SbsMismatchError, as_candidate
from .many_inputs import ManyInputsRun, ModelReuse
from .pairing.bounded import bounded_lowerings
from .pairing.deployed import deploy
from .pairing.fusions import fused_lowering, replaced_fx_nodes
from .pairing.lowered_by import structural_lowering
from .pairing.names import pair_values
from .pairing.pairs import Pairing
from .pairing.rules import linking_rules
from .source.fx_metadata import FxMetadata
from .source.guards import check_input_shapes
from .source.loading import (
    LoadedOnnx,
    SbsInputError,
    load_exported_program,
    load_inputs,
    load_onnx_model,
    nonfinite_inputs,
    onnx_folder,
)
from .source.model_check import check_opset, start_onnxruntime_check
from .source.prepare.prepared import (
    PREPARED_BY_EXPORTER,
    PREPARED_FROM_ONNX_PROGRAM,
    PREPARED_REPRODUCED,
    PreparedProgram,
)
from .source.prepare.program import prepare_program
from .source.program_inputs import bind_inputs
from .source.specialized import decomposed_at_other_sizes, fixed_on_example


class AlignedRun(SideBySideRun, RunContract):
    """A torch program against the ONNX model exported from it; iterate it for records.

    Construction validates everything that can be checked without running (paths,
    options, inputs against the program and the model, pairing) and raises SbsInputError
    early.  ``actions`` holds the post-run actions (``post/actions.py``).
    """

    KIND = "aligned"
    LABEL = "a torch program against its ONNX export"
    APPLIES = PROGRAM_ACTIONS

    def __init__(
        self,
        ep: Any,
        onx: Any,
        args: Any = None,
        kwargs: dict[str, Any] | None = None,
        options: RunOptions | None = None,
        *,
        status: RunStatus | None = None,
        reuse: ModelReuse | None = None,
        **option_kwargs: Any,
    ):
        """``reuse``: what a run over many inputs keeps of the model between its runs
        (:class:`~onnx_sbs_nb.align.many_inputs.ModelReuse`)."""
        options = RunOptions.from_kwargs(options, **option_kwargs)
        prepared_from_onnx = getattr(onx, "exported_program", None)
        self.ep = load_exported_program(ep, trust_pickles=options.trust_pickles)
        folder = onnx_folder(onx)
        facts = reuse.facts if reuse is not None else None
        if facts is None:
            # a file's large weights stay in its data file until read (the optimized graph
            # onnxruntime makes needs them all)
            model = load_onnx_model(onx, defer_weights=options.optimize is None)
            # a model that cannot run is refused, not run into not-computed records; a
            # quantized model's integer weights and activations are dequantized by added
            # nodes so they pair with their float torch twins (pairing/float_views.py);
            # one digest: preparation check and pairing; the metadata read once, where a
            # step needs it (a model of a structure checked before skips those checks)
            facts = checked_model(model)
        model = exported = facts[0]
        digest, metadata = facts[1], facts[2]
        deployment = deploy(model, options)  # optimize=: the graph onnxruntime runs
        if deployment is not None:
            model = deployment.model
        self.args, self.kwargs = load_inputs(args, kwargs, trust_pickles=options.trust_pickles)
        device = options.device
        if device is None:
            # inputs already on a GPU mean "run there"
            devices = {
                str(t.device)
                for t in torch.utils._pytree.tree_leaves((self.args, self.kwargs))
                if isinstance(t, torch.Tensor)
            }
            device = next((d for d in sorted(devices) if d.startswith("cuda")), None)
        device = device_name(device)
        runner = make_runner(options.runner, device)
        # an optimize= run built its session already; other runners judge nodes themselves
        ort_check = None
        if isinstance(runner, OnnxruntimeRunner) and (reuse is None or reuse.facts is None):
            check_opset(exported)
            if deployment is None:
                ort_check = start_onnxruntime_check(exported, digest)
        if isinstance(prepared_from_onnx, torch.export.ExportedProgram):
            self.prepared = PreparedProgram(prepared_from_onnx, PREPARED_FROM_ONNX_PROGRAM)
        else:
            # the exported model's node metadata vouches for the fast reproduction
            self.prepared = prepare_program(self.ep, exported, digest=digest, metadata=metadata)
        program = self.prepared.program
        self.program = program
        bound = bind_inputs(program, self.args, self.kwargs)
        check_input_shapes(program, bound.values, bound.user_inputs, self.ep)
        provenance = cached_provenance(program, self.ep, bound.weights)
        reference = FxSide(program, bound, provenance, device, cached_fx_tables(program))
        # an optimized model is made anew per run: its tables are not kept
        tables = cached_onnx_tables(program, model, digest, metadata) if model is exported else None
        candidate = OnnxSide(model, runner, device, tables=tables, folder=folder)
        trusted, trust_note = _trusted_fx_nodes(self.prepared, exported, metadata)
        pairing = cached_pairing(
            program,
            model,
            bound.weights,
            bound.user_inputs,
            trusted,
            digest if model is exported else None,
            metadata if model is exported else None,
        )
        if deployment is not None:
            original = pair_values(
                program.graph,
                deployment.original,
                bound.weights,
                bound.user_inputs,
                trusted,
                outputs=reference.graph_outputs,
            )
            deployment.link(pairing, original)
        _check_pairing(pairing, model, bound, program)
        if model is exported and not any(metadata.names):
            candidate.lowering = candidate.tables.lowering = structural_lowering(model, pairing)
            candidate.tables.lowering_inferred = True
            candidate.tables.lowering_bounded = bounded_lowerings(
                program.graph, pairing, candidate.lowering, bound.user_inputs
            )
        elif model is exported and not all(metadata.names):
            _name_fusions(candidate, model, metadata, pairing, program, provenance)
        if ort_check is not None:
            ort_check.result()
        if reuse is not None and reuse.facts is None:
            reuse.keep(facts)  # the model passed every check: the next inputs' runs skip them
        options = _reset_names_in_program_words(options, pairing, provenance)
        # the ONNX graph inputs are the torch inputs they pair with
        for name in candidate.graph_inputs:
            pair = pairing.by_onnx.get(name)
            if pair is not None:
                # a model converted to float16 takes its inputs in float16: cast them
                candidate.feeds[name] = as_candidate(pair, reference.leaf_value(pair.fx_name))
        self._nonfinite = nonfinite_inputs(candidate.feeds)
        super().__init__(reference, candidate, pairing, options, status)
        self._watch_decompositions(program, provenance, bound, reference)
        self.deployment = deployment
        if deployment is not None:
            self.status.extra["deployed"] = deployment.summary()
        self.bound = bound
        if self.prepared.note:
            self.status.extra["program_note"] = self.prepared.note
        if trust_note:
            self.status.extra["pairing_note"] = trust_note
        self.status.extra["program_source"] = self.prepared.source
        if self.prepared.detail:
            self.status.extra["program_detail"] = self.prepared.detail
        # a rerun of a program and model whose screen is kept (``warm_screen.py``); not
        # within a run over many inputs (that screens its inputs itself)
        self._warm = warm_screen.lookup(self) if reuse is None and screen.ENABLED else None
        self._warm_kept = reuse is None and screen.ENABLED
        self.screened = False  # whether the screen made this run's records

    def _watch_decompositions(
        self, program: Any, provenance: dict[str, Any], bound: Any, reference: FxSide
    ) -> None:
        """Where the exporter's decompositions may have fixed a size on the example inputs
        (``source/specialized.py``): the shapes found wrong, the decomposed user nodes whose
        values are checked against the user's op, and on a run at other sizes than the
        example's, the outputs against the user's program (``engine/user_outputs.py``)."""
        found, checks = fixed_on_example(
            program, self.ep, provenance, bound.values, bound.user_inputs
        )
        # the run's own copy: the value checks add to it (the shape findings are kept)
        self.specialized = dict(found)
        if checks:
            self.decomposed = DecomposedValues(
                checks, self.specialized, reference.leaf_value, self.atol, self.rtol
            )
        self.user_outputs = None
        # (not for a program mutating its buffers: running it would change them)
        if not self.ep.graph_signature.buffers_to_mutate and decomposed_at_other_sizes(
            program, self.ep, bound.values, bound.user_inputs
        ):
            self.user_outputs = UserOutputs(
                self.ep,
                self.args,
                self.kwargs,
                list(program.graph_signature.user_outputs),
                self.atol,
                self.rtol,
            )
        self.ref_observers = tuple(w for w in (self.decomposed, self.user_outputs) if w is not None)

    @property
    def actions(self) -> Any:
        """The post-run actions (``post/actions.py``), on the run's parts: made on each
        use, a few references, so the run holds nothing more."""
        from .post.actions import RunActions

        return RunActions(
            self.reference,
            self.candidate,
            self.pairing,
            atol=self.atol,
            rtol=self.rtol,
            options=self.options,
            records=self.records,
        )

    def node_actions(self, record: Record | None = None) -> Any:
        return self.actions

    def _emit(self, rec: Record) -> Record:
        if self._nonfinite and rec.kind == KIND_INPUT and rec.onnx_name in self._nonfinite:
            rec.comment = join_comments(rec.comment, self._nonfinite[rec.onnx_name])
        return super()._emit(rec)

    def _closing_records(self) -> tuple[Record, ...]:
        """With every pair passed on a run at other sizes than the example's, the outputs
        against the user's own program's (``engine/user_outputs.py``)."""
        if self.user_outputs is None or self.status.failures:
            return ()
        rec = self.user_outputs.check()
        return () if rec is None else (rec,)

    def _records(self) -> Iterator[Record]:
        if self._warm is None:
            return super()._records()
        return self._warm_records()

    def _warm_records(self) -> Iterator[Record]:
        """The screen's records (``warm_screen.py``), emitted as the engine's loop emits
        them (a stop keeps those yielded); the engine's where the screen refuses."""
        t0 = time.perf_counter()
        records = warm_screen.screened_records(self._warm, self)
        if records is None:
            yield from super()._records()
            return
        status = self.status
        self.screened = True
        status.extra["screened"] = True
        n, onnx_nodes, ep_nodes = len(records), status.total_onnx_nodes, status.total_ep_nodes
        try:
            for k, rec in enumerate(records, 1):
                if self._stop.is_set():
                    status.stopped = True
                    break
                # the progress a view shows: the nodes as far as the records go (the
                # engine's records come in the order of its nodes)
                status.done_onnx_nodes, status.done_ep_nodes = (
                    onnx_nodes * k // n,
                    ep_nodes * k // n,
                )
                yield self._emit(rec)
                status.elapsed = time.perf_counter() - t0
        finally:
            status.elapsed = time.perf_counter() - t0
            status.current = None
            status.finished = True

    def _after_run(self) -> None:
        if self._warm_kept and not self.screened:
            warm_screen.remember(self)
        if self.options.replay is not None:
            written, errors = self.actions.write_selected_replays()
            if errors:
                self.status.extra.setdefault("replay_errors", []).extend(errors)
            self.status.extra["replay_bundles"] = written


def _trusted_fx_nodes(
    prepared: PreparedProgram, model: onnx.ModelProto, metadata: FxMetadata
) -> tuple[set[str] | None, str | None]:
    """When the program run here may not be the one the model was lowered from (the
    exporter's preparation redone, or a fallback), the fx nodes the model's metadata
    describes exactly; None when every name can be trusted."""
    if prepared.source in (PREPARED_FROM_ONNX_PROGRAM, PREPARED_REPRODUCED):
        return None, None  # the exporter's own program, or checked against this model
    from .source.prepare.check import agreeing_nodes, disagreement

    why = disagreement(prepared.program, model, metadata)
    if why is None:
        return None, None
    if prepared.source == PREPARED_BY_EXPORTER and not any(metadata.texts):
        # graph tools (onnxslim, onnxsim, fusions) drop every node's metadata but keep
        # the value names, which the exporter gave after this very program's fx nodes:
        # nothing contradicts them, and each pair is still proven by dtype and shape
        return None, (
            "the ONNX model carries no exporter metadata (a graph tool removed it): values "
            "are paired by their names, which the exporter gave after the program's fx nodes"
        )
    trusted = agreeing_nodes(prepared.program, model, metadata)
    return trusted, (
        f"the program prepared here is not exactly the one the ONNX model was lowered from "
        f"({why}): values are paired by name only where the model's metadata describes the "
        f"same fx node ({len(trusted)} of them)"
    )


def _reset_names_in_program_words(
    options: RunOptions, pairing: Pairing, provenance: dict[str, Any]
) -> RunOptions:
    """``reset_names`` may use the user's fx node names: those become the paired fx nodes
    of the prepared program that come from them.  An unknown name is an error."""
    if not options.reset_names:
        return options
    known = set(pairing.by_onnx) | {p.fx_name for p in pairing.by_onnx.values()}
    by_user: dict[str, list[str]] = {}
    for fx_name, prov in provenance.items():
        if prov.user_name and fx_name in pairing.by_fx:
            by_user.setdefault(prov.user_name, []).append(fx_name)
    names: list[str] = []
    unknown = []
    for name in options.reset_names:
        if name in known:
            names.append(name)
        elif name in by_user:
            names.extend(by_user[name])
        else:
            unknown.append(name)
    if unknown:
        raise SbsInputError(
            f"reset_names {sorted(unknown)[:5]} name no paired value: use ONNX value names, "
            "fx node names or your own fx node names (ep_user_name) from the records"
        )
    return options.replace(reset_names=tuple(dict.fromkeys(names)))


_LINKING = linking_rules()


def _unmatched_input(inp: onnx.ValueInfoProto, bound: Any) -> str:
    """Why ONNX input ``inp`` pairs with no input of the program, in words: the shapes
    when the program has an input of that name (a model exported for other shapes)."""
    value = bound.values.get(inp.name) if inp.name in bound.user_inputs else None
    if isinstance(value, torch.Tensor):
        dims = [
            d.dim_value if d.HasField("dim_value") else (d.dim_param or "?")
            for d in inp.type.tensor_type.shape.dim
        ]
        return (
            f"ONNX input {inp.name!r} has shape {dims}, the program's {inp.name!r} "
            f"{list(value.shape)}: the ONNX model was exported for other shapes (or from "
            "another model); export it from this program, with the same inputs"
        )
    return (
        f"ONNX input {inp.name!r} matches no input of the program (program inputs: "
        f"{bound.user_inputs}): the model and the program take different inputs"
    )


def _check_pairing(
    pairing: Pairing, model: onnx.ModelProto, bound: Any, program: Any = None
) -> None:
    # graph inputs share names with any model taking the same inputs: they prove nothing,
    # nor does a graph input passed through as an output (an empty graph)
    computes = program is None or any(n.op == "call_function" for n in program.graph.nodes)
    given = {i.name for i in model.graph.input} | set(bound.user_inputs) if computes else set()
    strong = [
        p
        for name, p in pairing.by_onnx.items()
        if p.rule in _LINKING and p.kind != KIND_INPUT and name not in given
    ]
    if not strong:
        raise SbsInputError(
            "the ONNX model shares no computed value, node metadata or weight name with the "
            "program (only its inputs, if anything): it was not exported from this "
            "ExportedProgram (export it with torch.onnx.export(ep, args, dynamo=True) and "
            "pass that model)"
        )
    g = model.graph
    inits = {i.name for i in g.initializer}
    for inp in g.input:
        if inp.name in inits:
            continue
        pair = pairing.by_onnx.get(inp.name)
        if pair is None:
            raise SbsInputError(_unmatched_input(inp, bound))
        value = bound.values.get(pair.fx_name)
        tt = inp.type.tensor_type
        if isinstance(value, torch.Tensor) and tt.elem_type:
            from ..dtypes import ONNX_TO_TORCH

            expected = ONNX_TO_TORCH.get(tt.elem_type)
            both_float = expected is not None and expected.is_floating_point
            if both_float and value.dtype.is_floating_point and pair.cast_to is not None:
                pass  # a model converted to another float type: the input is cast to it
            elif expected is not None and expected != value.dtype:
                raise SbsInputError(
                    f"input {pair.fx_name!r} has dtype {value.dtype} but the ONNX input "
                    f"{inp.name!r} expects {expected}: convert the input"
                )
            if tt.HasField("shape") and len(tt.shape.dim) != value.dim():
                raise SbsInputError(
                    f"input {pair.fx_name!r} has rank {value.dim()} but the ONNX input "
                    f"{inp.name!r} has rank {len(tt.shape.dim)}"
                )


def _name_fusions(
    candidate: OnnxSide,
    model: onnx.ModelProto,
    metadata: FxMetadata,
    pairing: Any,
    program: torch.export.ExportedProgram,
    provenance: dict[str, Any],
) -> None:
    """Nodes a graph tool fused (no metadata of their own): each belongs to the fx node
    its value pairs with, and says which fx nodes it computes, in the user's names."""
    nodes = list(model.graph.node)
    names = list(metadata.names)
    fused = replaced_fx_nodes(nodes, names, pairing, program.graph)
    if not fused:
        return
    candidate.lowering = candidate.tables.lowering = fused_lowering(
        nodes, candidate.producer, names, fused
    )
    for k, fx_nodes in fused.items():
        if len(fx_nodes) < 2:
            continue  # it computes the one fx node it pairs with: nothing more to say
        users: list[str] = []
        for name in fx_nodes:
            p = provenance.get(name)
            user = (p.user_name if p is not None else None) or name
            if user not in users:
                users.append(user)
        candidate.replaces[k] = ", ".join(users)


def run_aligned(
    ep: Any,
    onx: Any,
    args: Any = None,
    kwargs: dict[str, Any] | None = None,
    *,
    inputs: Any = None,
    **options: Any,
) -> RecordStream:
    """Runs both graphs side by side and yields one Record per aligned pair.

    Validation happens now (bad input raises SbsInputError at this call), execution as
    the records are consumed. Options: see :class:`~onnx_sbs_nb.align.options.RunOptions`.
    ``inputs``: many inputs instead of ``args``/``kwargs`` (a list, a DataLoader, a folder
    of ``.pt`` files): one record per pair over all of them, see
    :func:`aligned_over_inputs`.  The iterator returned holds the run as ``.run``.
    """
    if inputs is not None:
        if args is not None or kwargs is not None:
            raise SbsInputError("give one input as args/kwargs or many as inputs=, not both")
        return RecordStream(aligned_over_inputs(ep, onx, inputs, **options))
    return RecordStream(AlignedRun(ep, onx, args, kwargs, **options))


def aligned_over_inputs(
    ep: Any,
    onx: Any,
    inputs: Any,
    options: RunOptions | None = None,
    *,
    keep_records: bool = False,
    on_input: Any = None,
    **option_kwargs: Any,
) -> ManyInputsRun:
    """The run over many inputs (:class:`~onnx_sbs_nb.align.many_inputs.ManyInputsRun`):
    one :class:`AlignedRun` per input, in turn, the program loaded, prepared and paired
    once; iterate it for one record per pair (the worst input's, with ``input_index``,
    ``inputs_failing``, ``inputs_total`` and ``err_abs_mean``).  ``keep_records``: keep
    each input's records too (``records_by_input``); else ``input_records(i)`` runs input
    ``i`` again when asked; ``on_input(index, status)``: called after each input (a
    view's progress).

    ``inputs``: a list or tuple of inputs, any iterable of them (a generator, a
    ``torch.utils.data.DataLoader``) or a folder of ``.pt`` files; an input is a tuple
    or list of positional inputs, a dict of keyword inputs, a tensor or a ``.pt`` path.
    """
    options = RunOptions.from_kwargs(options, **option_kwargs)
    program = load_exported_program(ep, trust_pickles=options.trust_pickles)
    # a file is read once (as AlignedRun reads it), not once per input
    model = LoadedOnnx.of(onx, defer_weights=options.optimize is None)
    reuse = ModelReuse()  # the model is checked and read by the first input's run only
    return ManyInputsRun(
        lambda args, kwargs: AlignedRun(program, model, args, kwargs, options, reuse=reuse),
        inputs,
        keep_records=keep_records,
        on_input=on_input,
        reuse=reuse,
    )


__all__ = [
    "AlignedRun",
    "ManyInputsRun",
    "RecordStream",
    "aligned_over_inputs",
    "SbsInputError",
    "SbsMismatchError",
    "SideBySideRun",
    "run_aligned",
]
