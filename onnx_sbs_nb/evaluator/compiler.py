"""Compiles an ONNX graph body into a flat list of steps over numbered value slots.

Everything that does not depend on the tensors is decided once here: which kernel runs
each node (by the since-version of the opset the graph imports), the converted
attributes, the slot of every value, the step after which each value is released, and,
on an accelerator, which values are shapes that stay on the host. ``CompiledGraph.execute``
then runs straight-line code generated from the steps (``codegen.py``);
``execute_loop``/``execute_debug`` run the same steps through a loop (reference, hooks).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import onnx
import torch

from .attributes import (
    AttributeRule,
    UnknownAttributeError,
    attribute_rule,
    unknown_attributes,
    without_dropped,
)
from .codegen import generate, script_source
from .compiled import (
    CompiledGraph,
    KernelContext,
    MissingKernelError,
    _constant_tensor,
    _is_managed,
    _resolve_attributes,
    constant_value,
    graph_free_names,
    node_implicit_inputs,
)
from .inline import NOT_CONSTANT, form_for
from .kernels._helpers import as_ints
from .lowbit import CODE_OPS, on_codes
from .protos import attribute_value, sparse_to_dense
from .registry import KernelEntry, _load_kernels, get_kernel, normalize_domain

# Small constants are kept on the host (and twinned on the device when a kernel needs them there).
_HOST_CONST_NUMEL = 64


class Compiler:
    """Compiles graphs, subgraphs and function bodies sharing one configuration."""

    def __init__(
        self,
        opsets: dict[str, int],
        functions: dict[tuple[str, str], onnx.FunctionProto] | None = None,
        custom_kernels: dict[tuple[str, str], Callable[..., Any]] | None = None,
        device: torch.device | str | None = None,
        manage_placement: bool | None = None,
    ) -> None:
        """``manage_placement``: keep shapes on the host (default: on an accelerator)."""
        _load_kernels()
        self.opsets = {normalize_domain(k): v for k, v in opsets.items()}
        self.functions = {(normalize_domain(d), n): f for (d, n), f in (functions or {}).items()}
        self.custom = {(normalize_domain(d), n): f for (d, n), f in (custom_kernels or {}).items()}
        self.device = torch.device(device) if isinstance(device, str) else device
        self.manage_placement = (
            _is_managed(self.device) if manage_placement is None else manage_placement
        )
        self._graph_cache: dict[tuple, tuple[Any, CompiledGraph]] = {}
        self._init_cache: dict[int, tuple[Any, dict[str, torch.Tensor]]] = {}
        self._device_copies: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._node_consts: dict[int, tuple[onnx.NodeProto, torch.Tensor]] = {}
        self._attr_checked: dict[int, tuple[onnx.GraphProto, dict, list[str]]] = {}

    # -- entry points ---------------------------------------------------------------------

    def compile_graph(
        self,
        graph: onnx.GraphProto,
        opsets: dict[str, int] | None = None,
        attr_env: dict[str, onnx.AttributeProto] | None = None,
        outputs: Sequence[str] | None = None,
        top_level: bool = False,
    ) -> CompiledGraph:
        opsets = self.opsets if opsets is None else opsets
        key = (id(graph), id(attr_env), tuple(sorted(opsets.items())), tuple(outputs or ()))
        hit = self._graph_cache.get(key)
        if hit is not None:
            return hit[1]
        inits = self.graph_initializers(graph)
        input_names = [i.name for i in graph.input if i.name not in inits]
        cg = self.compile(
            list(graph.node),
            input_names,
            list(outputs) if outputs else [o.name for o in graph.output],
            inits,
            outer_names=[] if top_level else graph_free_names(graph),
            opsets=opsets,
            attr_env=attr_env,
            inputs_on_device=top_level,
        )
        self._graph_cache[key] = (graph, cg)
        return cg

    def compile(
        self,
        nodes: list[onnx.NodeProto],
        input_names: Sequence[str],
        output_names: Sequence[str],
        initializers: dict[str, torch.Tensor] | None = None,
        outer_names: Sequence[str] = (),
        opsets: dict[str, int] | None = None,
        attr_env: dict[str, onnx.AttributeProto] | None = None,
        inputs_on_device: bool = False,
        jit: bool = False,
    ) -> CompiledGraph:
        """``jit``: a whole model's plan on CPU may move to TorchScript once run often."""
        opsets = self.opsets if opsets is None else opsets
        managed = self.manage_placement
        dev = self.device
        template: list[Any] = [None]  # slot 0 is the missing optional value
        slots: dict[str, int] = {}
        state: dict[str, str] = {}  # h: host, d: device, u: unknown (only when managed)

        def new_slot(value: Any = None) -> int:
            template.append(value)
            return len(template) - 1

        for name in input_names:
            slots[name] = new_slot()
            state[name] = "d" if inputs_on_device else "u"
        for name in outer_names:
            if name not in slots:
                slots[name] = new_slot()
                state[name] = "u"

        device_twin: dict[str, int] = {}
        host_consts: set[str] = set()
        constants: set[str] = set()
        int_twin: dict[str, int] = {}

        def add_constant(name: str, value: torch.Tensor) -> None:
            constants.add(name)
            if managed and (
                not isinstance(value, torch.Tensor) or value.numel() <= _HOST_CONST_NUMEL
            ):
                slots[name] = new_slot(value)
                state[name] = "h"
                host_consts.add(name)
            else:
                slots[name] = new_slot(self.on_device(value))
                state[name] = "d"

        for name, value in (initializers or {}).items():
            if name not in slots:
                add_constant(name, value)

        steps: list[tuple] = []
        inline: list[tuple | None] = []
        step_nodes: list[onnx.NodeProto] = []
        step_inputs: list[list[int]] = []
        missing: list[str] = []
        bad_attributes: list[str] = []

        def device_slot(name: str) -> int:
            if name not in device_twin:
                device_twin[name] = new_slot(self.on_device(template[slots[name]]))
            return device_twin[name]

        def int_slot(name: str) -> int | None:
            """A slot holding a constant shape/axes input as a tuple of ints."""
            if name not in int_twin:
                ints = _constant_ints(template[slots[name]])
                int_twin[name] = 0 if ints is None else new_slot(ints)
            return int_twin[name] or None

        for node in nodes:
            domain = normalize_domain(node.domain)
            key = (domain, node.op_type)
            atts = _resolve_attributes(node, attr_env)
            # the op's facts (shape inputs, placement), whatever implements it
            entry = get_kernel(domain, node.op_type, opsets.get(domain))
            rule = self._attribute_rule(node, key, entry, opsets, bad_attributes)
            if key == ("", "Constant") and key not in self.custom:
                add_constant(node.output[0], self._constant(node, atts))
                continue
            fn, builtin, form = self._make_callable(node, key, entry, atts, opsets, attr_env)
            kernel = fn
            if fn is None:
                missing.append(_missing_kernel(node, domain, opsets))
                for o in node.output:
                    slots[o] = 0  # keeps collecting the other missing kernels
                continue
            explicit, implicit = _defined_inputs(node, slots)
            ins = [slots[n] if n else 0 for n in explicit]
            if implicit:
                ins += [slots[n] for n in implicit]
                fn = _bind_outer(fn, len(explicit), implicit)
            is_function = key not in self.custom and key in self.functions
            if managed:
                opaque = not builtin or bool(implicit) or entry.placement == "any"
                fn, ins, out_state = self._place(
                    entry, fn, explicit, ins, state, device_slot, host_consts, opaque
                )
            for i in entry.int_inputs if builtin else ():
                # converted once here instead of a tolist() per call
                if i < len(explicit) and explicit[i] in constants:
                    ins[i] = int_slot(explicit[i]) or ins[i]
            attrs = {} if is_function else self._kernel_attrs(node, atts, rule)
            # the inline form stands for the bare kernel: not behind a mover or outer values
            inlined = form is not None and fn is kernel
            inline.append((form, _constants_of(ins, template), attrs) if inlined else None)
            outs = [new_slot() for _ in node.output]
            for o, s in zip(node.output, outs):
                if o and managed:
                    slots[o], state[o] = s, out_state
                elif o:
                    slots[o] = s
            steps.append((fn, tuple(ins), tuple(outs), attrs))
            step_nodes.append(node)
            step_inputs.append(ins)

        _raise_compile_errors(missing, bad_attributes)
        graph = _GraphParts(input_names, outer_names, output_names, slots, template)
        placement = state if managed else {}
        return _compiled_graph(graph, steps, step_nodes, step_inputs, inline, dev, placement, jit)

    def graph_initializers(self, graph: onnx.GraphProto) -> dict[str, torch.Tensor]:
        """The initializers of a graph as CPU tensors, converted once per graph."""
        hit = self._init_cache.get(id(graph))
        if hit is not None and hit[0] is graph:
            return hit[1]
        inits = {i.name: _constant_tensor(i) for i in graph.initializer}
        for sp in graph.sparse_initializer:
            inits[sp.values.name] = sparse_to_dense(sp)
        self._init_cache[id(graph)] = (graph, inits)
        return inits

    def on_device(self, value: torch.Tensor) -> torch.Tensor:
        """The device copy of a constant, made once whatever the number of plans using it."""
        if self.device is None or not isinstance(value, torch.Tensor):
            return value  # string tensors (numpy arrays) stay on the host
        hit = self._device_copies.get(id(value))
        if hit is None or hit[0] is not value:
            hit = (value, value.to(self.device))
            self._device_copies[id(value)] = hit
        return hit[1]

    # -- helpers -----------------------------------------------------------------------------

    def _constant(self, node: onnx.NodeProto, atts: list[onnx.AttributeProto]) -> torch.Tensor:
        if any(a.ref_attr_name for a in node.attribute):
            return constant_value(atts)  # depends on the calling function's attributes
        hit = self._node_consts.get(id(node))
        if hit is None or hit[0] is not node:
            hit = (node, constant_value(atts))
            self._node_consts[id(node)] = hit
        return hit[1]

    def _make_callable(self, node, key, entry: KernelEntry | None, atts, opsets, attr_env):
        """(callable, is the built-in kernel ``entry``, inline form) for a node: its custom
        kernel, else its local function, else ``entry``; a None callable: no kernel."""
        if key in self.custom:
            return self.custom[key], False, None
        if key in self.functions:
            return self._function_call(node, self.functions[key], atts, opsets), False, None
        if entry is None:
            return None, False, None
        fn, form = entry.fn, None
        if entry.context:
            fn = functools.partial(fn, ctx=KernelContext(self, node, opsets, attr_env))
        else:
            form = form_for(entry.domain, entry.op_type, entry.since, fn)
        if entry.domain == "" and entry.op_type in CODE_OPS:
            fn = on_codes(fn)  # also runs on sub-byte values (lowbit.py)
        return fn, True, form

    def _attribute_rule(
        self, node, key, entry: KernelEntry | None, opsets, problems: list[str]
    ) -> AttributeRule | None:
        """The attribute rule of the implementation a node gets (None: no kernel); what
        the node, or a node of its subgraphs, carries that the rule rejects goes to
        ``problems``: an invalid attribute is an error when the evaluator is built, not
        a TypeError when the node first runs."""
        version = opsets.get(key[0])
        if key in self.custom:
            rule = attribute_rule("custom", key[0], node.op_type, version, self.custom[key])
        elif key in self.functions:
            rule = attribute_rule("function", key[0], node.op_type, version, None)
        elif entry is not None:
            rule = attribute_rule("builtin", key[0], node.op_type, version, entry.fn)
        else:
            return None
        problem = unknown_attributes(node, key[0], version, rule)
        if problem:
            problems.append(problem)
        if rule.kind == "builtin":
            # subgraphs compile when they first run: their nodes are checked now
            for att in node.attribute:
                for g in [att.g] if att.type == onnx.AttributeProto.GRAPH else att.graphs:
                    self._check_graph_attributes(g, opsets, problems)
        return rule

    def _check_graph_attributes(self, graph: onnx.GraphProto, opsets, problems) -> None:
        hit = self._attr_checked.get(id(graph))
        if hit is not None and hit[0] is graph and hit[1] == opsets:
            problems.extend(hit[2])
            return
        found: list[str] = []
        for node in graph.node:
            key = (normalize_domain(node.domain), node.op_type)
            entry = get_kernel(key[0], node.op_type, opsets.get(key[0]))
            self._attribute_rule(node, key, entry, opsets, found)
        self._attr_checked[id(graph)] = (graph, dict(opsets), found)
        problems.extend(found)

    def _kernel_attrs(self, node, atts, rule: AttributeRule | None) -> dict[str, Any]:
        try:
            # consumed_inputs (opsets < 6) is a memory hint with no effect on results
            attrs = {a.name: attribute_value(a) for a in atts if a.name != "consumed_inputs"}
            return without_dropped(node, attrs, rule) if rule is not None else attrs
        except TypeError as e:
            raise TypeError(f"node {node.name!r} ({node.op_type}): {e}") from e
        except Exception as e:
            raise ValueError(f"node {node.name!r} ({node.op_type}): {e}") from e

    def _function_call(self, node, fproto: onnx.FunctionProto, atts, opsets) -> Callable:
        env: dict[str, onnx.AttributeProto] = {}
        for a in fproto.attribute_proto:
            env[a.name] = a
        for a in atts:
            env[a.name] = a
        f_opsets = dict(opsets)
        f_opsets.update({normalize_domain(o.domain): o.version for o in fproto.opset_import})
        body = self.compile(
            list(fproto.node),
            list(fproto.input),
            list(fproto.output),
            opsets=f_opsets,
            attr_env=env,
        )
        n = len(fproto.input)
        execute = body.execute

        def call_function(*args: Any) -> tuple:
            args = list(args[:n]) + [None] * max(0, n - len(args))
            return tuple(execute(args))

        return call_function

    def _place(self, entry, fn, explicit, ins, state, device_slot, host_consts, opaque):
        """Host/device placement of one step (accelerator only), from the facts the op's
        kernel ``entry`` declares (``registry.op``); a custom kernel or a local function
        replacing a built-in op keeps them.

        ``opaque``: the step runs code this pass cannot see through (subgraphs, function
        bodies, custom kernels, sequences), so its outputs may be anywhere ("u") and
        their consumers check at run time."""
        dev = self.device
        placement = entry.placement if entry is not None else "device"
        host_pos = entry.host_inputs if entry is not None else frozenset()
        in_states = [state.get(n, "u") for n in explicit if n]
        if placement == "host":
            return fn, ins, "h"
        if placement == "follow" and in_states and all(s == "h" for s in in_states):
            return fn, ins, "h"
        to_move: list[int] = []
        for i, name in enumerate(explicit):
            if not name or i in host_pos:
                continue
            st = state.get(name, "u")
            if st == "h" and name in host_consts:
                ins[i] = device_slot(name)
            elif st != "d":
                to_move.append(i)
        if to_move:
            fn = _mover(fn, to_move, dev)
        return fn, ins, "u" if opaque else "d"


