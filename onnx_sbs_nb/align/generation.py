"""Generation parity: a decoder exported with its cache, decoded greedily by torch and by
onnxruntime side by side, each side feeding its own cache back.

A decoder can pass every single-step check and still generate other text after twenty
tokens: an error too small to change one step's logits grows in the cache it writes.  This
run decodes ``steps`` greedy steps on both sides and names the first step where the tokens
differ or the last position's logits leave tolerance, with the margin between torch's two
best logits there (a small margin turns a small error into another token).  At that step
the ONNX model runs once more on torch's own inputs and cache: an error that stays is the
step's own, one that goes away was carried in by the cache.  :meth:`GenerationParity.
step_run` then compares that step node by node (:func:`~onnx_sbs_nb.align.run.run_aligned`
on torch's inputs), which names the node.

The inputs are the first step's keyword inputs as the program was exported with them
(``input_ids``, ``attention_mask``, the cache object as ``past_key_values``...).  Each next
step feeds the token chosen (``input_ids``, or ``decoder_input_ids`` for an encoder-decoder),
one more position (``attention_mask``, ``position_ids``, ``cache_position``) and the cache
the step returned; ``next_inputs=`` replaces that rule for other signatures.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import onnx
import torch

from ..errors import SbsInputError
from ..records import Record
from .contract import AnswerContract
from .generation_judge import OnnxDecoder, StepJudge
from .source.loading import load_exported_program, load_onnx_model

_tree = torch.utils._pytree

# keyword inputs that advance by one position per step (the decoder's own, for an
# encoder-decoder, whose encoder inputs stay)
_IDS = ("decoder_input_ids", "input_ids")
_MASKS = ("decoder_attention_mask", "attention_mask")
NextInputs = Callable[[dict[str, Any], torch.Tensor, Any], dict[str, Any]]


@dataclass
class GenerationStep:
    """One decoding step: the tokens each side chose and how far apart their logits are.

    ``err_abs`` / ``err_rel`` / ``passed``: the last position's logits of the ONNX model
    (fed its own tokens and cache) against torch's, within the dtype's tolerance; None
    once the tokens have differed (the two sides then decode different texts).
    ``margin``: torch's best logit minus its second best (smallest over the batch)."""

    step: int
    torch_tokens: list[int]
    onnx_tokens: list[int]
    err_abs: float | None = None
    err_rel: float | None = None
    passed: bool | None = None
    margin: float | None = None
    #: the cache the step wrote (each output after the logits) against torch's: the
    #: largest error, whether every one is within tolerance, the ONNX output that errs most
    cache_err_abs: float | None = None
    cache_passed: bool | None = None
    cache_worst: str | None = None
    #: a quantized model's SQNR (dB) of the logits and the lowest of the cache written
    #: (the cache's is measured on a float model too)
    snr: float | None = None
    cache_snr: float | None = None
    torch_seconds: float = 0.0
    onnx_seconds: float = 0.0

    @property
    def tokens_agree(self) -> bool:
        return self.torch_tokens == self.onnx_tokens

    @property
    def parted_by(self) -> str | None:
        """Why the decodes part here: "tokens", "logits", "cache", or None."""
        if not self.tokens_agree:
            return "tokens"
        if self.passed is False:
            return "logits"
        if self.cache_passed is False:
            return "cache"
        return None


