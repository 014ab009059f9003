"""TorchOnnxEvaluator: runs an ONNX model (or one node) with torch kernels."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
import torch

from ..convert import to_numpy, to_torch
from ..device import resolve_device as checked_device
from .attributes import UnknownAttributeError
from .compiled import (
    CompiledGraph,
    MissingKernelError,
    NodeError,
    graph_free_names,
    node_implicit_inputs,
)
from .compiler import Compiler
from .lowbit import LOWBIT_DTYPES
from .registry import normalize_domain, supported_ops
from .specialize import ShapeSpecializer

__all__ = [
    "MissingKernelError",
    "NodeArg",
    "NodeError",
    "TorchOnnxEvaluator",
    "UnknownAttributeError",
    "compile_node",
    "supported_ops",
]

Kernel = Callable[..., Any]


@dataclass(frozen=True)
class NodeArg:
    """An input or output description, like onnxruntime's ``NodeArg``."""

    name: str
    type: str
    shape: list[int | str | None]


def _type_string(tp: onnx.TypeProto) -> str:
    which = tp.WhichOneof("value")
    if which == "tensor_type":
        return f"tensor({_elem_name(tp.tensor_type.elem_type)})"
    if which == "sequence_type":
        return f"seq({_type_string(tp.sequence_type.elem_type)})"
    if which == "optional_type":
        return f"optional({_type_string(tp.optional_type.elem_type)})"
    if which == "map_type":
        return "map"
    return "unknown"


def _elem_name(elem: int) -> str:
    if elem == 0:
        return "undefined"
    name = onnx.TensorProto.DataType.Name(elem).lower()
    return {"float": "float", "double": "double"}.get(name, name)


def _shape(tp: onnx.TypeProto) -> list[int | str | None]:
    if tp.WhichOneof("value") != "tensor_type" or not tp.tensor_type.HasField("shape"):
        return []
    return [
        d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
        for d in tp.tensor_type.shape.dim
    ]


def _node_arg(vi: onnx.ValueInfoProto) -> NodeArg:
    return NodeArg(vi.name, _type_string(vi.type), _shape(vi.type))


def resolve_device(
    device: str | torch.device | None, providers: Sequence[str] | None
) -> torch.device:
    """The torch device of an evaluator: explicit ``device`` wins over ``providers``."""
    if device is None:
        providers = providers or ()
        names = [p[0] if isinstance(p, tuple) else p for p in providers]
        device = "cuda" if "CUDAExecutionProvider" in names else "cpu"
    return checked_device(device, allow_meta=True)


def _opsets_of(proto: Any) -> dict[str, int]:
    return {normalize_domain(o.domain): o.version for o in proto.opset_import}


