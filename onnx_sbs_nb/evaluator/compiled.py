"""What compiling a graph produces and reads: the compiled graph (its steps, slots and
releases, run by generated code), the context kernels receive, the names a subgraph reads
from outside, node attributes resolved against a function's, and the compile errors."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import onnx
import torch

from .codegen import script_source
from .fixed import plan_fixed
from .fused import plan_fused
from .inline import HELPER_SOURCE
from .inplace import plan_inplace, probe, signature
from .layout import plan_layout
from .protos import sparse_to_dense, string_array, tensor_from_proto


def _is_managed(device: torch.device | None) -> bool:
    return device is not None and device.type != "cpu"


class KernelContext:
    """What a kernel registered with ``context=True`` receives as ``ctx``.

    ``device``: the evaluator's device (None: follow the inputs); ``opsets``: the opsets of
    the graph the node belongs to; ``outer``: the values of the enclosing scopes the node's
    subgraphs read; ``run_graph(graph, inputs)`` runs a subgraph attribute and returns
    its outputs as a list; ``graph_runner(graph)`` compiles it once for repeated calls.
    """

    __slots__ = ("device", "opsets", "outer", "node", "_compiler", "_attr_env")

    def __init__(self, compiler: Any, node: onnx.NodeProto, opsets, attr_env) -> None:
        self.device = compiler.device
        self.opsets = opsets
        self.outer: dict[str, Any] = {}
        self.node = node
        self._compiler = compiler
        self._attr_env = attr_env

    def with_outer(self, outer: dict[str, Any]) -> KernelContext:
        ctx = KernelContext.__new__(KernelContext)
        ctx.device, ctx.opsets, ctx.node = self.device, self.opsets, self.node
        ctx._compiler, ctx._attr_env = self._compiler, self._attr_env
        ctx.outer = outer
        return ctx

    def graph_runner(
        self, graph: onnx.GraphProto, outer_values: dict[str, Any] | None = None
    ) -> Callable[[Sequence[Any]], list[Any]]:
        cg = self._compiler.compile_graph(graph, self.opsets, self._attr_env)
        outer = self.outer if outer_values is None else outer_values
        outer_list = [outer.get(n) for n in cg.outer_names]
        return functools.partial(cg.execute, outer=outer_list)

    def run_graph(
        self,
        graph: onnx.GraphProto,
        inputs: Sequence[Any],
        outer_values: dict[str, Any] | None = None,
    ) -> list[Any]:
        return self.graph_runner(graph, outer_values)(inputs)

    def default_device(self, *tensors: Any) -> torch.device:
        """The device to create new tensors on: the evaluator's, else the inputs'."""
        if self.device is not None:
            return self.device
        for t in tensors:
            if isinstance(t, torch.Tensor):
                return t.device
        return torch.device("cpu")


def graph_free_names(graph: onnx.GraphProto) -> list[str]:
    """Names a graph reads from enclosing scopes (through nested subgraphs too)."""
    defined = {i.name for i in graph.input}
    defined.update(i.name for i in graph.initializer)
    defined.update(i.values.name for i in graph.sparse_initializer)
    free: dict[str, None] = {}
    for node in graph.node:
        for name in [*node.input, *node_implicit_inputs(node)]:
            if name and name not in defined:
                free[name] = None
        defined.update(node.output)
    for o in graph.output:
        if o.name not in defined:
            free[o.name] = None
    return list(free)


def node_implicit_inputs(node: onnx.NodeProto) -> list[str]:
    names: dict[str, None] = {}
    for att in node.attribute:
        if att.type == onnx.AttributeProto.GRAPH:
            names.update(dict.fromkeys(graph_free_names(att.g)))
        elif att.type == onnx.AttributeProto.GRAPHS:
            for g in att.graphs:
                names.update(dict.fromkeys(graph_free_names(g)))
    return list(names)


class CompiledGraph:
    """Steps over slots; ``execute(inputs, outer)`` returns the outputs as a list."""

    __slots__ = (
        "input_names",
        "outer_names",
        "output_names",
        "input_slots",
        "outer_slots",
        "output_slots",
        "template",
        "steps",
        "nodes",
        "placement",
        "device",
        "fast",
        "slow",
        "inline",
        "script",
        "forms",
        "runs",
    )

    # ``fast`` is what ``execute`` runs: ``slow`` (kernel calls), ``inline`` (inline forms,
    # falling back to ``slow``), or, for a CPU plan run often, the TorchScript form of
    # ``inline`` (falling back to ``inline``).

    def execute(self, inputs: Sequence[Any], outer: Sequence[Any] = ()) -> list[Any]:
        return self.fast(inputs, outer)

    def _fall_back(self, inputs: Sequence[Any], outer: Sequence[Any]) -> list[Any]:
        """An inline form met a case only its kernel handles: this run and the next ones
        go through the kernels (generated code without inline forms)."""
        self.fast = self.inline = self.slow
        self.script = None
        return self.slow(inputs, outer)

    def _warming(self, inputs: Sequence[Any], outer: Sequence[Any] = ()) -> list[Any]:
        """Runs the inline code; after ``JIT_AFTER`` runs, compiles the TorchScript form.

        TorchScript costs tens of milliseconds (compilation, then two profiling runs):
        worth it only for a plan that runs many times."""
        self.runs += 1
        if self.runs >= JIT_AFTER and self.fast == self._warming:
            self.fast = _scripted(self, inputs) or self.inline
        return self.inline(inputs, outer)

    def execute_loop(self, inputs: Sequence[Any], outer: Sequence[Any] = ()) -> list[Any]:
        """The same steps as ``execute`` through an interpreter loop (reference path)."""
        return self.execute_debug(inputs, outer)

    def _step_error(self, k: int, e: Exception) -> Exception:
        return self._node_error(self.steps[k], e)

    def _node_error(self, step: tuple, e: Exception) -> Exception:
        if isinstance(e, NodeError):
            return e
        node = self.nodes[next(k for k, s in enumerate(self.steps) if s is step)]
        return NodeError(
            f"node {node.name!r} ({node.domain or 'ai.onnx'}::{node.op_type}) "
            f"failed: {type(e).__name__}: {e}"
        )

    def execute_debug(
        self,
        inputs: Sequence[Any],
        outer: Sequence[Any] = (),
        hook: Callable[[int, onnx.NodeProto, list[Any]], None] | None = None,
    ) -> list[Any]:
        """Like execute, calling ``hook(step_index, node, live_values)`` after each step."""
        vals = self.template.copy()
        for s, v in zip(self.input_slots, inputs):
            vals[s] = v
        for s, v in zip(self.outer_slots, outer):
            vals[s] = v
        for k, (fn, ins, outs, attrs, free) in enumerate(self.steps):
            try:
                res = fn(*[vals[i] for i in ins], **attrs)
            except Exception as e:
                raise self._node_error(self.steps[k], e) from e
            if type(res) is tuple:
                for o, r in zip(outs, res):
                    vals[o] = r
            else:
                vals[outs[0]] = res
            for f in free:
                vals[f] = None
            if hook is not None:
                hook(k, self.nodes[k], [v for v in vals if v is not None])
        return [vals[i] for i in self.output_slots]


class NodeError(RuntimeError):
    """A kernel failed: the message names the node, its op and the original error."""


class MissingKernelError(NotImplementedError):
    """No kernel implements an op at the opset version a model imports."""


def _resolve_attributes(node: onnx.NodeProto, attr_env) -> list[onnx.AttributeProto]:
    atts = []
    for att in node.attribute:
        if att.ref_attr_name:
            if attr_env is None or att.ref_attr_name not in attr_env:
                continue  # the caller did not set it: the op's default applies
            ref = onnx.AttributeProto()
            ref.CopyFrom(attr_env[att.ref_attr_name])
            ref.name = att.name
            atts.append(ref)
        else:
            atts.append(att)
    return atts


def _constant_tensor(proto: onnx.TensorProto) -> Any:
    """A CPU tensor, or for a STRING tensor a numpy object array of str."""
    if proto.data_type == onnx.TensorProto.STRING:
        return string_array(proto)
    return tensor_from_proto(proto)


def constant_value(attrs: list[onnx.AttributeProto]) -> torch.Tensor:
    """The tensor a Constant node holds, whichever attribute carries it."""
    for att in attrs:
        n = att.name
        if n == "value":
            return _constant_tensor(att.t)
        if n == "sparse_value":
            return sparse_to_dense(att.sparse_tensor)
        if n == "value_float":
            return torch.tensor(att.f, dtype=torch.float32)
        if n == "value_floats":
            return torch.tensor(list(att.floats), dtype=torch.float32)
        if n == "value_int":
            return torch.tensor(att.i, dtype=torch.int64)
        if n == "value_ints":
            return torch.tensor(list(att.ints), dtype=torch.int64)
        if n == "value_string":  # string tensors are numpy object arrays of str
            return np.array(att.s.decode("utf-8"), dtype=object)
        if n == "value_strings":
            return np.array([v.decode("utf-8") for v in att.strings], dtype=object)
    raise ValueError("Constant node without a value attribute")


# Runs of a plan in the inline Python code before it is compiled with TorchScript.
JIT_AFTER = 20


def _script(source: str) -> Callable[..., list[Any]] | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return torch.jit.CompilationUnit(HELPER_SOURCE + "\n" + source).run
    except Exception:
        return None


def _scripted(
    cg: CompiledGraph, inputs: Sequence[Any] | None = None
) -> Callable[..., list[Any]] | None:
    """``cg``'s TorchScript form behind a guard, or None when TorchScript refuses it.

    Given the ``inputs`` of a run, the steps that may write into a dying input do so
    (inplace.py) for feeds of those inputs' shapes, strides and dtypes; other feeds run
    the plain form, compiled at the first such run."""
    source, constants = cg.script
    sig = signature(inputs) if inputs is not None else None
    meta = probe(cg, cg.forms, inputs) if sig is not None else None
    fn, fast_constants, fast_source = None, constants, None
    if meta is not None:
        # in-place steps first: their forms have no run-time checks either
        # contiguous results first: the other plans read the layouts they give
        layout, meta = plan_layout(cg, cg.forms, meta, inputs)
        forms = {**plan_fixed(cg, cg.forms, meta), **layout}
        forms.update(plan_inplace(cg, cg.forms, meta, inputs))
        fused, extra = plan_fused(cg, cg.forms, meta)
        forms.update(fused)
        res = script_source(
            cg.steps, cg.template, cg.input_slots, cg.output_slots, cg.forms, forms, extra=extra
        )
        if res is not None:
            fn, fast_constants = _script(res[0]), res[1]
            fast_source = res[0]
    plain: list[Any] = [None]
    if fn is None:
        sig, fast_constants, fast_source = None, constants, None
        plain[0] = fn = _script(source)
        if fn is None:
            cg.script = None
            return None
    n = len(cg.input_slots)

    def run_scripted(inputs: Sequence[Any], outer: Sequence[Any] = ()) -> list[Any]:
        # plain CPU tensors only, and never with TorchScript's CPU fuser on (fused
        # kernels would round differently from the kernels)
        if (
            len(inputs) == n
            and all(type(v) is torch.Tensor and v.device.type == "cpu" for v in inputs)
            and not torch._C._jit_can_fuse_on_cpu()
        ):
            try:
                if sig is None or signature(inputs) == sig:
                    return fn(*inputs, *fast_constants)
                if plain[0] is None:
                    plain[0] = _script(source)
                if plain[0] is not None:
                    return plain[0](*inputs, *constants)
            except Exception:
                pass
        # anything unusual: the inline code, for this run and the next ones
        cg.fast = cg.inline
        return cg.inline(inputs, outer)

    # what runs for the probe's signature (None: the plain form for every signature)
    run_scripted.signature_source = fast_source  # type: ignore[attr-defined]
    return run_scripted