def _constants_of(ins: list[int], template: list[Any]) -> list[Any]:
    """The value of each input that is a constant (slots of values computed at run time
    hold None in the template), NOT_CONSTANT for the others."""
    return [template[s] if s and template[s] is not None else NOT_CONSTANT for s in ins]


def _constant_ints(value: Any) -> tuple[int, ...] | None:
    """A small integer constant as the tuple of ints ``as_ints`` would read from it."""
    if (
        not isinstance(value, torch.Tensor)
        or value.device.type != "cpu"  # reading a device value would wait for it
        or value.dtype not in _INT_DTYPES
        or value.dim() > 1
        or value.numel() > _HOST_CONST_NUMEL
    ):
        return None
    return tuple(as_ints(value))


_INT_DTYPES = frozenset(
    (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.uint16, torch.uint32)
)


def _bind_outer(fn: Callable, n_explicit: int, names: list[str]) -> Callable:
    """Hands the values of the enclosing scope a node's subgraphs read to its context."""
    ctx = fn.keywords.get("ctx") if isinstance(fn, functools.partial) else None
    if ctx is None:
        # custom kernels and function calls see only their explicit inputs
        def call_plain(*args: Any, **kw: Any) -> Any:
            return fn(*args[:n_explicit], **kw)

        return call_plain
    base = fn.func

    def call_with_outer(*args: Any, **kw: Any) -> Any:
        # a context per call: reentrant, and nothing of this run stays in the plan
        local = ctx.with_outer(dict(zip(names, args[n_explicit:])))
        return base(*args[:n_explicit], ctx=local, **kw)

    return call_with_outer