@dataclass
class GenerationParity(AnswerContract):
    """The two decodes side by side and where they part (:func:`generation_parity`).  A run
    kind that answers at once: its records are the step where the decodes part, compared
    node by node on torch's inputs (none when they never part)."""

    KIND = "generation"
    LABEL = "generation parity"

    def answer(self) -> str | None:
        return self.why()

    steps: list[GenerationStep]
    #: the first step whose tokens differ or whose logits leave tolerance (None: none)
    diverged_at: int | None
    #: "tokens" (another token chosen), "logits" (the same token, logits beyond tolerance)
    #: or "cache" (the same token, close logits, but the cache written differs)
    diverged_by: str | None
    #: the ONNX model at that step on torch's inputs and cache: its logits' max abs error
    #: and whether it is within tolerance (False: the step makes the error; True: the
    #: cache carried it in)
    own_err_abs: float | None = None
    own_passed: bool | None = None
    atol: float | None = None
    rtol: float | None = None
    #: a quantized model: its bit width and the SQNR floor (dB) each step is judged by
    bits: int | None = None
    noise_floor: float | None = None
    #: the step's SQNR on torch's inputs and cache (a quantized model)
    own_snr: float | None = None
    #: the verdict of that step compared node by node (None: not compared)
    step_run_verdict: str | None = None
    #: where that run names no node: the record of the differing cache output with the
    #: largest own error (the node that writes it, under tolerance each step)
    grows_in: Record | None = field(default=None, repr=False)
    #: the culprit that run names (a :class:`~onnx_sbs_nb.align.blame.culprit.Culprit`):
    #: the step's fault, whatever the step's logits SQNR says
    culprit: Any = field(default=None, repr=False)
    records: list[Record] = field(default_factory=list, repr=False)
    #: how the answer points to the node-by-node run (the CLI names its flag)
    step_hint: str = field(default="step_run() compares it node by node", repr=False)
    _ep: Any = field(default=None, repr=False)
    _onx: Any = field(default=None, repr=False)
    _step_inputs: dict[str, Any] | None = field(default=None, repr=False)

    @property
    def quantization_noise(self) -> bool:
        """The decodes part only by a quantized model's noise: the tokens part where every
        step so far was within the noise floor, the step is within it on torch's cache
        too, and its node-by-node run passes (a fault there is named, and fails)."""
        return (
            self.bits is not None
            and self.diverged_by == "tokens"
            and self.own_passed is True
            and self.step_run_verdict == "pass"
        )

    @property
    def verdict(self) -> str:
        """ "pass" when the decodes agree or part only by quantization noise (the answer
        says where, :attr:`quantization_noise`), else "fail"."""
        return "pass" if self.diverged_at is None or self.quantization_noise else "fail"

    @property
    def torch_tokens(self) -> list[list[int]]:
        """Each step's tokens (one per batch row) as torch chose them."""
        return [s.torch_tokens for s in self.steps]

    @property
    def onnx_tokens(self) -> list[list[int]]:
        return [s.onnx_tokens for s in self.steps]

    def step_inputs(self) -> dict[str, Any] | None:
        """Torch's keyword inputs at the divergence step (its tokens and cache)."""
        return self._step_inputs

    def step_run(self, **options: Any) -> Any:
        """That step compared node by node: ``run_aligned`` on torch's inputs and cache
        (options as ``run_aligned``'s: ``own_error=True`` names the node that makes it)."""
        if self._step_inputs is None:
            raise SbsInputError("the two decodes never parted: there is no step to compare")
        from .run import run_aligned

        return run_aligned(self._ep, self._onx, (), dict(self._step_inputs), **options)

    def attach_step_run(self, records: list[Record]) -> None:
        """The parting step compared node by node: its records, their verdict, and where
        they name no culprit, the node writing the cache output that differs."""
        from .blame.summary import summarize
        from .generation_why import cache_writer

        self.records = records
        summary = summarize(records)
        self.step_run_verdict = summary.verdict
        self.culprit = summary.culprit
        if summary.culprit is None:
            self.grows_in = cache_writer(self, records)

    def why(self) -> str:
        from .generation_why import explain

        return explain(self)

    def to_text(self) -> str:
        n = len(self.steps)
        lines = [f"generation parity: {self.verdict.upper()} over {n} steps", f"  {self.why()}"]
        torch_stream = " ".join(str(t[0]) for t in self.torch_tokens)
        onnx_stream = " ".join(str(t[0]) for t in self.onnx_tokens)
        lines += [f"  torch: {torch_stream}", f"  onnx:  {onnx_stream}"]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "diverged_at": self.diverged_at,
            "diverged_by": self.diverged_by,
            "own_err_abs": self.own_err_abs,
            "own_passed": self.own_passed,
            "bits": self.bits,
            "noise_floor": self.noise_floor,
            "own_snr": self.own_snr,
            "step_run_verdict": self.step_run_verdict,
            "quantization_noise": self.quantization_noise,
            "culprit": _culprit_dict(self.culprit),
            "why": self.why(),
            "steps": [
                {k: getattr(s, k) for k in GenerationStep.__dataclass_fields__} for s in self.steps
            ],
        }

    def timeline(self, decode: Callable[[int], str] | None = None) -> dict[str, Any]:
        """The two token streams as a view draws them, the parting step marked with its
        margin and errors, and which step the run's records compare node by node
        (:func:`~onnx_sbs_nb.align.generation_timeline.generation_timeline`; ``decode``:
        a token id's text, ``tokenizer.decode``)."""
        from .generation_timeline import generation_timeline

        return generation_timeline(self, decode)