class TorchOnnxEvaluator:
    """Runs an ONNX model with torch kernels, with onnxruntime's ``run`` interface.

    ``model``: a ModelProto, a path to one, a GraphProto or a NodeProto (pass
    ``opsets={"": 18}``), or a FunctionProto (its own opset imports are used).
    ``providers=("CUDAExecutionProvider",)`` or ``device="cuda"`` runs on the GPU:
    weights move there once; shapes stay on the CPU so that shape arithmetic never
    synchronises the device; every result is returned on the device.

    ``run(output_names, feeds)`` takes torch tensors (results are torch tensors) or numpy
    arrays (results are numpy arrays). Without ``device`` or a CUDA provider, the model
    runs where the torch feeds are (CUDA feeds: weights copied there once, at the first
    such run), without copying them; with one, feeds elsewhere are moved to that device.

    ``custom_kernels={(domain, op_type): fn}`` replaces the implementation of any op
    (the calling convention is the one of ``onnx_sbs_nb.evaluator.registry``: inputs
    positionally, attributes as keyword arguments under their ONNX names)::

        def my_gelu(x, approximate="none"):
            return torch.nn.functional.gelu(x.double(), approximate=approximate).to(x.dtype)

        ev = TorchOnnxEvaluator(onx, custom_kernels={("", "Gelu"): my_gelu})
        (y,) = ev.run(None, {"x": torch.randn(2, 3)})

    A node whose op has no kernel at the model's opset raises ``MissingKernelError`` at
    construction; ``supported_ops()`` lists what exists. A node carrying an attribute
    that neither the ONNX spec of its op (at the model's opset) nor its kernel knows
    raises ``UnknownAttributeError`` (a ValueError) at construction, subgraphs included
    (``attributes.py``; a custom kernel accepts what its signature takes).

    ``manage_placement`` (default: on accelerators only) turns on the host/device
    placement of shape values; forcing it on CPU exercises that logic in tests.

    From the second run with inputs of given shapes, dtypes and devices, the values
    computed from those shapes alone (``specialize.py``) are constants of a plan made for
    them (a model exported with dynamic shapes then runs like a static one). On CPU, once
    a plan has run ``compiled.JIT_AFTER`` (20) times, its generated code is compiled with
    TorchScript when every node has an inline form: the same aten calls without a Python
    frame per node (about a third less time on small models), after a one-time cost of
    tens of milliseconds. For feeds of the shapes, strides and dtypes of the run that
    compiled it, that code writes values that die at a step into their own memory and
    drops the checks the run settled (``inplace.py``, ``fixed.py``; the same kernels, so
    the same bits). ``jit=False`` keeps the Python code.
    """

    def __init__(
        self,
        model: onnx.ModelProto | onnx.GraphProto | onnx.FunctionProto | onnx.NodeProto | str,
        *,
        providers: Sequence[str] | None = ("CPUExecutionProvider",),
        device: str | torch.device | None = None,
        custom_kernels: dict[tuple[str, str], Kernel] | None = None,
        opsets: dict[str, int] | int | None = None,
        functions: Sequence[onnx.FunctionProto] | None = None,
        verbose: int = 0,
        manage_placement: bool | None = None,
        jit: bool = True,
    ) -> None:
        if isinstance(model, (str, os.PathLike)):
            model = onnx.load(os.fspath(model))
        self.device = resolve_device(device, providers)
        self.verbose = verbose
        if isinstance(opsets, int):
            opsets = {"": opsets}
        funcs: list[onnx.FunctionProto] = list(functions or [])
        if isinstance(model, onnx.ModelProto):
            model_opsets = _opsets_of(model)
            funcs = [*model.functions, *funcs]
            graph = model.graph
        elif isinstance(model, onnx.GraphProto):
            if opsets is None:
                raise ValueError("a GraphProto needs opsets=, e.g. opsets={'': 18}")
            model_opsets = dict(opsets)
            graph = model
        elif isinstance(model, onnx.FunctionProto):
            model_opsets = {**(opsets or {}), **_opsets_of(model)}
            graph = _function_as_graph(model)
        elif isinstance(model, onnx.NodeProto):
            if opsets is None:
                raise ValueError("a NodeProto needs opsets=, e.g. opsets={'': 18}")
            model_opsets = dict(opsets)
            graph = _node_as_graph(model)
        else:
            raise TypeError(
                f"model must be a ModelProto, GraphProto, FunctionProto, NodeProto or a "
                f"path, not {type(model).__name__}"
            )
        if opsets and isinstance(model, onnx.ModelProto):
            model_opsets.update(opsets)
        self.opsets = {normalize_domain(k): v for k, v in model_opsets.items()}
        self.graph = graph
        self._compiler_args = (
            self.opsets,
            {(f.domain, f.name): f for f in funcs},
            custom_kernels,
        )
        self._manage_placement = manage_placement
        self._jit = jit
        self._compiler = Compiler(
            *self._compiler_args, self.device, manage_placement=manage_placement
        )
        # No device asked for: the evaluator computes where the torch feeds are.
        self._follow_feeds = device is None and self.device.type == "cpu"
        self._elsewhere: dict[torch.device, tuple[Compiler, dict]] = {}
        inits = {i.name for i in graph.initializer}
        self._inputs = [_node_arg(i) for i in graph.input if i.name not in inits]
        self._outputs = [_node_arg(o) for o in graph.output]
        self._output_names = [o.name for o in graph.output]
        free = graph_free_names(graph)
        if free:
            raise ValueError(f"the graph reads undefined values {free[:5]}")
        self._plans: dict[tuple[str, ...], CompiledGraph] = {}
        self._nodes: dict[tuple[str, ...], list[onnx.NodeProto]] = {}
        self._plan_for(tuple(self._output_names))
        # ops that are not the built-in ones (custom kernels, local functions) stop the
        # shape analysis: what they compute is not known
        replaced = [*(custom_kernels or {}), *self._compiler_args[1]]
        self._specializer = ShapeSpecializer(graph, self.input_names, replaced, jit)
        # what run's CPU fast path reads (None: that path is off)
        self._output_names_t = tuple(self._output_names)
        self._input_names_t = tuple(self.input_names)
        on_cpu = self.device.type == "cpu" and not self._compiler.manage_placement
        self._cpu_plan = self._plans[self._output_names_t] if on_cpu else None
        self._cpu_nodes = self._nodes_for(self._output_names_t)

    def supported_ops(self) -> list[tuple[str, str, int]]:
        """Every (domain, op_type, since_version) this evaluator runs: the built-in
        kernels (:func:`~onnx_sbs_nb.evaluator.supported_ops`) and its custom kernels
        (since version 1: they replace the op at every opset)."""
        custom = {(normalize_domain(d), op, 1) for d, op in self._compiler_args[2] or {}}
        return sorted({*supported_ops(), *custom})

    # -- onnxruntime-like interface ---------------------------------------------------------

    def get_inputs(self) -> list[NodeArg]:
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        return list(self._outputs)

    @property
    def input_names(self) -> list[str]:
        return [i.name for i in self._inputs]

    @property
    def output_names(self) -> list[str]:
        return list(self._output_names)

    def run(
        self,
        output_names: Sequence[str] | None,
        feeds: dict[str, Any],
        run_options: Any = None,
        *,
        hook: Callable[[int, onnx.NodeProto, list[Any]], None] | None = None,
    ) -> list[Any]:
        """Runs the model and returns the requested outputs (all when ``output_names`` is
        None). ``run_options`` is accepted for onnxruntime compatibility and ignored.
        ``hook(step, node, live_values)`` is called after each node (debugging, memory)."""
        if hook is None and not self.verbose and self._cpu_plan is not None:
            res = self._run_cpu_tensors(output_names, feeds)
            if res is not None:
                return res
        names = tuple(output_names) if output_names else tuple(self._output_names)
        compiler, plans, dev = self._compiler, self._plans, self.device
        if self._follow_feeds:
            feed_dev = _feed_device(feeds)
            if feed_dev is not None and feed_dev != dev:
                compiler, plans = self._on(feed_dev)
                dev = compiler.device
        plan = plans.get(names) or self._plan_for(names, compiler, plans)
        as_numpy = False
        inputs: list[Any] = []
        for name in plan.input_names:
            v = feeds.get(name, _MISSING)
            if v is _MISSING:
                raise KeyError(f"missing feed {name!r}; the model expects {self.input_names}")
            if _is_string_array(v):
                # string tensors have no torch dtype: kernels take numpy object arrays (and
                # they say nothing of the form the caller wants numeric results in)
                pass
            elif not isinstance(v, (torch.Tensor, list)) and v is not None:
                as_numpy = True
                v = to_torch(v)
            elif isinstance(v, list) and v and not isinstance(v[0], torch.Tensor):
                as_numpy = True
                v = to_torch(v)
            inputs.append(_to_device(v, dev))
        if len(feeds) > len(inputs):
            unknown = set(feeds) - set(self.input_names)
            if unknown:
                raise KeyError(f"unknown feeds {sorted(unknown)}; inputs are {self.input_names}")
        # Inference mode skips autograd and version-counter bookkeeping on every kernel
        # call (a quarter of the run on small models); feeds that require grad do not
        # make the run record a graph.
        with torch.inference_mode():
            if hook is not None or self.verbose:
                res = plan.execute_debug(inputs, (), hook or self._verbose_hook)
            else:
                res = self._specializer.run(compiler, names, self._nodes_for(names), inputs)
                if res is None:
                    res = plan.execute(inputs)
        if as_numpy:
            return [to_numpy(r) for r in res]
        if compiler.manage_placement and dev.type != "cpu":
            # shape-like results were computed on the host: hand everything back on the device
            res = [_to_device(r, dev) for r in res]
        # Results are ordinary tensors: the caller may modify them in place or use them
        # with autograd, which inference tensors forbid. Only the outputs are copied.
        return [_ordinary(r) for r in res]

    # -- internals --------------------------------------------------------------------------

    def _run_cpu_tensors(self, output_names: Sequence[str] | None, feeds: dict[str, Any]):
        """The common call, in fewer steps: all outputs, every input fed as a plain CPU
        tensor, on a CPU evaluator; None for anything else (the general path then runs).
        On a small model the general path's checks cost a few percent of the run."""
        if output_names and tuple(output_names) != self._output_names_t:
            return None
        if len(feeds) != len(self._input_names_t):
            return None
        inputs = []
        for name in self._input_names_t:
            v = feeds.get(name)
            if type(v) is not torch.Tensor or v.device.type != "cpu":
                return None
            inputs.append(v)
        # the C++ guard torch.inference_mode() enters, without its Python wrapper
        guard = torch._C._InferenceMode(True)
        try:
            res = self._specializer.run(
                self._compiler, self._output_names_t, self._cpu_nodes, inputs
            )
            if res is None:
                res = self._cpu_plan.execute(inputs)
        finally:
            del guard
        return [_ordinary(r) for r in res]

    def _on(self, dev: torch.device) -> tuple[Compiler, dict]:
        """Compiler and plans for another device (feeds there, no device requested)."""
        dev = resolve_device(dev, None)
        if dev not in self._elsewhere:
            compiler = Compiler(*self._compiler_args, dev, manage_placement=self._manage_placement)
            self._elsewhere[dev] = (compiler, {})
        return self._elsewhere[dev]

    def _plan_for(
        self,
        names: tuple[str, ...],
        compiler: Compiler | None = None,
        plans: dict | None = None,
    ) -> CompiledGraph:
        compiler = compiler or self._compiler
        plans = self._plans if plans is None else plans
        known = set(self._output_names) | {n for node in self.graph.node for n in node.output}
        known |= {i.name for i in self.graph.input} | {i.name for i in self.graph.initializer}
        for n in names:
            if n not in known:
                raise ValueError(f"{n!r} is not a value of the model")
        # Initializers are converted (and moved to the device) once, shared by all plans.
        plan = compiler.compile(
            self._nodes_for(names),
            [i.name for i in self._inputs],
            list(names),
            compiler.graph_initializers(self.graph),
            inputs_on_device=True,
            jit=self._jit,
        )
        plans[names] = plan
        return plan

    def _nodes_for(self, names: tuple[str, ...]) -> list[onnx.NodeProto]:
        """The nodes computing ``names``."""
        if names not in self._nodes:
            nodes = list(self.graph.node)
            if set(names) != set(self._output_names):
                nodes = _needed_nodes(nodes, names)
            self._nodes[names] = nodes
        return self._nodes[names]

    def _verbose_hook(self, k: int, node: onnx.NodeProto, live: list[Any]) -> None:
        """verbose=1: one line per node with the values alive after it and their size."""
        if self.verbose:
            size = sum(v.numel() * v.element_size() for v in live if isinstance(v, torch.Tensor))
            print(
                f"[TorchOnnxEvaluator] {k}: {node.op_type}({node.name!r}) "
                f"-> {list(node.output)}; live values {len(live)}, {size / 2**20:.2f} MiB"
            )