def _mover(fn: Callable, positions: list[int], dev: torch.device) -> Callable:
    """Moves the inputs a device kernel reads as data to the device when they are elsewhere."""

    def call_moved(*args: Any, **kw: Any) -> Any:
        args = list(args)
        for i in positions:
            a = args[i] if i < len(args) else None
            if isinstance(a, torch.Tensor) and a.device != dev:
                args[i] = a.to(dev, non_blocking=True)
        return fn(*args, **kw)

    return call_moved


def _raise_compile_errors(missing: list[str], bad_attributes: list[str]) -> None:
    """Every node the compiler refused, in one message."""
    if bad_attributes:
        raise UnknownAttributeError("\n".join(dict.fromkeys(bad_attributes)))
    if missing:
        raise MissingKernelError(
            "no kernel for "
            + "; ".join(dict.fromkeys(missing))
            + ". The supported ops are listed by "
            "onnx_sbs_nb.evaluator.supported_ops(); pass "
            "custom_kernels={(domain, op_type): fn} to add one."
        )


def _free_schedule(
    steps: list[tuple], step_inputs: list[list[int]], protected: set[int]
) -> list[list[int]]:
    """For each step, the slots no later step reads (outputs are never freed)."""
    last_use: dict[int, int] = {}
    for k, ins in enumerate(step_inputs):
        for s in ins:
            last_use[s] = k
    free_at: list[list[int]] = [[] for _ in steps]
    for s, k in last_use.items():
        if s and s not in protected:
            free_at[k].append(s)
    for k, (_, _, outs, _) in enumerate(steps):
        for s in outs:
            if s not in last_use and s not in protected:
                free_at[k].append(s)
    return free_at


