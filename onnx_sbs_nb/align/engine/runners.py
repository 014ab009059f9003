"""Node runners: how the engine executes one ONNX node.

A runner implements ``prepare(node, ctx) -> callable(inputs) -> outputs``; the callable
takes the node's inputs (``None`` for an empty optional input) followed by the values of
the outer scope its subgraphs read (``ctx.free_variables(node)``), and returns one value
per node output.  ``value_kind`` tells the engine in which form it wants values:
``"numpy"`` (onnxruntime, reference evaluator) or ``"torch"`` (the torch evaluator).

The onnxruntime runner builds one session per distinct node *signature* (op, domain,
attributes, input element types and ranks), once, and reuses it for every node and
every run with that signature: a Llama has hundreds of nodes but a few dozen signatures.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import onnx
import onnx.helper as oh
import torch

from ...dtypes import np_to_onnx_dtype, torch_to_onnx_dtype

NodeFn = Callable[[Sequence[Any]], list[Any]]


@dataclass
class ModelContext:
    """What a runner may need besides the node: opsets, local functions, devices."""

    opsets: dict[str, int]
    functions: dict[tuple[str, str], onnx.FunctionProto] = field(default_factory=dict)
    ir_version: int = 10
    device: str = "cpu"
    # id(node) -> (node, its free variables): the node is held, so its id is not reused
    # by another message while the entry lives (protobuf wrappers come and go)
    _free: dict[int, tuple[onnx.NodeProto, Sequence[str]]] = field(default_factory=dict)
    _function_bytes: dict[tuple[str, str], bytes] = field(default_factory=dict)

    @classmethod
    def from_model(cls, model: onnx.ModelProto, device: str = "cpu") -> ModelContext:
        return cls(
            opsets={o.domain: o.version for o in model.opset_import},
            functions={(f.domain, f.name): f for f in model.functions},
            ir_version=max(model.ir_version, 8),
            device=device,
        )

    def function_bytes(self, domain: str, name: str) -> bytes | None:
        """The serialized local function ``domain.name``, None when the model has none
        (a session key: nodes calling it are keyed on its body, serialized once)."""
        key = (domain, name)
        if key not in self.functions:
            return None
        data = self._function_bytes.get(key)
        if data is None:
            data = self._function_bytes[key] = self.functions[key].SerializeToString()
        return data

    def free_variables(self, node: onnx.NodeProto) -> list[str]:
        """Outer-scope names read by the node's subgraphs, in a stable order."""
        entry = self._free.get(id(node))
        if entry is None or entry[0] is not node:
            entry = self._free[id(node)] = (node, _free_variables(node))
        return entry[1]


def _free_variables(node: onnx.NodeProto) -> Sequence[str]:
    if not any(_subgraphs(a) for a in node.attribute):
        return ()  # most nodes: one shared empty tuple, not a list per node
    free: list[str] = []
    seen: set[str] = set(node.input)
    for att in node.attribute:
        for sub in _subgraphs(att):
            _visit_free(sub, set(), seen, free)
    return free


def _visit_free(graph: onnx.GraphProto, defined: set[str], seen: set[str], free: list) -> None:
    # a module-level function, not a recursive closure: a closure that calls itself is a
    # reference cycle, garbage that only the cyclic collector frees, one per node
    local = set(defined)
    local.update(i.name for i in graph.input)
    local.update(i.name for i in graph.initializer)
    local.update(i.name for i in graph.sparse_initializer)
    for n in graph.node:
        for i in n.input:
            if i and i not in local and i not in seen:
                seen.add(i)
                free.append(i)
        for att in n.attribute:
            for sub in _subgraphs(att):
                _visit_free(sub, local, seen, free)
        local.update(o for o in n.output if o)


def _subgraphs(att: onnx.AttributeProto) -> list[onnx.GraphProto]:
    if att.type == onnx.AttributeProto.GRAPH:
        return [att.g]
    if att.type == onnx.AttributeProto.GRAPHS:
        return list(att.graphs)
    return []


class NodeRunner(Protocol):
    name: str
    value_kind: str  # "numpy" | "torch"

    def prepare(self, node: onnx.NodeProto, ctx: ModelContext) -> NodeFn: ...