_MISSING = object()


def _ordinary(v: Any) -> Any:
    """An output made in inference mode as a normal tensor (a copy only when needed)."""
    if isinstance(v, torch.Tensor):
        if v.is_inference() and v.dtype in LOWBIT_DTYPES:
            # torch's storage-only dtypes have no copy kernel: copy the bytes
            return v.view(torch.uint8).clone().view(v.dtype)
        return v.clone() if v.is_inference() else v
    if isinstance(v, list):
        return [_ordinary(t) for t in v]
    return v


def _is_string_array(v: Any) -> bool:
    return isinstance(v, np.ndarray) and (v.dtype == np.object_ or v.dtype.kind in "SU")


def _feed_device(feeds: dict[str, Any]) -> torch.device | None:
    for v in feeds.values():
        if isinstance(v, torch.Tensor):
            return v.device
        if isinstance(v, list) and v and isinstance(v[0], torch.Tensor):
            return v[0].device
    return None


def _to_device(v: Any, dev: torch.device) -> Any:
    if isinstance(v, torch.Tensor):
        return v if v.device == dev else v.to(dev)
    if isinstance(v, list):
        return [_to_device(x, dev) for x in v]
    return v


def _needed_nodes(nodes: list[onnx.NodeProto], names: Sequence[str]) -> list[onnx.NodeProto]:
    """The nodes the requested values depend on, in their order."""
    needed = set(names)
    keep = []
    for node in reversed(nodes):
        if any(o in needed for o in node.output):
            keep.append(node)
            needed.update(n for n in node.input if n)
            needed.update(node_implicit_inputs(node))
    return keep[::-1]


