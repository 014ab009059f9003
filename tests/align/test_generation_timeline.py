"""The token streams a view draws of a generation parity run (issue 51, item 4): the
contract's ``timeline()`` payload, real decodes of a tiny Llama exported with its cache
(tests/corpus/cache_decoders.py), faithful and with faults planted in the ONNX model."""

from __future__ import annotations

import functools
import json

import pytest

from onnx_sbs_nb import generation_parity
from onnx_sbs_nb.align.contract import RecordStream, as_run
from onnx_sbs_nb.notebook.session import SbsSession
from onnx_sbs_nb.records import Record

pytest.importorskip("transformers")


@functools.cache
def _case():
    from ..corpus.cache_decoders import export_case

    return export_case("dynamic_cache", "dynamic")


def _parity(onx=None, steps: int = 6):
    case = _case()
    return generation_parity(case.ep, case.onx if onx is None else onx, case.kwargs(), steps=steps)


def test_a_faithful_decode_has_no_parting_step():
    parity = _parity()
    tl = parity.timeline()
    assert [s["name"] for s in tl["sides"]] == ["torch", "ONNX model"]
    torch_side, onnx_side = tl["sides"]
    # [row][step]: each batch row's stream, as each side chose it
    assert torch_side["tokens"] == [list(r) for r in zip(*parity.torch_tokens)]
    assert onnx_side["tokens"] == torch_side["tokens"] and len(torch_side["tokens"]) == 2
    assert torch_side["text"] is None and tl["decode_error"] is None
    assert tl["parted_at"] is None and tl["parted_by"] is None and tl["margin"] is None
    assert tl["records_step"] is None and tl["records"] == 0
    assert all(s["agree"] and s["parted_by"] is None for s in tl["steps"])
    assert [s["margin"] for s in tl["steps"]] == [s.margin for s in parity.steps]
    assert tl["why"] == parity.why() and "agree on all 6 steps" in tl["why"]


def test_an_error_the_cache_carries_in_parts_at_a_later_step_with_its_margin():
    from ..corpus.cache_decoders import scaled_cache_output

    # each step writes its cache 0.002% too large: no step errs alone, the error grows
    parity = _parity(scaled_cache_output(_case().onx, 1 + 2e-5), steps=24)
    tl = parity.timeline()
    k = tl["parted_at"]
    assert k is not None and k > 0 and k == parity.diverged_at
    assert tl["parted_by"] == parity.diverged_by == tl["steps"][k]["parted_by"]
    assert all(s["parted_by"] is None for s in tl["steps"][:k])
    # the margin between torch's two best logits at the parting step, and its error
    assert tl["margin"] == parity.steps[k].margin and tl["margin"] >= 0
    assert tl["err_abs"] == parity.steps[k].err_abs and tl["err_abs"] > 0
    # the run's records are that step compared node by node: the link the view follows
    assert tl["records_step"] == k and tl["records"] == len(parity.records) > 0


def test_a_planted_cache_fault_marks_the_step_and_the_tokens_that_differ():
    from ..corpus.cache_decoders import scaled_cache_output

    parity = _parity(scaled_cache_output(_case().onx, 1.5), steps=6)
    tl = parity.timeline(decode=lambda t: f"<b>{t}</b>")
    assert tl["parted_at"] == 0 and tl["parted_by"] == "cache"
    assert tl["margin"] == parity.steps[0].margin and tl["records_step"] == 0
    differ = [s["step"] for s in tl["steps"] if not s["agree"]]
    assert differ, "a cache 1.5 times too large changes the tokens chosen later"
    k = differ[0]
    torch_side, onnx_side = tl["sides"]
    assert any(t[k] != o[k] for t, o in zip(torch_side["tokens"], onnx_side["tokens"]))
    # decoded with the user's callable, the text kept as it came (a view escapes it)
    assert torch_side["text"][0][0] == f"<b>{torch_side['tokens'][0][0]}</b>"


def test_a_failing_decode_says_why_and_ids_are_shown():
    def decode(_token):
        raise ValueError("no such token")

    tl = _parity(steps=2).timeline(decode)
    assert tl["sides"][0]["text"] is None
    assert "decode failed (ValueError: no such token)" in tl["decode_error"]


def test_the_timeline_is_part_of_the_contract_and_other_kinds_have_none():
    run = as_run([Record(ep_name="a", onnx_name="a", err_abs=0.0)])
    assert run.timeline() is None
    parity = _parity(steps=2)
    assert RecordStream(parity).timeline() == parity.timeline()
    session = SbsSession.from_run(parity)
    session.decode = str
    tl = session.timeline()
    json.dumps(tl, allow_nan=False)  # what the browser gets: plain JSON
    assert tl["sides"][1]["text"][0] == [str(t) for t in tl["sides"][1]["tokens"][0]]
    assert SbsSession.from_run(run).timeline() is None
