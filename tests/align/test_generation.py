"""Generation parity (issue 51, item 4): a decoder exported with its transformers cache,
decoded greedily by torch and by onnxruntime side by side, each feeding its own cache back.

Three decoders with a ``DynamicCache`` (tests/corpus/cache_decoders.py): a tiny Llama, a
Phi-3 (fused qkv and gate/up projections) and a GPT-2 (no rotary embedding, learned
positions), each exported with dynamic batch, sequence and past dims by the real exporter.
Faults are planted in the ONNX model, the same way in each: a scale on the cache one layer
writes (the step's logits stay right, later steps read the wrong cache), the same scale so
small that only the cache fed back makes it show, and one layer's attention reading its
keys wrong past a position (nothing differs before it, the step is known in advance).
"""

from __future__ import annotations

import ast
import functools

import onnx
import pytest
import torch

from onnx_sbs_nb import generation_parity, summarize
from onnx_sbs_nb.align.generation import next_step_inputs
from onnx_sbs_nb.errors import SbsInputError

from ..corpus.cache_decoders import (
    GENERATION_DECODERS,
    ExportedCase,
    cache_output,
    export_case,
    late_key_fault,
    mistyped_node,
    rotary_frequency_off,
    scaled_cache_output,
)

pytest.importorskip("transformers")

each_decoder = pytest.mark.parametrize("name", GENERATION_DECODERS)


@functools.cache
def _exported(name: str) -> ExportedCase:
    return export_case(name, "dynamic")


@pytest.fixture(scope="module")
def decoder():
    case = _exported("dynamic_cache")
    return case, case.kwargs()


@pytest.mark.slow
@each_decoder
def test_a_faithful_export_decodes_the_same_text_for_32_steps(name):
    case = _exported(name)
    parity = generation_parity(case.ep, case.onx, case.kwargs(), steps=32)
    assert parity.verdict == "pass" and parity.diverged_at is None, parity.why()
    assert len(parity.steps) == 32 and parity.torch_tokens == parity.onnx_tokens
    assert all(s.passed and s.cache_passed for s in parity.steps)
    assert all(s.margin is not None and s.margin >= 0 for s in parity.steps)
    assert "agree on all 32 steps" in parity.to_text()
    assert not parity.records
    with pytest.raises(SbsInputError, match="never parted"):
        parity.step_run()
    assert parity.to_dict()["verdict"] == "pass"


def _downstream(onx: onnx.ModelProto, node_name: str) -> set[str]:
    """The nodes that read, directly or not, what the node named writes."""
    values = {o for n in onx.graph.node if n.name == node_name for o in n.output}
    found: set[str] = set()
    for n in onx.graph.node:  # in topological order
        if values.intersection(n.input):
            found.add(n.name)
            values.update(n.output)
    return found


def _module_writing(onx: onnx.ModelProto, output: str) -> str:
    """The module (``...layers.0.self_attn``, ``...h.0.attn``) whose node writes an output,
    from the exporter's name scopes: the attention that updates the cache."""
    node = next(n for n in onx.graph.node if output in n.output)
    scopes = next(p.value for p in node.metadata_props if p.key == "pkg.torch.onnx.name_scopes")
    return ast.literal_eval(scopes)[-2]


@pytest.mark.slow
@each_decoder
def test_a_fault_past_a_position_is_named_at_the_first_step_it_shows(name):
    """Layer 0 reads its keys past position 16 wrong: the cache is 8 long at step 0 (5 past,
    3 new tokens) and holds position 17 first at step 10.  Steps 0-9 are exact; step 10 is
    named, as the step's own error, and its node-by-node run names the node of layer 0's
    attention that reads the wrong keys."""
    case = _exported(name)
    onset, first = 16, 10
    faulty = late_key_fault(case.onx, layer=0, onset=onset, slope=1.0)
    parity = generation_parity(case.ep, faulty, case.kwargs(), steps=32)
    assert parity.diverged_at == first, parity.why()
    assert all(s.parted_by is None for s in parity.steps[:first])
    assert parity.diverged_by in ("logits", "tokens")
    assert parity.own_passed is False and "the step itself makes it" in parity.why()
    # the step compared node by node, on torch's inputs at step 10, is the run's records
    culprit = summarize(parity.records).culprit
    keys = cache_output(case.onx, 0, "keys")
    assert culprit.onnx_node_name in _downstream(faulty, "planted_keys"), culprit.to_dict()
    assert culprit.ep_module == _module_writing(case.onx, keys), culprit.to_dict()


@each_decoder
def test_a_wrong_cache_is_named_at_the_step_that_writes_it(name):
    case = _exported(name)
    out = cache_output(case.onx, -1, "values")
    parity = generation_parity(
        case.ep, scaled_cache_output(case.onx, 1.01), case.kwargs(), steps=4, compare_step=False
    )
    first = parity.steps[0]
    # the step's own logits are right: only the cache it writes is wrong
    assert first.passed and first.tokens_agree and first.cache_passed is False
    assert parity.diverged_at == 0 and parity.diverged_by == "cache"
    assert first.cache_worst == out
    assert parity.own_passed is False  # on torch's inputs too: the step makes it
    assert "the step itself makes it" in parity.why()
    summary = summarize(parity.step_run(own_error=True))
    assert summary.culprit.onnx_node_name == "planted_mul"
    assert "it makes the error" in summary.culprit.why