def _node_as_graph(node: onnx.NodeProto) -> onnx.GraphProto:
    return onnx.helper.make_graph(
        [node],
        node.name or node.op_type,
        [onnx.helper.make_empty_tensor_value_info(n) for n in node.input if n],
        [onnx.helper.make_empty_tensor_value_info(n) for n in node.output if n],
    )


def _function_as_graph(f: onnx.FunctionProto) -> onnx.GraphProto:
    return onnx.helper.make_graph(
        list(f.node),
        f.name,
        [onnx.helper.make_empty_tensor_value_info(n) for n in f.input],
        [onnx.helper.make_empty_tensor_value_info(n) for n in f.output],
    )


def compile_node(
    node: onnx.NodeProto,
    opsets: dict[str, int],
    functions: dict[tuple[str, str], onnx.FunctionProto] | None = None,
    device: str | torch.device | None = None,
    custom_kernels: dict[tuple[str, str], Kernel] | None = None,
) -> Callable[[list[torch.Tensor | None]], list[torch.Tensor]]:
    """A callable running one node on a list of inputs (positional, None for missing ones).

    When the node's subgraphs read values of the enclosing graph, pass them after the
    inputs, in the order of ``callable.outer_names``.

    The kernel, attributes and (for function calls) the body are prepared once; the call
    costs one kernel dispatch. Results are those of the same node inside its graph.
    ``device=None`` computes where the inputs are.
    """
    dev = torch.device(device) if isinstance(device, str) else device
    if dev is not None and dev.type == "cuda" and dev.index is None:
        dev = resolve_device(dev, None)
    compiler = Compiler(opsets, functions, custom_kernels, dev)
    names = [f"__in{i}" if n else "" for i, n in enumerate(node.input)]
    outs = [f"__out{i}" if n else "" for i, n in enumerate(node.output)]
    renamed = onnx.NodeProto()
    renamed.CopyFrom(node)
    del renamed.input[:]
    renamed.input.extend(names)
    del renamed.output[:]
    renamed.output.extend(outs)
    # Values the node's subgraphs read from the enclosing graph come after its inputs.
    outer = node_implicit_inputs(node)
    cg = compiler.compile(
        [renamed],
        [n for n in names if n],
        [n for n in outs if n],
        outer_names=outer,
        inputs_on_device=False,
    )
    n_in = len(node.input)
    execute = cg.execute
    positions = [i for i, n in enumerate(names) if n]
    if _is_direct(cg, n_in) and not outer:
        # One kernel call, no slot bookkeeping: what the engine does thousands of times.
        fn, ins, _, attrs, _ = cg.steps[0]
        k = len(ins)
        out_pos = [i for i, n in enumerate(outs) if n]
        single = len(out_pos) == 1 and out_pos[0] == 0

        def run_node(inputs: list[Any]) -> list[Any]:
            if len(inputs) != k:
                inputs = (list(inputs) + [None] * (k - len(inputs)))[:k]
            res = fn(*inputs, **attrs)
            if type(res) is not tuple:
                return [res]
            if single:
                return [res[0]]
            return [res[i] if i < len(res) else None for i in out_pos]

    elif len(positions) == n_in and not outer:

        def run_node(inputs: list[Any]) -> list[Any]:
            if len(inputs) != n_in:
                inputs = list(inputs) + [None] * (n_in - len(inputs))
            return execute(inputs)

    else:

        def run_node(inputs: list[Any]) -> list[Any]:
            inputs = list(inputs) + [None] * (n_in + len(outer) - len(inputs))
            return execute([inputs[i] for i in positions], inputs[n_in:])

    run_node.outer_names = outer  # type: ignore[attr-defined]
    return run_node


def _is_direct(cg: CompiledGraph, n_in: int) -> bool:
    """True when the plan is one kernel call reading the node's inputs in order."""
    if len(cg.steps) != 1:
        return False
    _, ins, _, _, _ = cg.steps[0]
    slot_of = dict(zip(cg.input_names, cg.input_slots))
    expected = [slot_of.get(f"__in{i}", 0) for i in range(len(ins))]
    return list(ins) == expected