def _elem_and_rank(v: Any) -> tuple[int, int] | None:
    if v is None:
        return None
    if isinstance(v, torch.Tensor):
        return torch_to_onnx_dtype(v.dtype), v.dim()
    if isinstance(v, np.ndarray | np.generic):
        return np_to_onnx_dtype(v.dtype), v.ndim
    if isinstance(v, list):  # a sequence value
        first = _elem_and_rank(v[0]) if v else None
        return (-1, first[0] if first else onnx.TensorProto.FLOAT, first[1] if first else 0)
    raise TypeError(f"cannot feed a {type(v).__name__} to an ONNX node")


# Integer inputs this small are shapes, sizes, axes or pads: a runtime checking a node
# alone needs their length (Resize's ``sizes`` must have one value per input dim), so
# the one-node model declares their exact shape, and the session cache keys on it.
SHAPE_LIKE_ELEMENTS = 64


def _is_shape_like(v: Any) -> bool:
    if isinstance(v, torch.Tensor):
        return v.dim() <= 1 and v.numel() <= SHAPE_LIKE_ELEMENTS and not v.is_floating_point()
    if isinstance(v, np.ndarray | np.generic):
        return v.ndim <= 1 and v.size <= SHAPE_LIKE_ELEMENTS and v.dtype.kind in "biu"
    return False


def input_signature(v: Any, exact: bool = False) -> tuple | None:
    """What a one-node model declares about an input: element type and rank, and the
    exact shape for shape-like inputs (or every input when ``exact``)."""
    if type(v) is np.ndarray:  # what onnxruntime nodes are fed, once per call: inline
        elem = np_to_onnx_dtype(v.dtype)
        if exact or (v.ndim <= 1 and v.size <= SHAPE_LIKE_ELEMENTS and v.dtype.kind in "biu"):
            return (elem, v.ndim, tuple(int(d) for d in v.shape))
        return (elem, v.ndim)
    t = _elem_and_rank(v)
    if t is None or len(t) == 3:
        return t
    if exact or _is_shape_like(v):
        return (*t, tuple(int(d) for d in v.shape))
    return t


def one_node_model(
    node: onnx.NodeProto,
    inputs: Sequence[Any],
    ctx: ModelContext,
    rename: bool,
    exact_shapes: bool = False,
) -> tuple[onnx.ModelProto, list[str]]:
    """A model running ``node`` alone; returns it and the names to feed.

    Inputs are declared with symbolic dimensions (one session serves every shape), but
    shape-like inputs get their exact shape, and with ``exact_shapes`` every input does.
    """
    n_in = len(node.input)
    free = ctx.free_variables(node)
    in_names = [f"i{k}" if rename and name else name for k, name in enumerate(node.input)]
    out_names = [f"o{k}" if rename and name else name for k, name in enumerate(node.output)]
    new = onnx.NodeProto()
    new.CopyFrom(node)
    if rename:
        del new.input[:]
        new.input.extend(in_names)
        del new.output[:]
        new.output.extend(out_names)
    new.ClearField("metadata_props")
    graph_inputs = []
    feed_names = []
    for name, value in zip([*in_names, *free], inputs):
        if not name:
            continue
        feed_names.append(name)
        t = input_signature(value, exact_shapes)
        if t is None:
            continue
        if len(t) == 3 and t[0] == -1:
            graph_inputs.append(
                oh.make_value_info(
                    name,
                    oh.make_sequence_type_proto(oh.make_tensor_type_proto(t[1], [None] * t[2])),
                )
            )
        else:
            dims = list(t[2]) if len(t) == 3 else [f"{name}_d{i}" for i in range(t[1])]
            graph_inputs.append(oh.make_tensor_value_info(name, t[0], dims))
    assert len(inputs) >= n_in
    outputs = [oh.make_value_info(o, onnx.TypeProto()) for o in out_names if o]
    graph = oh.make_graph([new], "node", graph_inputs, outputs)
    model = oh.make_model(
        graph,
        opset_imports=[oh.make_opsetid(d, v) for d, v in ctx.opsets.items()],
        ir_version=ctx.ir_version,
        functions=list(ctx.functions.values()),
    )
    return model, feed_names