@each_decoder
def test_an_error_the_cache_carries_in_is_told_from_the_steps_own(name):
    """Each step writes its cache 0.002% too large: no step errs alone, but the ONNX side
    feeds its own cache back and the error grows until it leaves tolerance."""
    case = _exported(name)
    onx = scaled_cache_output(case.onx, 1 + 2e-5)
    parity = generation_parity(case.ep, onx, case.kwargs(), steps=24, compare_step=False)
    assert parity.diverged_at is not None and parity.diverged_at > 0
    assert all(s.parted_by is None for s in parity.steps[: parity.diverged_at])
    assert parity.own_passed is True
    assert "came in with the cache" in parity.why()


def test_an_error_the_cache_accumulates_is_named_at_the_node_writing_it(decoder):
    """Trial finding 06: the step's run on torch's cache passes (each step's own error is
    under tolerance), so it names no culprit; the answer names the fx node that writes the
    cache output that differs, with its module, source line and own error per step."""
    case, kwargs = decoder
    out = cache_output(case.onx, -1, "values")
    parity = generation_parity(case.ep, scaled_cache_output(case.onx, 1 + 2e-5), kwargs, steps=24)
    assert parity.diverged_by == "cache" and parity.own_passed is True, parity.why()
    assert summarize(parity.records).culprit is None
    writer = parity.grows_in
    assert writer is not None and writer.onnx_name == out
    assert writer.ep_module == _module_writing(case.onx, out)
    assert 0 < writer.own_error < writer.atol
    why = parity.why()
    assert f"the error grows in cache output {out!r}, written by {writer.ep_name}" in why
    assert writer.ep_module in why and "the cache accumulates it" in why
    # trial 2 finding 06: the tolerance quoted is the one applied (atol + rtol*|value|),
    # and the ONNX node writing the cache output is named beside the fx node
    assert f"atol {writer.atol:.3g} + rtol {writer.rtol:.3g}*|torch's value|" in why
    assert writer.onnx_node_name and f", ONNX node {writer.onnx_node_name!r}: its own" in why


def test_a_model_onnxruntime_refuses_is_named_not_raised_raw(decoder):
    """Trial finding 09: onnxruntime's own exception becomes the package's one-line
    refusal, naming the node it names."""
    case, kwargs = decoder
    bad, node = mistyped_node(case.onx)
    with pytest.raises(SbsInputError, match="onnxruntime cannot build a session") as e:
        generation_parity(case.ep, bad, kwargs, steps=2)
    assert f"at node {node!r}" in str(e.value) and "\n" not in str(e.value)


def test_a_wrong_rotary_frequency_is_named_in_the_steps_run(decoder):
    case, kwargs = decoder
    parity = generation_parity(case.ep, rotary_frequency_off(case.onx, 1.001), kwargs, steps=3)
    assert parity.diverged_by == "logits" and parity.own_passed is False
    culprit = summarize(parity.step_run(own_error=True)).culprit
    assert "rotary_emb" in (culprit.ep_module or "") + (culprit.onnx_node_name or "")


def test_next_inputs_replaces_the_default_rule(decoder):
    case, kwargs = decoder
    seen = []

    def rule(kw, tokens, cache):
        seen.append(tokens.tolist())
        return next_step_inputs(kw, tokens, cache)

    parity = generation_parity(case.ep, case.onx, kwargs, steps=3, next_inputs=rule)
    # each side's rule is called once per step but the last: 2 steps x 2 sides
    assert len(seen) == 4 and parity.verdict == "pass"


def test_the_default_rule_grows_the_mask_and_feeds_the_token(decoder):
    _, kwargs = decoder
    tokens = torch.tensor([3, 4])
    nxt = next_step_inputs(kwargs, tokens, "CACHE")
    assert nxt["input_ids"].tolist() == [[3], [4]]
    assert nxt["attention_mask"].shape[1] == kwargs["attention_mask"].shape[1] + 1
    assert nxt["past_key_values"] == "CACHE"
    with pytest.raises(SbsInputError, match="next_inputs"):
        next_step_inputs({"x": torch.zeros(1)}, tokens, None)


def test_bad_input_is_refused_with_the_fix(decoder):
    case, kwargs = decoder
    with pytest.raises(SbsInputError, match="keyword inputs as a dict"):
        generation_parity(case.ep, case.onx, (kwargs["input_ids"],))
    with pytest.raises(SbsInputError, match="steps must be at least 1"):
        generation_parity(case.ep, case.onx, kwargs, steps=0)


def test_a_model_exported_with_fixed_sizes_says_to_export_dynamic_dims():
    static = export_case("dynamic_cache", "static")
    kwargs = static.kwargs()
    with pytest.raises(SbsInputError, match="dynamic"):
        generation_parity(static.ep, static.onx, kwargs, steps=2)


@pytest.mark.slow
def test_a_sliding_window_cache_is_decoded_as_the_program_returns_it():
    """A Qwen2 whose first layer slides (DynamicSlidingWindowLayer): the program returns one
    more output than the rebuilt cache flattens to (the layer's running length), so the
    ONNX outputs are rebuilt with the program's own output spec, not the torch output's
    (step 0 used to crash in unflatten).  The exported program keeps that length as a
    Python number in its input spec: it cannot take back the cache it returned, and the
    refusal says so rather than blaming fixed sizes."""
    case = export_case("hybrid_cache", "auto")
    parity = generation_parity(case.ep, case.onx, case.kwargs(), steps=1)
    assert parity.verdict == "pass" and parity.steps[0].passed
    with pytest.raises(SbsInputError, match="cannot take back the cache it returned at step 0"):
        generation_parity(case.ep, case.onx, case.kwargs(), steps=2)