def _culprit_dict(culprit: Any) -> dict[str, Any] | None:
    """Where the step's node-by-node run places the fault, as names."""
    if culprit is None:
        return None
    r = culprit.record
    return {
        "ep_name": r.ep_name,
        "ep_module": r.ep_module,
        "ep_source": r.ep_source,
        "onnx_node": culprit.onnx_node or r.onnx_node_name,
    }


def _logits_and_cache(out: Any) -> tuple[torch.Tensor, Any]:
    """The logits (the first tensor returned, or ``logits``) and the cache (the first
    value that is not a tensor, or ``past_key_values``) of one step's outputs."""
    if isinstance(out, Mapping):
        # transformers 5 names the cache ``cache`` and warns on the old key: read the
        # key the output holds (its own list of keys, which warns on nothing)
        keys = list(out.keys())
        cache_key = next((k for k in ("cache", "past_key_values") if k in keys), None)
        logits, cache = out.get("logits"), (out[cache_key] if cache_key else None)
    elif isinstance(out, tuple | list):
        tensors = [o for o in out if isinstance(o, torch.Tensor)]
        others = [o for o in out if not isinstance(o, torch.Tensor)]
        logits, cache = (tensors[0] if tensors else None), (others[0] if others else None)
        if cache is None and len(tensors) > 1:
            cache = tuple(tensors[1:])  # a cache of plain tensors (past keys, values)
    else:
        logits, cache = out, None
    if isinstance(logits, torch.Tensor) and logits.dim() != 3 and isinstance(out, tuple | list):
        shapes = [tuple(o.shape) for o in out if isinstance(o, torch.Tensor)]
        raise SbsInputError(
            "generation parity reads the logits ([batch, seq, vocab]) as the first tensor the "
            f"program returns, then the cache; it returns tensors shaped {shapes}: export a "
            "wrapper whose forward returns (logits, *cache)"
        )
    if not isinstance(logits, torch.Tensor) or logits.dim() < 2:
        raise SbsInputError(
            "generation parity needs the program to return the logits first (a tensor "
            "[batch, seq, vocab]) and the cache after them, as (logits, cache) or a "
            f"ModelOutput; it returned {type(out).__name__}"
        )
    return logits, cache


def _cache_key(kwargs: dict[str, Any]) -> str | None:
    """The keyword input holding the cache: the one whose value is no tensor."""
    keys = [k for k, v in kwargs.items() if v is not None and not isinstance(v, torch.Tensor)]
    return keys[0] if keys else None


