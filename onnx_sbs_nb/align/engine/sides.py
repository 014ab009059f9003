"""The two sides of a side-by-side run, each a graph that runs one node at a time.

The *reference* side says what the values should be: the torch program (:class:`FxSide`)
or an ONNX model on a trusted runtime or device (:class:`OnnxSide`).  The *candidate* side
is an ONNX model run node by node by a node runner (:class:`OnnxSide`); it is judged.
The run loop (``run.py``) only talks to these two objects: the same loop compares a
program with its export, one model on two runtimes, or two models of one program.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import torch

from ...convert import convert, initializer_value
from ...records import KIND_INPUT, KIND_NODE, KIND_OUTPUT, KIND_WEIGHT
from ..judge.precision import inherited_precision, onnx_inherited_precision
from ..judge.ties import tie_axes
from ..judge.undefined import undefined_fx_values
from ..pairing.lowered_by import lowering_of_nodes, returned_outputs
from ..source.fx_metadata import FxMetadata, fx_name_from_metadata
from ..source.program_inputs import ProgramInputs
from ..source.provenance import Provenance, onnx_node_provenance
from .fx_limits import check_fx_output_size, fx_size_rule
from .fx_runs import compile_runs
from .limits import check_output_size
from .plan import Plan, SideGraph
from .randomness import random_nodes
from .runners import ModelContext, TorchRunner, _CachedRunner, node_session_key

_NO_PROVENANCE = Provenance()
_NODE = torch.fx.Node
_NESTED = (list, tuple, dict)


# op overload -> its name: asked once per record, and a graph calls few distinct ops
_OP_NAMES: dict[Any, str] = {}


def fx_target_name(node: torch.fx.Node) -> str:
    """``aten.linear.default``, ``placeholder``, ...: what the fx node computes."""
    if node.op in ("placeholder", "get_attr", "output"):
        return node.op
    t = node.target
    if isinstance(t, torch._ops.OpOverload):
        text = _OP_NAMES.get(t)
        if text is None:
            text = _OP_NAMES[t] = _target_text(t)
        return text
    return _target_text(t)


def _target_text(t: Any) -> str:
    name = getattr(t, "__name__", None) if not isinstance(t, str) else t
    if hasattr(t, "name") and callable(t.name):
        try:
            return t.name().replace("::", ".")
        except Exception:
            pass
    return str(name or t)


def _per_slot(values: Any, declared: Sequence[str]) -> list[Any]:
    """A runner's values, one per declared output slot of the node (None where an
    optional output is omitted, ``''``): a runner may return only the outputs the node
    names (``SkipSimplifiedLayerNormalization`` with outputs ``[y, '', '', sum]``)."""
    if not isinstance(values, list | tuple):
        raise TypeError(f"the runner returned a {type(values).__name__}, not a list of values")
    if len(values) == len(declared):
        return list(values)
    present = [k for k, o in enumerate(declared) if o]
    if len(values) == len(present):
        slots: list[Any] = [None] * len(declared)
        for k, v in zip(present, values):
            slots[k] = v
        return slots
    raise ValueError(
        f"the runner returned {len(values)} values for a node with {len(present)} outputs"
    )


def _lower(elem_type: int) -> bool:
    return elem_type in (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)


def onnx_node_name(node: onnx.NodeProto, k: int) -> str:
    return node.name or f"{node.op_type}_{k}"


@dataclass
class FxTables:
    """What an :class:`FxSide` derives from its program's graph (kept per program by
    ``setup_cache.py``: a program's graph does not change)."""

    nodes: list[torch.fx.Node]
    graph: SideGraph
    index: dict[str, int]
    by_name: dict[str, torch.fx.Node]
    graph_outputs: list[str]
    # fx node name -> the looser float dtype its value inherits (precision.py)
    inherited: dict[str, str] = field(default_factory=dict)
    # fx nodes whose value is uninitialised memory (undefined.py)
    undefined: frozenset[str] = frozenset()
    # FxSide.describe's answers, for the provenance they were made with (a record per
    # pair per run: the same fields each run)
    described: dict[str, dict[str, Any]] = field(default_factory=dict)
    described_with: Any = None

    @classmethod
    def of(cls, program: torch.export.ExportedProgram) -> FxTables:
        g = program.graph
        nodes = [n for n in g.nodes if n.op != "output"]
        return cls(
            nodes,
            SideGraph.of_fx(g),
            {n.name: i for i, n in enumerate(nodes)},
            {n.name: n for n in g.nodes},
            returned_outputs(program),
            inherited_precision(nodes),
            undefined_fx_values(nodes),
        )