class _Fallback:
    """Runs a node with the torch evaluator on numpy values, returning numpy values."""

    def __init__(self, fn: NodeFn, reason: str):
        self.fn = fn
        self.reason = reason

    def __call__(self, inputs: Sequence[Any]) -> list[Any]:
        from ...convert import to_numpy, to_torch

        outs = self.fn([to_torch(v) if v is not None else None for v in inputs])
        return [to_numpy(v) for v in outs]


def node_session_key(node: onnx.NodeProto, ctx: ModelContext) -> tuple[tuple, bool]:
    """(what a one-node session of ``node`` is keyed on besides its inputs, whether the
    session renames its values): bytes, strings and numbers only, so a caller may keep
    it for a second run without keeping the model."""
    # protobuf fields are read once each: every read from Python makes an object
    attributes = node.attribute
    if attributes:
        # Nodes with subgraphs keep their names: the subgraphs refer to outer names.
        rename = not any(_subgraphs(a) for a in attributes)
        attrs = b"".join([a.SerializeToString() for a in attributes])
    else:
        rename, attrs = True, b""
    domain, op_type = node.domain, node.op_type
    static_key: tuple = (
        domain,
        op_type,
        ctx.opsets.get(domain or "", ctx.opsets.get("ai.onnx")),
        attrs,
        len(node.output),
        tuple(map(bool, node.input)),
        # a local function with the same name may differ from model to model
        ctx.function_bytes(domain, op_type),
    )
    if not rename:
        static_key = (*static_key, node.SerializeToString())
    return static_key, rename


# ml_dtypes' sub-byte types: onnxruntime's Python binding takes no such array
_SUBBYTE_NAMES = frozenset({"int4", "uint4", "int2", "uint2", "float4_e2m1fn"})


def _unsupported_dtype(inputs: Sequence[Any]) -> str | None:
    for v in inputs:
        name = getattr(getattr(v, "dtype", None), "name", "")
        if name == "bfloat16" or name.startswith("float8") or name in _SUBBYTE_NAMES:
            return f"no {name} input through numpy"
    return None


def _is_missing_kernel(e: Exception) -> bool:
    msg = str(e)
    return "NOT_IMPLEMENTED" in msg or "Could not find an implementation" in msg


LARGE_NODE_ELEMENTS = 1 << 18


def _is_large(inputs: Sequence[Any]) -> bool:
    """Whether a node is worth a multi-threaded session (any input of 256K+ elements)."""
    for v in inputs:
        if isinstance(v, np.ndarray) and v.size >= LARGE_NODE_ELEMENTS:
            return True
    return False


class _CachedRunner:
    """Shared logic: a model per node signature, built at first use and reused."""

    name = "base"
    value_kind = "numpy"

    # Sessions are shared by every runner of the same configuration in the process:
    # a second run, a widget action or a CLI rerun builds none again.
    _SHARED: dict[tuple, OrderedDict] = {}
    MAX_CACHED = 4096

    def __init__(self, fallback: bool = True) -> None:
        self._cache: OrderedDict = self._SHARED.setdefault(self._config(fallback), OrderedDict())
        self.sessions_built = 0
        self.fallback = fallback

    def _config(self, fallback: bool) -> tuple:
        return (type(self).__name__, fallback)

    def _build(self, model: onnx.ModelProto, large: bool) -> Any:  # pragma: no cover
        raise NotImplementedError

    def _run(self, sess: Any, feeds: dict[str, Any]) -> list[Any]:  # pragma: no cover
        raise NotImplementedError

    def prepare(self, node: onnx.NodeProto, ctx: ModelContext, key: tuple | None = None) -> NodeFn:
        """``key``: the node's :func:`node_session_key`, when the caller keeps it."""
        static_key, rename = key if key is not None else node_session_key(node, ctx)
        return _PreparedNode(self, node, ctx, static_key, rename)

    def _entry(
        self, node, ctx, inputs, rename: bool, large: bool, exact: bool
    ) -> tuple[Any, list[str], str | None]:
        """(session, feed names, note): a note says how the node had to be run."""
        reason = _unsupported_dtype(inputs) if self.fallback else None
        if reason is None:
            model, names = one_node_model(node, inputs, ctx, rename, exact)
            try:
                sess = self._build(model, large)
                self.sessions_built += 1
                note = _EXACT_NOTE.format(name=self.name) if exact else None
                return sess, names, note
            except Exception as e:
                if self.fallback and _is_missing_kernel(e):
                    reason = _first_line(e)
                elif exact:
                    raise
                else:
                    # Checked alone with symbolic shapes, a node can be rejected where
                    # the whole model is fine (a shape the runtime cannot infer):
                    # the exact shapes decide whether the node itself is wrong.
                    model, names = one_node_model(node, inputs, ctx, rename, True)
                    try:
                        sess = self._build(model, large)
                    except Exception:
                        raise e from None
                    self.sessions_built += 1
                    return sess, names, _EXACT_NOTE.format(name=self.name) + f" ({_first_line(e)})"
        # The runtime has no kernel for these types (bfloat16 on CPU, say): the torch
        # evaluator runs this node instead, and the records say so.
        fn = TorchRunner("cpu").prepare(node, ctx)
        reason = f"run by the torch evaluator ({self.name}: {reason})"
        return _Fallback(fn, reason), [], reason