def next_step_inputs(kwargs: dict[str, Any], tokens: torch.Tensor, cache: Any) -> dict[str, Any]:
    """The default rule: the tokens chosen as the ids, one more position in the mask,
    ``position_ids`` and ``cache_position``, the cache the step returned."""
    nxt = dict(kwargs)
    ids = next((k for k in _IDS if k in kwargs), None)
    if ids is None:
        raise SbsInputError(
            "generation parity feeds the chosen token as input_ids (or decoder_input_ids); "
            f"the program takes {sorted(kwargs)}: pass next_inputs=fn(kwargs, tokens, cache)"
        )
    nxt[ids] = tokens.to(kwargs[ids].dtype).reshape(-1, 1)
    mask = next(
        (k for k in _MASKS if k in kwargs and (k != "attention_mask" or ids == "input_ids")), None
    )
    if mask is not None and isinstance(kwargs[mask], torch.Tensor) and kwargs[mask].dim() == 2:
        m = kwargs[mask]
        nxt[mask] = torch.cat([m, torch.ones(m.shape[0], 1, dtype=m.dtype)], dim=1)
    key = _cache_key(kwargs)
    fed = {} if key is not None else _tensor_cache_inputs(kwargs, cache, ids)
    if key is None and not fed:
        # no cache: the next step reads the whole sequence again
        nxt[ids] = torch.cat([kwargs[ids], nxt[ids]], dim=-1)
    if isinstance(kwargs.get("position_ids"), torch.Tensor):
        pos = kwargs["position_ids"]
        nxt["position_ids"] = (
            pos[..., -1:] + 1 if key or fed else torch.cat([pos, pos[..., -1:] + 1], -1)
        )
    if isinstance(kwargs.get("cache_position"), torch.Tensor):
        nxt["cache_position"] = kwargs["cache_position"][-1:] + 1
    if key is not None and cache is not None:
        nxt[key] = cache
    nxt.update(fed)
    return nxt


_NOT_CACHE = (*_IDS, *_MASKS, "position_ids", "cache_position", "token_type_ids")


def _tensor_cache_inputs(kwargs: dict[str, Any], cache: Any, ids: str) -> dict[str, Any]:
    """A cache of plain tensors fed back: each tensor input (past keys, past values) gets
    the first unused output after the logits shaped like it but for one dimension grown by
    the tokens this step read (the concatenated cache), in order.  {} when the program
    returns no such output; an input named as a cache with no output to feed it is an
    error: decoding on would rerun the first cache at every step."""
    outs = list(cache) if isinstance(cache, tuple) else []
    if not all(isinstance(o, torch.Tensor) for o in outs):
        return {}
    grown = int(kwargs[ids].shape[-1])
    fed: dict[str, Any] = {}
    used: set[int] = set()
    for name, value in kwargs.items():
        if name in _NOT_CACHE or not isinstance(value, torch.Tensor):
            continue
        j = next((j for j, o in enumerate(outs) if j not in used and _grows(value, o, grown)), None)
        if j is not None:
            used.add(j)
            fed[name] = outs[j]
        elif "past" in name.lower() or "cache" in name.lower():
            raise SbsInputError(
                f"generation parity cannot tell which output is the next {name!r}: none of "
                f"the {len(outs)} outputs after the logits is shaped like it with one "
                f"dimension {grown} longer; pass next_inputs=fn(kwargs, tokens, cache) "
                "(cache: the outputs after the logits, in order)"
            )
    return fed


def _grows(past: torch.Tensor, out: torch.Tensor, grown: int) -> bool:
    """Whether ``out`` is ``past`` with one dimension ``grown`` longer (same dtype)."""
    if past.dtype != out.dtype or past.dim() != out.dim():
        return False
    diff = [b - a for a, b in zip(past.shape, out.shape)]
    return sorted(diff)[-1:] == [grown] and diff.count(0) == len(diff) - 1


def _out_spec(program: Any, t_out: Any, model: onnx.ModelProto) -> Any:
    """How the ONNX model's flat outputs make the step's outputs: the program's own output
    spec, which ``ep.module()`` unflattens its outputs with.  Flattening what the module
    returned may give fewer leaves: a sliding-window cache layer holds its running length
    as a graph output that flattening the rebuilt cache keeps as context."""
    spec = getattr(getattr(program, "call_spec", None), "out_spec", None)
    if spec is not None and spec.num_leaves == len(model.graph.output):
        return spec
    return _tree.tree_flatten(t_out)[1]