def _generate_tiers(cg: CompiledGraph, inline: list[tuple | None], jit: bool) -> None:
    """The generated code of a plan: kernels, inline forms, and TorchScript when allowed."""
    args = (cg.steps, cg.template, cg.input_slots, cg.outer_slots, cg.output_slots, cg._step_error)
    cg.slow = cg.fast = cg.inline = generate(*args)
    cg.script, cg.forms, cg.runs = None, inline, 0
    if any(inline):
        cg.fast = cg.inline = generate(*args, inline=inline, on_fallback=cg._fall_back)
        dev = cg.device
        if jit and dev is not None and dev.type == "cpu" and not cg.outer_names:
            cg.script = script_source(
                cg.steps, cg.template, cg.input_slots, cg.output_slots, inline
            )
            if cg.script is not None:
                cg.fast = cg._warming


def _defined_inputs(node: onnx.NodeProto, slots: dict[str, int]) -> tuple[list[str], list[str]]:
    """The node's explicit inputs (trailing empty names dropped) and the outer-scope
    values its subgraphs read, each checked to be defined by then."""
    explicit = list(node.input)
    while explicit and not explicit[-1]:
        explicit.pop()
    implicit = node_implicit_inputs(node)
    for name in [*explicit, *implicit]:
        if name and name not in slots:
            raise ValueError(
                f"node {node.name!r} ({node.op_type}) reads {name!r}, "
                "which no input, initializer or earlier node defines"
            )
    return explicit, implicit