_EXACT_NOTE = "{name} checks this node alone only with the exact input shapes"


def _first_line(e: BaseException) -> str:
    text = str(e).strip().split("\n")[0]
    return text if len(text) <= 240 else text[:237] + "..."


class _PreparedNode:
    """One node ready to run: finds (or builds) the session of its input signature.

    ``fallback_reason`` says how the node had to be run, once a call needed that.  An
    object, not a closure: a closure that sets an attribute on itself is a reference
    cycle, and a large graph made one per node for the cyclic collector to free.
    """

    __slots__ = (
        "runner",
        "node",
        "ctx",
        "static_key",
        "exact_key",
        "rename",
        "fallback_reason",
        "elsewhere",
    )

    def __init__(
        self, runner: _CachedRunner, node: onnx.NodeProto, ctx: Any, static_key: tuple, rename: bool
    ) -> None:
        self.runner = runner
        self.node = node
        self.ctx = ctx
        self.static_key = static_key
        self.exact_key = ("exact shapes", static_key)
        self.rename = rename
        self.fallback_reason: str | None = None
        # the last call ran the node with another runtime (the torch evaluator)
        self.elsewhere = False

    def __call__(self, inputs: Sequence[Any]) -> list[Any]:
        runner, static_key = self.runner, self.static_key
        cache = runner._cache
        large = _is_large(inputs)
        exact = self.exact_key in cache
        key = (static_key, large, exact, tuple([input_signature(v, exact) for v in inputs]))
        entry = cache.get(key)
        if entry is None:
            entry = runner._entry(self.node, self.ctx, inputs, self.rename, large, exact)
            if entry[2] and not exact:
                # this node only runs with exact shapes: every later call says so
                cache[self.exact_key] = True
                key = (static_key, large, True, tuple(input_signature(v, True) for v in inputs))
            cache[key] = entry
            if len(cache) > runner.MAX_CACHED:
                cache.popitem(last=False)
        sess, names, note = entry
        if note:
            self.fallback_reason = note
        if isinstance(sess, _Fallback):
            self.elsewhere = True
            return sess(inputs)
        self.elsewhere = False
        if len(names) == len(inputs):  # no optional input left empty
            return runner._run(sess, dict(zip(names, inputs)))
        return runner._run(sess, dict(zip(names, [v for v in inputs if v is not None])))