def _run_program(module: Any, kwargs: dict[str, Any], step: int) -> Any:
    try:
        with torch.no_grad():
            return module(**kwargs)
    except Exception as e:
        if step == 0:
            raise
        shapes = {k: tuple(v.shape) for k, v in kwargs.items() if isinstance(v, torch.Tensor)}
        if "tree spec" in str(e):  # torch.export's input check, before any shape
            raise SbsInputError(
                f"the program cannot take back the cache it returned at step {step - 1}: "
                "the cache no longer flattens as the exported one (its structure or a value "
                "kept in it as a Python number changed, as a sliding-window layer's running "
                "length does); generation parity needs a cache whose structure stays, or "
                "next_inputs=fn(kwargs, tokens, cache) that rebuilds it as exported"
            ) from None
        raise SbsInputError(
            f"the program cannot run step {step}'s inputs {shapes} "
            f"({str(e).splitlines()[0][:200]}): a program exported with fixed sizes cannot "
            "grow its cache: export with dynamic batch, sequence and past dimensions"
        ) from None


def _greedy(logits: torch.Tensor) -> tuple[torch.Tensor, float]:
    last = logits[:, -1, :].double()
    top = torch.topk(last, 2, dim=-1).values if last.shape[-1] > 1 else last
    margin = float((top[:, 0] - top[:, 1]).min()) if top.shape[-1] > 1 else float("inf")
    return last.argmax(dim=-1), margin


def iter_generation(
    ep: Any,
    onx: Any,
    kwargs: dict[str, Any],
    *,
    steps: int = 32,
    next_inputs: NextInputs | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    state: dict[str, Any] | None = None,
) -> Iterator[GenerationStep]:
    """The two decodes, one :class:`GenerationStep` at a time (see :func:`generation_parity`).
    ``state`` receives torch's inputs at the first step that parts, under ``"inputs"``."""
    if not isinstance(kwargs, Mapping) or not kwargs:
        raise SbsInputError(
            "generation parity takes the first step's keyword inputs as a dict "
            "(input_ids=..., attention_mask=..., and the cache object under its keyword)"
        )
    if steps < 1:
        raise SbsInputError(f"steps must be at least 1, not {steps}")
    program = load_exported_program(ep)
    model = load_onnx_model(onx)
    rule = next_inputs or next_step_inputs
    module = program.module()
    if state is not None:  # the parting step's rerun reuses them
        state.update(program=program, model=model, module=module)
    t_kwargs = o_kwargs = dict(kwargs)
    decoder: OnnxDecoder | None = None
    judge = StepJudge.for_model(model, atol, rtol)
    if state is not None:
        state["judge"] = judge
    apart = False
    for k in range(steps):
        t0 = time.perf_counter()
        t_out = _run_program(module, t_kwargs, k)
        t1 = time.perf_counter()
        if decoder is None:
            decoder = OnnxDecoder(model, _out_spec(program, t_out, model))
            if state is not None:
                state["decoder"] = decoder
        o_out = decoder(o_kwargs)
        t2 = time.perf_counter()
        t_logits, t_cache = _logits_and_cache(t_out)
        o_logits, o_cache = _logits_and_cache(o_out)
        t_tok, margin = _greedy(t_logits)
        o_tok, _ = _greedy(o_logits)
        step = GenerationStep(k, t_tok.tolist(), o_tok.tolist(), margin=margin)
        step.torch_seconds, step.onnx_seconds = t1 - t0, t2 - t1
        if not apart:
            d = judge.judge(t_logits[:, -1, :], o_logits[:, -1, :])
            step.err_abs, step.err_rel, step.passed = d.err_abs, d.err_rel, bool(d.passed)
            step.snr = d.err_snr if judge.bits is not None else None
            judge.cache(step, t_cache, o_cache, decoder.output_names)
            if state is not None:
                state.setdefault("tolerance", (d.atol, d.rtol))
                if step.parted_by is not None:
                    state.setdefault("inputs", t_kwargs)
            apart = not step.tokens_agree
        yield step
        if k + 1 < steps:
            t_kwargs = rule(t_kwargs, t_tok, t_cache)
            o_kwargs = rule(o_kwargs, o_tok, o_cache)