def traced_device_map(nodes: list[torch.fx.Node], device: str) -> dict[torch.device, torch.device]:
    """{the device the program was traced on: the run's device} when they differ, else
    empty.  A program exported on the CPU says ``device=cpu`` in its factory calls
    (``arange``, ``zeros``, ``_to_copy``...): run on a GPU as recorded, those values would
    stay on the CPU and the first op mixing them with the inputs would fail.  Those
    arguments move to the run's device, as torch.export's ``move_to_device_pass`` does."""
    run = torch.device(device)
    traced: set[torch.device] = set()
    for node in nodes:
        if node.op != "placeholder":
            break  # placeholders come first
        v = node.meta.get("val")
        if isinstance(v, torch.Tensor):
            traced.add(v.device)
    if len(traced) != 1:
        return {}  # nothing traced, or on several devices: the program says where
    (device_traced,) = traced
    if device_traced == run or (device_traced.type == run.type and run.type == "cpu"):
        return {}
    return {device_traced: run}


class FxSide:
    """The torch program the exporter lowered, run one fx node at a time."""

    value_kind = "torch"

    def __init__(
        self,
        program: torch.export.ExportedProgram,
        bound: ProgramInputs,
        provenance: dict[str, Provenance],
        device: str,
        tables: FxTables | None = None,
    ) -> None:
        self.program = program
        self.graph_module = program.graph_module
        self.bound = bound
        self.provenance = provenance
        self.device = device
        tables = tables or FxTables.of(program)
        self.nodes = tables.nodes
        self.graph = tables.graph
        self.index = tables.index
        self.by_name = tables.by_name
        self.weights = bound.weights
        self.graph_outputs = tables.graph_outputs
        self.inherited = tables.inherited
        self.undefined = tables.undefined
        if tables.described_with is not provenance:
            tables.described, tables.described_with = {}, provenance
        self._described = tables.described
        self.device_map = traced_device_map(self.nodes, device)

    def initial_env(self) -> dict[str, Any]:
        return {}  # its inputs are leaves: read when a node needs them

    def forget(self, name: str) -> None:
        """The program's values are the loop's alone: nothing kept here."""

    def compiled_runs(self, plan: Plan) -> dict[int, Any]:
        return compile_runs(plan, self.nodes, self.device_map)

    def leaf_value(self, name: str) -> Any:
        """The value of a placeholder (input or weight), on the run's device."""
        v = self.bound.values[name]
        if isinstance(v, torch.Tensor) and self.device != "cpu" and v.device.type == "cpu":
            v = v.to(self.device)
            self.bound.values[name] = v
        return v

    def run(self, idx: int, env: dict[str, Any]) -> list[Any]:
        node = self.nodes[idx]
        op = node.op
        if op == "placeholder":
            return [self.leaf_value(node.name)]
        if op == "get_attr":
            obj: Any = self.graph_module
            for part in str(node.target).split("."):
                obj = getattr(obj, part)
            return [obj]
        try:
            args, kwargs = self._arguments(idx, node, env)
        except KeyError as e:
            raise RuntimeError(f"input {e.args[0]!r} is not available (upstream failure)") from None
        if self.device_map:
            args, kwargs = self._on_run_device(args, kwargs)
        # The values, not their gradients, are compared: autograd would only record.
        # The grad mode is switched directly: torch.no_grad() as a context costs as much
        # as a small op, once per node.
        grad = torch.is_grad_enabled()
        torch._C._set_grad_enabled(False)
        try:
            if op == "call_function":
                rule = fx_size_rule(node.target)  # kept per op by fx_limits
                if rule is not None:
                    # the program is untrusted input too: a huge output is refused
                    check_fx_output_size(rule, args, kwargs, self.device)
                return [node.target(*args, **kwargs)]
            if op == "call_module":
                return [self.graph_module.get_submodule(str(node.target))(*args, **kwargs)]
            if op == "call_method":
                return [getattr(args[0], str(node.target))(*args[1:], **kwargs)]
        finally:
            # the caller's mode, whatever a node set (a program may switch it itself)
            torch._C._set_grad_enabled(grad)
        raise RuntimeError(f"unsupported fx node op {op!r}")

    def _arguments(
        self, idx: int, node: torch.fx.Node, env: dict[str, Any]
    ) -> tuple[Any, dict[str, Any]]:
        """``node``'s arguments with its input nodes replaced by their values (KeyError:
        one is missing).  Most nodes take their inputs as plain arguments: those are read
        in one walk, without walking nested structures (nor making closures, which the
        garbage collector would walk again on a large graph)."""
        args = []
        for a in node.args:
            if isinstance(a, _NODE):
                args.append(env[a.name])
            elif isinstance(a, _NESTED):
                return self._nested_arguments(node, env)
            else:
                args.append(a)
        kwargs = node.kwargs
        if not kwargs:
            return args, {}
        values = {}
        for k, a in kwargs.items():
            if isinstance(a, _NODE):
                values[k] = env[a.name]
            elif isinstance(a, _NESTED):
                return self._nested_arguments(node, env)
            else:
                values[k] = a
        return args, values

    def _on_run_device(self, args: Any, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """The arguments with the traced device replaced by the run's (``device_map``)."""
        moved = self.device_map
        args = [moved.get(a, a) if isinstance(a, torch.device) else a for a in args]
        kwargs = {
            k: moved.get(a, a) if isinstance(a, torch.device) else a for k, a in kwargs.items()
        }
        return args, kwargs

    @staticmethod
    def _nested_arguments(node: torch.fx.Node, env: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        def load(a: torch.fx.Node) -> Any:
            return env[a.name]

        return (
            torch.fx.node.map_arg(node.args, load),
            torch.fx.node.map_arg(node.kwargs, load),
        )

    def is_weight(self, name: str) -> bool:
        return name in self.weights

    def reports_unpaired(self, idx: int, value: Any, failed: bool) -> bool:
        """Whether a value without partner deserves a record: computed tensors, weights,
        inputs and outputs (a program weight or output nobody compared is never dropped)."""
        node = self.nodes[idx]
        if failed or node.name in self.graph_outputs:
            return True
        if node.op in ("call_function", "placeholder"):
            return isinstance(value, torch.Tensor)
        return False

    def kind_of(self, name: str) -> str:
        node = self.by_name[name]
        if name in self.graph_outputs:
            return KIND_OUTPUT
        if node.op == "placeholder":
            return KIND_WEIGHT if name in self.weights else KIND_INPUT
        return KIND_NODE

    def describe(self, name: str) -> dict[str, Any]:
        """The ``ep_*`` fields of a record about value ``name`` (read only: kept)."""
        found = self._described.get(name)
        if found is None:
            node = self.by_name[name]
            prov = self.provenance.get(name, _NO_PROVENANCE)
            found = self._described[name] = {
                "ep_id_node": self.index.get(name),
                "ep_name": name,
                "ep_target": fx_target_name(node),
                "ep_user_name": prov.user_name,
                "ep_module": prov.module,
                "ep_source": prov.source,
            }
        return found


@dataclass
class OnnxTables:
    """What an :class:`OnnxSide` derives from its model's structure: names and keys, no
    protobuf object, so a second run of the same program and model may keep them
    (``setup_cache.py``) without keeping the model, weights included, alive."""

    graph: SideGraph
    graph_inputs: list[str]
    graph_outputs: list[str]
    producer: dict[str, int]
    lowering: list[str | None]
    # per node: its session key (runners.node_session_key), filled as the node first runs
    node_keys: list[Any]
    # the nodes drawing random values (randomness.py)
    random_nodes: tuple[int, ...] = ()
    # TopK nodes and their axes: indices among ties (ties.py)
    tie_axes: dict[int, int] = field(default_factory=dict)
    # plans of runs over these tables, by (pairing key, whether nodes wait for torch inputs)
    plans: dict[Any, Any] = field(default_factory=dict)
    # what runs saw node by node, by runner and input shapes: stretches (stretches.py)
    stretch_memos: dict[Any, Any] = field(default_factory=dict)
    # per node: (op type, domain, the name records show), read once per model
    node_facts: list[tuple[str, str, str]] = field(default_factory=list)
    # OnnxSide.describe_candidate's answers (structure only: the same each run)
    described: dict[str, dict[str, Any]] = field(default_factory=dict)
    # per value: the looser float dtype it is computed from (precision.py), made once
    computed_in: dict[str, str] | None = None
    # the lowering was inferred from the pairs (no exporter metadata): no evidence that
    # a node belongs to an fx node whose value was compared
    lowering_inferred: bool = False
    # ... except these fx nodes, each of whose tensor inputs was paired too: their nodes
    # lie between compared values on both sides, so they are covered by the comparison
    lowering_bounded: frozenset[str] = frozenset()
    # (model, its initializers' arrays) the model's check read this run, until the side
    # made next takes them: held for the few lines between (run.py), never across runs
    _handed: tuple[Any, dict[str, Any]] | None = field(default=None, repr=False, compare=False)

    def hand_reads(self, model: onnx.ModelProto, reads: dict[str, Any]) -> None:
        """The initializers of ``model`` as its check read them now, for the next side."""
        self._handed = (model, reads)

    def take_reads(self, model: onnx.ModelProto) -> dict[str, Any]:
        """What :meth:`hand_reads` handed, if for this very model object; once."""
        handed, self._handed = self._handed, None
        return handed[1] if handed is not None and handed[0] is model else {}

    @classmethod
    def of(
        cls,
        model: onnx.ModelProto,
        ctx: ModelContext,
        nodes: list[onnx.NodeProto] | None = None,
        metadata: FxMetadata | None = None,
    ) -> OnnxTables:
        g = model.graph
        graph = SideGraph.of_onnx(model, ctx.free_variables)
        initializers = {i.name: i for i in g.initializer}
        producer = {o: k for k, outs in enumerate(graph.outputs) for o in outs if o}
        nodes = nodes if nodes is not None else list(g.node)
        return cls(
            graph,
            [i.name for i in g.input if i.name not in initializers],
            [o.name for o in g.output],
            producer,
            lowering_of_nodes(nodes, producer, metadata.names if metadata else None),
            [None] * len(graph.outputs),
            random_nodes(nodes, initializers),
            tie_axes=tie_axes(nodes),
            node_facts=[(n.op_type, n.domain, onnx_node_name(n, k)) for k, n in enumerate(nodes)],
        )


_KEYED_PREPARE = (_CachedRunner.prepare, TorchRunner.prepare)


# what a runner may hand back for one output: a tensor or array, a sequence of them (ONNX
# sequences), a map, None (an empty optional)
_VALUE_TYPES = (np.ndarray, np.generic, torch.Tensor, list, tuple, dict, type(None))


class RunnerOutputError(TypeError):
    """A node runner returned something that is not one value per output of its node."""


def _checked_outputs(node: onnx.NodeProto, outputs: Any) -> list[Any]:
    """The runner's outputs, one per output of ``node``; a wrong return (a custom runner's
    mistake) raises, so the node gets a failure record instead of the run a KeyError."""
    what = f"the runner of {node.op_type} node {node.name!r}"
    if not isinstance(outputs, list | tuple):
        raise RunnerOutputError(
            f"{what} returned a {type(outputs).__name__}: it must return a list with one "
            f"value per output of the node ({len(node.output)})"
        )
    try:
        # a runner may return only the outputs the node names (omitted optional ones '')
        outputs = _per_slot(outputs, node.output)
    except ValueError:
        raise RunnerOutputError(
            f"{what} returned {len(outputs)} values for the node's {len(node.output)} outputs"
        ) from None
    for name, value in zip(node.output, outputs):
        if name and not isinstance(value, _VALUE_TYPES):
            raise RunnerOutputError(
                f"{what} returned a {type(value).__name__} for output {name!r}: expected a "
                "torch tensor or a numpy array"
            )
    return outputs if isinstance(outputs, list) else list(outputs)


class OnnxSide:
    """An ONNX model run one node at a time by a node runner.

    ``tables``: its :class:`OnnxTables`, when kept from an earlier run of this model's
    structure (their opsets and local functions included).  ``folder``: the folder of a
    model loaded with its large weights left in their external data file.
    """

    def __init__(
        self,
        model: onnx.ModelProto,
        runner: Any,
        device: str,
        feeds: dict[str, Any] | None = None,
        tables: OnnxTables | None = None,
        folder: Any = None,
    ) -> None:
        self.model = model
        # where the model's external data lives, when its large weights stayed there
        self.folder = folder
        self.runner = runner
        self.device = device
        self.ctx = ModelContext.from_model(model, device)
        g = model.graph
        self.nodes = list(g.node)
        # the initializers the model's check read this run (setup_cache.checked_model):
        # read again they would be copied again (twice or more per weight and run)
        self._checked_reads = tables.take_reads(model) if tables is not None else {}
        self.tables = tables = tables or OnnxTables.of(model, self.ctx, self.nodes)
        self.graph = tables.graph
        self.initializers = {i.name: i for i in g.initializer}
        self.graph_inputs = tables.graph_inputs
        self.graph_outputs = tables.graph_outputs
        # an ONNX reference runs its own precision on both sides: nothing inherited
        self.inherited: dict[str, str] = {}
        self.undefined: frozenset[str] = frozenset()  # no torch.empty in a model
        self.device_map: dict[Any, Any] = {}  # nodes run where the runner runs them
        self.producer = tables.producer
        self.lowering = tables.lowering
        # a fused node (no metadata) -> the fx nodes it computes, in the user's names
        self.replaces: dict[int, str] = {}
        # sessions keyed by kept keys: only where the runner's own prepare is not replaced
        # runners whose prepare takes the node's session key, kept with the tables
        self._keyed = getattr(type(runner), "prepare", None) in _KEYED_PREPARE
        # the values of the graph inputs, in any form (converted for the runner when used)
        self.feeds: dict[str, Any] = dict(feeds or {})
        self.notes: dict[str, str] = {}  # value -> how its node was run, if unusual
        self._fns: dict[int, Any] = {}
        self._init_cache: dict[str, Any] = {}

    @property
    def value_kind(self) -> str:
        return self.runner.value_kind

    def low_precision_lineage(self, pairing: Any) -> dict[str, str]:
        """For a model that stores the program's weights in a lower float precision (a
        converter made it float16 or bfloat16): each value computed from lower-precision
        values, and that dtype.  Empty for a model that keeps the program's precision:
        there an export computing in float16 where the program does not is an error."""
        converted = any(
            p.cast_to is not None and p.kind == KIND_WEIGHT and _lower(p.cast_to)
            for p in pairing.by_onnx.values()
        )
        if not converted:
            return {}
        if self.tables.computed_in is None:
            self.tables.computed_in = onnx_inherited_precision(
                self.model, self.graph.inputs, self.graph.outputs
            )
        return self.tables.computed_in

    @property
    def name(self) -> str:
        return str(getattr(self.runner, "name", "custom"))

    def as_runner_value(self, v: Any) -> Any:
        return convert(v, self.value_kind, self.device)

    def initializer(self, name: str) -> Any:
        v = self._init_cache.get(name)
        if v is None:
            read = self._checked_reads.get(name)
            if read is not None:
                v = convert(read, self.value_kind, self.device)
            else:
                v = initializer_value(
                    self.initializers[name], self.value_kind, self.device, self.folder
                )
            self._init_cache[name] = v
        return v

    def checked_read(self, name: str) -> Any:
        """The array of initializer ``name`` as the model's check read its raw bytes this
        run (None: not read there), for a caller that would read them again."""
        return self._checked_reads.get(name)

    def forget(self, name: str) -> None:
        """Our copy of an initializer goes (the ModelProto still holds its bytes; the
        check's read of a small model's weights stays, for the run)."""
        self._init_cache.pop(name, None)

    def leaf_value(self, name: str) -> Any:
        """A graph input's or an initializer's value."""
        if name in self.feeds:
            return self.feeds[name]
        return self.initializer(name)

    def initial_env(self) -> dict[str, Any]:
        return {n: self.as_runner_value(v) for n, v in self.feeds.items()}

    def compiled_runs(self, plan: Plan) -> dict[int, Any]:
        return {}  # its nodes run one at a time (a stretch runs the candidate's)

    def node_inputs(self, node: onnx.NodeProto) -> list[str]:
        return [*node.input, *self.ctx.free_variables(node)]

    def fn(self, idx: int) -> Any:
        fn = self._fns.get(idx)
        if fn is None:
            node = self.nodes[idx]
            if self._keyed:
                keys = self.tables.node_keys
                key = keys[idx]
                if key is None:
                    key = keys[idx] = node_session_key(node, self.ctx)
                fn = self.runner.prepare(node, self.ctx, key)
            else:
                fn = self.runner.prepare(node, self.ctx)
            self._fns[idx] = fn
        return fn

    def inputs(self, idx: int, env: dict[str, Any]) -> list[Any]:
        """The node's inputs from ``env`` and the initializers (KeyError: one is missing)."""
        values = []
        for name in self.graph.inputs[idx]:  # node_inputs(), listed once per model
            if not name:
                values.append(None)
            elif name in env:
                values.append(env[name])
            elif name in self.initializers:
                values.append(self.initializer(name))
            else:
                raise KeyError(name)
        return values

    def node_and_inputs(
        self, name: str, env: dict[str, Any]
    ) -> tuple[onnx.NodeProto, list[Any] | None] | None:
        """The node computing value ``name`` and its inputs from ``env`` (None where one
        is missing), None for a value no node computes."""
        k = self.producer.get(name)
        if k is None:
            return None
        try:
            inputs = self.inputs(k, env)
        except KeyError:
            inputs = None
        return self.nodes[k], inputs

    def call(self, idx: int, inputs: Sequence[Any]) -> list[Any]:
        # an output larger than the free memory is refused before it is allocated
        facts = self.tables.node_facts
        check_output_size(self.nodes[idx], inputs, self.device, facts[idx][:2] if facts else None)
        fn = self.fn(idx)
        outputs = _checked_outputs(self.nodes[idx], fn(inputs))
        note = getattr(fn, "fallback_reason", None)
        if note:
            for o in self.nodes[idx].output:
                self.notes[o] = note
        return outputs

    def run(self, idx: int, env: dict[str, Any]) -> list[Any]:
        return self.call(idx, self.inputs(idx, env))

    def is_weight(self, name: str) -> bool:
        return name in self.initializers

    def reports_unpaired(self, idx: int, value: Any, failed: bool) -> bool:
        return True

    def kind_of(self, name: str) -> str:
        if name in self.graph_outputs:
            return KIND_OUTPUT
        if name in self.initializers:
            return KIND_WEIGHT
        return KIND_NODE if name in self.producer else KIND_INPUT

    def node_name(self, idx: int) -> str:
        facts = self.tables.node_facts
        return facts[idx][2] if facts else onnx_node_name(self.nodes[idx], idx)

    def describe(self, name: str) -> dict[str, Any]:
        """The ``ep_*`` fields of a record, when this model is the reference."""
        k = self.producer.get(name)
        if k is None:
            target = "initializer" if name in self.initializers else "input"
            return {"ep_id_node": -1, "ep_name": name, "ep_target": target}
        node = self.nodes[k]
        prov = onnx_node_provenance(node)
        return {
            "ep_id_node": k,
            "ep_name": name,
            "ep_target": node.op_type,
            "ep_user_name": fx_name_from_metadata(node),
            "ep_module": prov.module,
            "ep_source": prov.source,
        }

    def describe_candidate(self, name: str) -> dict[str, Any]:
        """The ``onnx_*`` fields of a record about value ``name`` of this model (read
        only: kept with the tables)."""
        described = self.tables.described
        found = described.get(name)
        if found is not None:
            return found
        k = self.producer.get(name)
        if k is None:
            op = "initializer" if name in self.initializers else "input"
            found = {"onnx_id_node": -1, "onnx_name": name, "onnx_op_type": op}
        else:
            facts = self.tables.node_facts
            if facts:
                op_type, domain, node_name = facts[k]
            else:
                node = self.nodes[k]
                op_type, domain, node_name = node.op_type, node.domain, onnx_node_name(node, k)
            found = {
                "onnx_id_node": k,
                "onnx_name": name,
                "onnx_op_type": op_type,
                "onnx_domain": domain or None,
                "onnx_id_output": self.graph.outputs[k].index(name),
                "onnx_node_name": node_name,
                "onnx_fx_node": self.lowering[k],
                "onnx_fx_inferred": self.tables.lowering_inferred
                and self.lowering[k] not in self.tables.lowering_bounded,
                "onnx_fuses": self.replaces.get(k),
            }
        described[name] = found
        return found


__all__ = ["FxSide", "FxTables", "OnnxSide", "OnnxTables", "fx_target_name", "onnx_node_name"]