class OnnxruntimeRunner(_CachedRunner):
    name = "onnxruntime"
    value_kind = "numpy"

    def __init__(
        self,
        providers: Sequence[str] | None = None,
        threads: int | None = None,
        fallback: bool = True,
    ):
        import onnxruntime as ort

        self._ort = ort
        self.providers = list(providers or ["CPUExecutionProvider"])
        self.threads = threads
        super().__init__(fallback)
        self._options = self._session_options(large=True, arena=True)
        # A session with its own thread pool costs ~15x more to build than a
        # single-threaded one; small nodes gain nothing from threads.
        self._single = self._session_options(large=False, arena=True)
        self._stretch_options: dict[bool, Any] = {}

    def _session_options(self, large: bool, arena: bool) -> Any:
        so = self._ort.SessionOptions()
        # One node per session: graph optimisations have nothing to fuse and cost time
        # (and a stretch of nodes must run each node's own kernel: stretches.py).
        so.graph_optimization_level = self._ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        # fatal only: a node that fails raises, and its message is that node's record; an
        # error line printed by onnxruntime as well would land in the middle of the
        # progress bar
        so.log_severity_level = 4
        if large:
            if self.threads:
                so.intra_op_num_threads = self.threads
            # Spinning worker threads would starve torch's threads between two nodes.
            so.add_session_config_entry("session.intra_op.allow_spinning", "0")
            so.add_session_config_entry("session.inter_op.allow_spinning", "0")
        else:
            so.intra_op_num_threads = 1
            so.inter_op_num_threads = 1
        if not arena:
            so.enable_cpu_mem_arena = False
            so.enable_mem_pattern = False
        return so

    def build_stretch(self, model: onnx.ModelProto, large: bool) -> Any:
        """A session running many nodes (``stretches.py``), with the threading one of them
        has alone.  Without onnxruntime's memory arena: an arena keeps the peak of every
        value the session made for the session's life, and a model has many stretches."""
        so = self._stretch_options.get(large)
        if so is None:
            so = self._stretch_options[large] = self._session_options(large, arena=False)
        return self._ort.InferenceSession(model.SerializeToString(), so, providers=self.providers)

    def _config(self, fallback: bool) -> tuple:
        return (type(self).__name__, fallback, tuple(self.providers), self.threads)

    def _build(self, model: onnx.ModelProto, large: bool = True) -> Any:
        return self._ort.InferenceSession(
            model.SerializeToString(),
            self._options if large else self._single,
            providers=self.providers,
        )

    def _run(self, sess: Any, feeds: dict[str, Any]) -> list[Any]:
        if not getattr(sess, "_sbs_via_ort_values", False):
            try:
                return _run_session(sess, feeds)
            except RuntimeError as e:
                # numpy has no bfloat16 or float8: onnxruntime computed the result but
                # cannot hand it over as an array; it comes through DLPack instead
                if "No corresponding Numpy type" not in str(e):
                    raise
                sess._sbs_via_ort_values = True
        from ...convert import to_numpy

        ort_feeds = {k: self._ort.OrtValue.ortvalue_from_numpy(v) for k, v in feeds.items()}
        outs = sess.run_with_ort_values(None, ort_feeds)
        return [_ort_value_to_numpy(v, to_numpy) for v in outs]


def _run_session(sess: Any, feeds: dict[str, Any]) -> list[Any]:
    """``sess.run(None, feeds)`` without the Python wrapper's per-call checks (feed names
    against the model, output names rebuilt) on CPU: the one-node model was built with
    exactly these feed names, and the checks cost a third of a small node's call.  Other
    providers keep the wrapper, which falls back to CPU when the provider fails."""
    fast = getattr(sess, "_sbs_fast", None)
    if fast is None:
        core = getattr(sess, "_sess", None)
        cpu_only = sess.get_providers() == ["CPUExecutionProvider"]
        fast = (core, [o.name for o in sess.get_outputs()]) if core and cpu_only else False
        sess._sbs_fast = fast
    if not fast:
        return sess.run(None, feeds)
    core, names = fast
    return core.run(names, feeds, None)


def _ort_value_to_numpy(v: Any, to_numpy: Callable[[Any], Any]) -> Any:
    try:
        return v.numpy()
    except RuntimeError:  # no numpy type: torch reads the tensor through DLPack
        return to_numpy(torch.from_dlpack(v))


class ReferenceRunner(_CachedRunner):
    name = "reference"
    value_kind = "numpy"

    def _build(self, model: onnx.ModelProto, large: bool) -> Any:
        from onnx.reference import ReferenceEvaluator

        return ReferenceEvaluator(model)

    def _run(self, sess: Any, feeds: dict[str, Any]) -> list[Any]:
        return [np.asarray(v) if not isinstance(v, list) else v for v in sess.run(None, feeds)]