def _missing_kernel(node: onnx.NodeProto, domain: str, opsets: dict[str, int]) -> str:
    return (
        f"{node.op_type!r} (domain {domain or 'ai.onnx'!r}, opset "
        f"{opsets.get(domain)}) in node {node.name!r}"
    )


@dataclass
class _GraphParts:
    """The names and slots of a graph being compiled, for :func:`_compiled_graph`."""

    input_names: Sequence[str]
    outer_names: Sequence[str]
    output_names: Sequence[str]
    slots: dict[str, int]
    template: list[Any]


def _compiled_graph(
    graph: _GraphParts,
    steps: list[tuple],
    step_nodes: list[onnx.NodeProto],
    step_inputs: list[list[int]],
    inline: list[tuple | None],
    dev: Any,
    placement: dict[str, str],
    jit: bool,
) -> CompiledGraph:
    """The compiled graph from its steps: when each slot is freed, and its generated tiers."""
    slots = graph.slots
    input_names, outer_names, output_names = (
        graph.input_names,
        graph.outer_names,
        graph.output_names,
    )
    template = graph.template
    for name in output_names:
        if name not in slots:
            raise ValueError(f"output {name!r} is not produced by the graph")
    output_slots = [slots[n] for n in output_names]
    free_at = _free_schedule(steps, step_inputs, set(output_slots))
    cg = CompiledGraph()
    cg.input_names = list(input_names)
    cg.outer_names = list(outer_names)
    cg.output_names = list(output_names)
    cg.input_slots = [slots[n] for n in input_names]
    cg.outer_slots = [slots[n] for n in outer_names]
    cg.output_slots = output_slots
    cg.template = template
    cg.steps = [
        (fn, ins, outs, attrs, tuple(free_at[k])) for k, (fn, ins, outs, attrs) in enumerate(steps)
    ]
    cg.nodes = step_nodes
    cg.device = dev
    cg.placement = placement
    _generate_tiers(cg, inline, jit)
    return cg
