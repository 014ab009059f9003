"""Which onnxruntime optimizer makes the optimized session disagree with torch.

Users who find that the deployed (optimized) session gives other numbers than the
unoptimized one disable optimizers one at a time by hand.  :func:`bisect_optimizers`
does it for them: it reads the names of the optimizers the session applied from
onnxruntime, then bisects over them with ``InferenceSession(disabled_optimizers=...)``
until it holds the smallest set whose disabling makes the whole model agree with the
program run eagerly (``ep.module()(*args)``), and names the first diverging node of the
optimized graph (a fused kernel, usually).  Each step costs one whole-model session; the
``progress`` callback hears about every one of them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from ..compare.diff import compare
from ..convert import to_numpy
from ..errors import SbsInputError
from ..records import Record
from .contract import AnswerContract
from .pairing.graph_map import NODE_UNCHANGED
from .pairing.onnxruntime_session import LEVELS, check_providers, ort_session
from .pairing.optimized import OptimizedModel, optimize_model
from .source.loading import load_exported_program, load_inputs, load_onnx_model
from .source.program_inputs import bind_inputs
from .source.quant_ops import register_quantized_ops

# Values of OptimizerBlame.verdict
FOUND = "found"  # disabling .optimizers makes the optimized session agree
AGREES = "agrees"  # the optimized session already agrees: nothing to bisect
EXPORT_DISAGREES = "export_disagrees"  # the unoptimized session disagrees already
NOT_AN_OPTIMIZER = "not_an_optimizer"  # disabling every optimizer applied does not help
UNKNOWN_OPTIMIZERS = "unknown_optimizers"  # onnxruntime's log could not be read

_ROUNDS = 3  # times a newly applied optimizer may join the candidates


@dataclass
class BisectStep:
    """One whole-model session of a bisection, as the progress callback sees it."""

    sessions: int  # sessions built so far
    estimate: int  # sessions the bisection is expected to cost in all
    disabled: list[str]  # optimizers disabled in this session
    agrees: bool | None  # whether the whole model agreed with torch
    err_abs: float | None  # largest output error of this session
    message: str


@dataclass
class OptimizerBlame(AnswerContract):
    """The answer of :func:`bisect_optimizers` (a run kind that answers at once)."""

    KIND = "bisect"
    LABEL = "the onnxruntime optimizer bisection"

    verdict: str  # FOUND, AGREES, EXPORT_DISAGREES, NOT_AN_OPTIMIZER, UNKNOWN_OPTIMIZERS
    message: str  # one sentence saying what was found
    level: str
    providers: list[str]
    optimizers: list[str] = field(default_factory=list)  # the smallest set to disable
    node: str | None = None  # the first diverging optimized node (its group's main node)
    node_op_type: str | None = None
    node_kind: str | None = None  # fused, rewritten or inserted
    node_replaced: list[str] = field(default_factory=list)  # original nodes it stands for
    value: str | None = None  # the first ONNX value that disagrees with torch
    ep_name: str | None = None  # the fx node it is compared with
    err_abs: float | None = None  # error at that value
    applied: list[str] = field(default_factory=list)  # optimizers the session applied
    sessions: int = 0  # whole-model sessions it cost
    unoptimized_err_abs: float | None = None
    optimized_err_abs: float | None = None
    fixed_err_abs: float | None = None  # with .optimizers disabled
    # the records of the run that located the node (``locate=True``), none otherwise
    records: list[Record] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("records")
        for k, v in d.items():
            if isinstance(v, float) and not math.isfinite(v):
                d[k] = str(v)
        return d


class _Judge:
    """Builds whole-model sessions and says whether their outputs agree with torch."""

    def __init__(self, model, feeds, expected, providers, level, atol, rtol, config, progress):
        self.model = model
        self.feeds = feeds
        self.expected = expected
        self.providers = providers
        self.level = level
        self.atol, self.rtol = atol, rtol
        self.config = config
        self.progress = progress
        self.sessions = 0
        self.estimate = 3
        self.cache: dict[tuple[str, frozenset[str]], tuple[bool, float, list[str], bool]] = {}

    def __call__(self, level: str, disabled: Sequence[str] = ()) -> tuple[bool, float, list[str]]:
        agrees, err, applied, _ = self.measure(level, disabled)
        return agrees, err, applied

    def measure(self, level: str, disabled: Sequence[str] = ()):
        key = (level, frozenset(disabled))
        if key in self.cache:
            return self.cache[key]
        info = ort_session(
            self.model,
            level,
            self.providers,
            disabled_optimizers=list(disabled),
            session_config=self.config,
        )
        outputs = info.session.run(None, self.feeds)
        self.sessions += 1
        agrees, err = True, 0.0
        for want, got in zip(self.expected, outputs):
            d = compare(want, got, self.atol, self.rtol)
            agrees = agrees and bool(d.passed)
            if d.err_abs is not None and (math.isnan(d.err_abs) or d.err_abs > err):
                err = d.err_abs
            if d.shape_mismatch:
                err = math.inf
        result = (agrees, err, info.applied, info.log_read)
        self.cache[key] = result
        self.estimate = max(self.estimate, self.sessions)
        if self.progress is not None:
            what = "no optimization" if level == "disabled" else f"level {level!r}"
            if disabled:
                what += f" without {', '.join(disabled)}"
            self.progress(
                BisectStep(
                    self.sessions,
                    self.estimate,
                    list(disabled),
                    agrees,
                    err,
                    f"{what}: {'agrees' if agrees else 'disagrees'} (err_abs={err:.3g})",
                )
            )
        return result


def _feeds_and_expected(ep, model, args, kwargs) -> tuple[dict[str, Any], list[Any]]:
    bound = bind_inputs(ep, args, kwargs)
    inits = {i.name for i in model.graph.initializer}
    graph_inputs = [i.name for i in model.graph.input if i.name not in inits]
    user = [n for n in bound.user_inputs if isinstance(bound.values[n], torch.Tensor)]
    feeds: dict[str, Any] = {}
    for k, name in enumerate(graph_inputs):
        if name in bound.values:
            feeds[name] = to_numpy(bound.values[name])
        elif k < len(user):
            feeds[name] = to_numpy(bound.values[user[k]])
        else:
            raise SbsInputError(
                f"ONNX input {name!r} matches no input of the program (program inputs: "
                f"{bound.user_inputs}): the model and the program take different inputs"
            )
    with torch.no_grad():
        out = ep.module()(*args, **kwargs)
    expected = [
        to_numpy(t) for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)
    ]
    if len(expected) != len(model.graph.output):
        raise SbsInputError(
            f"the program returns {len(expected)} tensor(s) but the ONNX model has "
            f"{len(model.graph.output)} output(s): it was not exported from this program"
        )
    return feeds, expected


def minimal_disabling_set(
    candidates: Sequence[str], agrees: Callable[[list[str]], bool]
) -> list[str]:
    """The smallest set of ``candidates`` whose disabling makes ``agrees`` true.

    ``agrees(candidates)`` must hold.  Each round binary-searches the shortest prefix
    that, added to what was found so far, agrees; its last name is needed and joins the
    answer.  About ``len(answer) * log2(len(candidates))`` calls.
    """
    found: list[str] = []
    rest = list(candidates)
    while not agrees(found):
        lo, hi = 1, len(rest)
        while lo < hi:
            mid = (lo + hi) // 2
            if agrees(found + rest[:mid]):
                hi = mid
            else:
                lo = mid + 1
        found.append(rest[hi - 1])
        rest = rest[: hi - 1]
    return found


def bisect_optimizers(
    ep: Any,
    onx: Any,
    args: Any = None,
    kwargs: dict[str, Any] | None = None,
    *,
    level: str = "all",
    providers: Sequence[Any] | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    progress: Callable[[BisectStep], None] | None = None,
    locate: bool = True,
    session_config: dict[str, str] | None = None,
) -> OptimizerBlame:
    """Finds the onnxruntime optimizers that make the optimized session disagree.

    Compares whole-model sessions with the program run eagerly on ``args``/``kwargs``:
    first without optimization (when that disagrees, the export itself is wrong and no
    optimizer is to blame), then at ``level``; then bisects over the names of the
    optimizers that session applied.  ``locate``: also run the optimized graph node by
    node (the usual side-by-side run) to name its first diverging node.  ``progress`` is
    called after every session with a :class:`BisectStep`.
    """
    register_quantized_ops()
    if level not in LEVELS:
        raise SbsInputError(f"level={level!r} is not a level: use one of {list(LEVELS)}")
    program = load_exported_program(ep)
    model = load_onnx_model(onx)
    args, kwargs = load_inputs(args, kwargs)
    providers = check_providers(providers)
    names = [p if isinstance(p, str) else p[0] for p in providers]
    feeds, expected = _feeds_and_expected(program, model, args, kwargs)
    judge = _Judge(model, feeds, expected, providers, level, atol, rtol, session_config, progress)
    blame = OptimizerBlame(verdict=AGREES, message="", level=level, providers=names)
    base_ok, base_err, _ = judge("disabled")
    blame.unoptimized_err_abs = base_err
    if not base_ok:
        blame.verdict = EXPORT_DISAGREES
        blame.message = (
            f"the unoptimized session already disagrees with torch (err_abs={base_err:.3g}): "
            "the export itself differs, no optimizer is to blame; run_aligned(ep, onx, "
            "args) names the node"
        )
        blame.sessions = judge.sessions
        return blame
    ok, err, applied, log_read = judge.measure(level)
    blame.optimized_err_abs = err
    blame.applied = list(applied)
    if ok:
        blame.message = (
            f"the session optimized at level {level!r} agrees with torch (err_abs={err:.3g}): "
            "nothing to bisect"
        )
        blame.sessions = judge.sessions
        return blame
    if not log_read:
        blame.verdict = UNKNOWN_OPTIMIZERS
        blame.message = (
            "the optimized session disagrees but onnxruntime's log could not be read, so the "
            "optimizers it applied are unknown (stderr is not a file descriptor here)"
        )
        blame.sessions = judge.sessions
        return blame

    # later optimizers first: the fusions at the end of the pipeline are preferred
    # over the rewrites (constant folding) that merely enable them
    candidates = list(reversed(applied))
    judge.estimate = judge.sessions + 2 + 2 * math.ceil(math.log2(len(candidates) + 1))
    all_ok = False
    for _ in range(_ROUNDS):
        all_ok, _, newly, _ = judge.measure(level, candidates)
        more = [n for n in newly if n not in candidates]
        if all_ok or not more:
            break
        # disabling some optimizers lets others apply: they are candidates too
        candidates += list(reversed(more))
    if not all_ok:
        blame.verdict = NOT_AN_OPTIMIZER
        which = (
            f"with every optimizer it applied disabled ({', '.join(candidates)})"
            if candidates
            else "and it applied no optimizer"
        )
        blame.message = (
            f"the session still disagrees {which}: the difference comes from the kernels "
            f"of {names[0]}, not from a graph optimization"
        )
        blame.sessions = judge.sessions
        return blame
    found = minimal_disabling_set(candidates, lambda ds: judge(level, ds)[0])
    blame.verdict = FOUND
    blame.optimizers = found
    blame.fixed_err_abs = judge(level, found)[1]
    blame.sessions = judge.sessions
    if locate:
        optimized = optimize_model(model, level, providers, session_config=session_config)
        blame.sessions += 1
        _locate(blame, program, optimized, args, kwargs, atol, rtol)
    where = f"; first diverging node: {blame.node} ({blame.node_op_type})" if blame.node else ""
    blame.message = (
        f"disabling {', '.join(found)} makes the session optimized at level {level!r} agree "
        f"with torch (err_abs {err:.3g} -> {blame.fixed_err_abs:.3g}){where}"
    )
    return blame


def _locate(blame, program, optimized: OptimizedModel, args, kwargs, atol, rtol) -> None:
    """Names the first optimized node whose value disagrees with torch.

    When that value comes out of a node the optimizers left as it was (a QuantizeLinear
    turning a small error into a whole step), the node named is the nearest changed node
    upstream of it.
    """
    from .run import run_aligned

    first = None
    for rec in run_aligned(program, optimized.model, args, kwargs, atol=atol, rtol=rtol):
        blame.records.append(rec)  # the answer's records: up to the first diverging one
        if rec.failed and rec.onnx_name is not None and rec.onnx_id_node is not None:
            first = rec
            break
    if first is None:
        return
    blame.value, blame.ep_name, blame.err_abs = first.onnx_name, first.ep_name, first.err_abs
    if first.onnx_id_node < 0:
        # a constant onnxruntime folded (and computed) itself
        blame.node_kind = "folded"
        blame.node_replaced = [k for k, v in optimized.folded.items() if v == first.onnx_name]
        return
    node = optimized.group(first.onnx_name)
    if node.kind == NODE_UNCHANGED:
        node = _changed_ancestor(optimized, node.index) or node
    blame.node, blame.node_op_type = node.name, node.op_type
    blame.node_kind, blame.node_replaced = node.kind, list(node.replaced)


def _changed_ancestor(optimized: OptimizedModel, index: int):
    g = optimized.model.graph
    producer = {o: j for j, n in enumerate(g.node) for o in n.output if o}
    frontier, seen = [index], {index}
    while frontier:
        nxt = []
        for j in frontier:
            for i in g.node[j].input:
                p = producer.get(i)
                if p is None or p in seen:
                    continue
                seen.add(p)
                main = optimized.group(optimized.nodes[p].name)
                if main.kind != NODE_UNCHANGED:
                    return main
                nxt.append(p)
        frontier = nxt
    return None


__all__ = [
    "AGREES",
    "EXPORT_DISAGREES",
    "FOUND",
    "NOT_AN_OPTIMIZER",
    "UNKNOWN_OPTIMIZERS",
    "BisectStep",
    "OptimizerBlame",
    "bisect_optimizers",
    "minimal_disabling_set",
]