class TorchRunner:
    """Runs each node with the torch evaluator (on CPU or CUDA)."""

    name = "torch"
    value_kind = "torch"

    # Compiled nodes are shared by the torch runners of a device in the process, as
    # onnxruntime's sessions are (_CachedRunner): a second run compiles none again (each
    # compilation generates and compiles Python source: a warm run on a GPU spent most of
    # its time there).  A compiled node depends on its session key and the device alone;
    # a runner with custom kernels compiles its own.
    _SHARED: dict[str, OrderedDict] = {}
    MAX_CACHED = 4096

    def __init__(self, device: str | torch.device = "cpu", custom_kernels: dict | None = None):
        self.device = torch.device(device)
        self.custom_kernels = custom_kernels
        self.nodes_compiled = 0
        self._compiled = self._SHARED.setdefault(str(self.device), OrderedDict())

    def prepare(self, node: onnx.NodeProto, ctx: ModelContext, key: tuple | None = None) -> NodeFn:
        """``key``: the node's :func:`node_session_key`, when the caller keeps it."""
        if self.custom_kernels is not None:
            return self._compile(node, ctx)
        cache = self._compiled
        key = (key or node_session_key(node, ctx))[0]
        fn = cache.get(key)
        if fn is None:
            fn = cache[key] = self._compile(node, ctx)
            if len(cache) > self.MAX_CACHED:
                cache.popitem(last=False)
        return fn

    def _compile(self, node: onnx.NodeProto, ctx: ModelContext) -> NodeFn:
        from ...evaluator.evaluator import compile_node

        self.nodes_compiled += 1

        fn = compile_node(
            node, ctx.opsets, ctx.functions, device=self.device, custom_kernels=self.custom_kernels
        )
        n_in = len(node.input)
        ours = ctx.free_variables(node)
        theirs = list(getattr(fn, "outer_names", ()))
        if not ours or theirs == ours:
            return fn
        # the evaluator wants the outer values in its own order
        order = [ours.index(name) for name in theirs]

        def run(inputs: Sequence[Any]) -> list[Any]:
            inputs = list(inputs)
            outer = inputs[n_in:]
            return fn(inputs[:n_in] + [outer[i] for i in order])

        return run


class CallableRunner:
    """Wraps a user callable ``f(node, inputs) -> outputs`` (numpy in, numpy out)."""

    value_kind = "numpy"

    def __init__(self, fn: Callable[[onnx.NodeProto, list[Any]], list[Any]], kind: str = "numpy"):
        self.fn = fn
        self.name = getattr(fn, "__name__", "custom")
        self.value_kind = kind

    def prepare(self, node: onnx.NodeProto, ctx: ModelContext) -> NodeFn:
        return lambda inputs: list(self.fn(node, list(inputs)))


def make_runner(runner: Any, device: str = "cpu") -> Any:
    """A runner from a name, a runner object, a runner class or a callable."""
    if isinstance(runner, str):
        if runner == "onnxruntime":
            providers = ["CPUExecutionProvider"]
            if device.startswith("cuda"):
                import onnxruntime as ort

                if "CUDAExecutionProvider" not in ort.get_available_providers():
                    # no GPU build of onnxruntime: the torch evaluator runs the ONNX side
                    return TorchRunner(device)
                providers = ["CUDAExecutionProvider", "CPUExecutionProvider"]
            return OnnxruntimeRunner(providers)
        if runner == "reference":
            return ReferenceRunner()
        if runner == "torch":
            return TorchRunner(device)
        raise ValueError(
            f"unknown runner {runner!r}: use 'onnxruntime', 'reference', 'torch', "
            "a runner object with prepare(node, ctx), or a callable f(node, inputs)"
        )
    if isinstance(runner, type):
        runner = runner()
    if hasattr(runner, "prepare") and hasattr(runner, "value_kind"):
        return runner
    if callable(runner):
        return CallableRunner(runner)
    raise TypeError(f"cannot use {type(runner).__name__} as a node runner")
