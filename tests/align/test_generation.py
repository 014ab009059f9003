"""Generation parity (issue 51, item 4): a decoder exported with its transformers cache,
decoded greedily by torch and by onnxruntime side by side, each feeding its own cache back.

The decoder is a tiny Llama with a ``DynamicCache`` (tests/corpus/cache_decoders.py),
exported with dynamic batch, sequence and past dims by the real exporter.  Faults are
planted in the ONNX model: a scale on the cache one layer writes (the step's logits stay
right, later steps read the wrong cache), and a rotary frequency off by 0.1%.
"""

from __future__ import annotations

import onnx
import pytest
import torch

from onnx_sbs_nb import generation_parity, summarize
from onnx_sbs_nb.align.generation import next_step_inputs
from onnx_sbs_nb.errors import SbsInputError

from ..corpus.cache_decoders import export_case, rotary_frequency_off, scaled_cache_output

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def decoder():
    case = export_case("dynamic_cache", "dynamic")
    return case, case.inputs(*case.case.sizes)


def _cache_output(onx: onnx.ModelProto) -> str:
    return onx.graph.output[-1].name  # the last layer's values


def test_a_faithful_export_decodes_the_same_text(decoder):
    case, kwargs = decoder
    parity = generation_parity(case.ep, case.onx, kwargs, steps=8)
    assert parity.verdict == "pass" and parity.diverged_at is None
    assert len(parity.steps) == 8 and parity.torch_tokens == parity.onnx_tokens
    assert all(s.passed and s.cache_passed for s in parity.steps)
    assert all(s.margin is not None and s.margin >= 0 for s in parity.steps)
    assert "agree on all 8 steps" in parity.to_text()
    with pytest.raises(SbsInputError, match="never parted"):
        parity.step_run()
    assert parity.to_dict()["verdict"] == "pass"


def test_a_wrong_cache_is_named_at_the_step_that_writes_it(decoder):
    case, kwargs = decoder
    out = _cache_output(case.onx)
    parity = generation_parity(case.ep, scaled_cache_output(case.onx, 1.01), kwargs, steps=4)
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


def test_an_error_the_cache_carries_in_is_told_from_the_steps_own(decoder):
    """Each step writes its cache 0.002% too large: no step errs alone, but the ONNX side
    feeds its own cache back and the error grows until it leaves tolerance."""
    case, kwargs = decoder
    onx = scaled_cache_output(case.onx, 1 + 2e-5)
    parity = generation_parity(case.ep, onx, kwargs, steps=24)
    assert parity.diverged_at is not None and parity.diverged_at > 0
    assert all(s.parted_by is None for s in parity.steps[: parity.diverged_at])
    assert parity.own_passed is True
    assert "came in with the cache" in parity.why()


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
    kwargs = static.inputs(*static.case.sizes)
    with pytest.raises(SbsInputError, match="dynamic"):
        generation_parity(static.ep, static.onx, kwargs, steps=2)