def generation_parity(
    ep: Any,
    onx: Any,
    kwargs: dict[str, Any],
    *,
    steps: int = 32,
    next_inputs: NextInputs | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    progress: Callable[[int, int], None] | None = None,
    compare_step: bool = True,
) -> GenerationParity:
    """Decodes ``steps`` greedy steps with the program and with the ONNX model, each feeding
    its own cache back, and says where they part.

    ``kwargs``: the first step's keyword inputs (the cache included, as exported: a cache
    object, or plain tensors such as ``past_keys``/``past_values`` that the program returns
    grown by the step's tokens after the logits; a program without a cache reads the whole
    sequence again at each step).  The program returns the logits first.
    ``next_inputs(kwargs, tokens, cache) -> kwargs``: the next step's inputs (default:
    :func:`next_step_inputs`).  ``atol``/``rtol``: the logits' tolerance (default: their
    dtype's).  ``progress(done, total)`` is called after each step.  ``compare_step``: the
    step where the decodes part is compared node by node with own errors (its records are
    the run's; ``step_run()`` does it later when False)."""
    state: dict[str, Any] = {}
    done: list[GenerationStep] = []
    for step in iter_generation(
        ep, onx, kwargs, steps=steps, next_inputs=next_inputs, atol=atol, rtol=rtol, state=state
    ):
        done.append(step)
        if progress is not None:
            progress(len(done), steps)
    first = next((s for s in done if s.parted_by is not None), None)
    atol_used, rtol_used = state.get("tolerance", (None, None))
    parity = GenerationParity(
        steps=done,
        diverged_at=None if first is None else first.step,
        diverged_by=None if first is None else first.parted_by,
        atol=atol_used,
        rtol=rtol_used,
        _ep=state["program"],
        _onx=state["model"],
        _step_inputs=state.get("inputs"),
    )
    judge: StepJudge = state["judge"]
    parity.bits, parity.noise_floor = judge.bits, judge.floor
    if first is not None and first.err_abs is not None:
        _own_error(parity, state, atol, rtol)
        if compare_step:
            parity.attach_step_run(list(parity.step_run(own_error=True)))
    return parity


def _own_error(
    parity: GenerationParity, state: dict[str, Any], atol: float | None, rtol: float | None
) -> None:
    """The divergence step's ONNX outputs (logits and cache) on torch's own inputs, with the
    program and the onnxruntime session the decodes used."""
    inputs = parity._step_inputs
    with torch.no_grad():
        t_out = state["module"](**inputs)
    decoder = state["decoder"]
    t_logits, t_cache = _logits_and_cache(t_out)
    o_logits, o_cache = _logits_and_cache(decoder(inputs))
    judge: StepJudge = state["judge"]
    d = judge.judge(t_logits[:, -1, :], o_logits[:, -1, :])
    own = GenerationStep(-1, [], [])
    judge.cache(own, t_cache, o_cache, decoder.output_names)
    parity.own_err_abs = max(d.err_abs or 0.0, own.cache_err_abs or 0.0)
    parity.own_passed = bool(d.passed) and own.cache_passed is not False
    snrs = [x for x in (d.err_snr, own.cache_snr) if x is not None]
    parity.own_snr = min(snrs) if snrs else None


__all__ = ["GenerationParity", "GenerationStep", "generation_parity", "next_step_inputs"]
