"""Issue 46, item 4: decoders taking the cache types transformers ships as the
``past_key_values`` keyword, with dynamic dims (tests/corpus/cache_decoders.py).

Every program output is paired, the cache's included: the exporter's output fix renames
an input the program returns unchanged (``past_key_values_4_orig``, a cross-attention
cache) and returns a value twice through ``V_alias_<i>``; both are paired through their
Identity.  The dynamic export compares at least what the static one does, planted faults
are named, and batch 1, one token and an empty past are compared (issue 52)."""

from __future__ import annotations

import functools

import onnx
import pytest
import torch

from onnx_sbs_nb import run_aligned, summarize
from onnx_sbs_nb.errors import SbsInputError
from onnx_sbs_nb.records import KIND_OUTPUT, STATUS_UNPAIRED_OUTPUT
from tests.corpus.cache_decoders import ExportedCase, export_case, feeds
from tests.corpus.faults import ort_outputs, pick_fault
from tests.corpus.naming import named_correctly


@functools.lru_cache(maxsize=12)
def _exported(name: str, dims: str) -> ExportedCase:
    return export_case(name, dims)


def _outputs_paired(records, onx: onnx.ModelProto) -> None:
    """Every ONNX graph output has an output record whose values were compared."""
    assert not [r.onnx_name for r in records if r.status == STATUS_UNPAIRED_OUTPUT]
    compared = {r.onnx_name for r in records if r.kind == KIND_OUTPUT and r.err_abs is not None}
    assert {o.name for o in onx.graph.output} <= compared, compared


def _faithful(ex: ExportedCase, **sizes):
    records = list(run_aligned(ex.ep, ex.onx, (), ex.kwargs(**sizes)))
    s = summarize(records)
    assert s.verdict == "pass" and not s.partial, (ex.case.name, ex.dims, s.to_text())
    _outputs_paired(records, ex.onx)
    return s


def test_a_dynamic_cache_decoder_is_compared_as_well_as_its_static_export():
    dynamic, static = _exported("dynamic_cache", "dynamic"), _exported("dynamic_cache", "static")
    d, s = _faithful(dynamic), _faithful(static)
    assert d.coverage.torch_compared >= s.coverage.torch_compared, (
        d.coverage.to_text(),
        s.coverage.to_text(),
    )
    share = d.coverage.torch_compared / d.coverage.torch_nodes
    assert share >= s.coverage.torch_compared / s.coverage.torch_nodes, d.coverage.to_text()


def test_a_dynamic_cache_decoder_runs_batch_1_and_one_token_where_torch_does():
    """Batch 1 and one new token are compared.  An empty past is refused, as torch's own
    module refuses it: the mask's length is past + new tokens, which the export bounds
    below by 4 (2 + 2, torch's convention for each) in transformers' masking code."""
    ex = _exported("dynamic_cache", "dynamic")
    _faithful(ex, batch=1, seq=1, past=3)
    _faithful(ex, batch=1, seq=2, past=2)
    with pytest.raises(Exception):  # noqa: B017 (torch's guard raises AssertionError)
        ex.ep.module()(**ex.kwargs(batch=1, seq=1, past=0))
    with pytest.raises(SbsInputError, match=r"attention_mask.*masking_utils\.py:\d+"):
        run_aligned(ex.ep, ex.onx, (), ex.kwargs(batch=1, seq=1, past=0))


@pytest.mark.parametrize(
    "kind,depth", [("weight", "shallow"), ("op", "middle"), ("attribute", "deep")]
)
def test_faults_planted_in_a_dynamic_cache_decoder_are_named(kind, depth):
    _fault_named(_exported("dynamic_cache", "dynamic"), kind, depth)


def test_an_input_the_program_returns_unchanged_is_paired_through_the_output_fix():
    """BART's cross-attention cache goes out as it came in: the exporter's output fix
    renames the input ``..._orig``; it is still the program's input, fed and compared."""
    ex = _exported("encoder_decoder_cache", "static")
    renamed = [i.name for i in ex.onx.graph.input if i.name.endswith("_orig")]
    assert renamed, "the export no longer renames inputs returned unchanged"
    _faithful(ex)


def _fault_named(ex: ExportedCase, kind: str, depth: str) -> None:
    kwargs = ex.kwargs()
    inputs = feeds(ex.onx, kwargs)
    reference = ort_outputs(ex.onx, inputs)
    picked = pick_fault(ex.onx, inputs, kind, depth, ("Softmax",), reference)
    assert picked is not None, f"no {kind} fault at {depth} changes the output"
    fault, bad = picked
    s = summarize(list(run_aligned(ex.ep, bad, (), ex.kwargs())), node_inputs=bad)
    assert s.verdict == "fail", s.to_text()
    assert named_correctly(s, bad, fault.target), (fault.what, s.to_text())


@pytest.mark.slow
@pytest.mark.parametrize(
    "name,dims",
    [
        ("encoder_decoder_cache", "dynamic"),
        ("static_cache", "dynamic"),
        # torch specializes a sliding layer's past length under Dim.DYNAMIC (the export
        # fails: "You marked L['past_key_values'][0].size()[2] as dynamic but your code
        # specialized it to be a constant"); Dim.AUTO exports it
        ("sliding_cache", "auto"),
        ("hybrid_cache", "auto"),
    ],
)
def test_every_cache_type_is_compared_with_dynamic_dims(name, dims):
    d = _faithful(_exported(name, dims))
    s = _faithful(_exported(name, "static"))
    assert d.coverage.torch_compared >= s.coverage.torch_compared, (
        d.coverage.to_text(),
        s.coverage.to_text(),
    )
    _fault_named(_exported(name, dims), "op", "middle")


@pytest.mark.parametrize("dims", ["static", "dynamic"])
def test_a_static_cache_decoder_is_prepared_by_the_reproduction(dims):
    """StaticCache writes into its inputs (``index_copy_`` at ``cache_position``, ``add_``
    on the cumulative length): the reproduction functionalizes the writes as the re-trace
    does, the model vouches for it, and the run (which says which preparation it used)
    compares every output, the written cache included, as it does on the re-trace."""
    from onnx_sbs_nb.align.run import AlignedRun
    from onnx_sbs_nb.align.source.prepare.prepared import PREPARED_REPRODUCED

    ex = _exported("static_cache", dims)
    run = AlignedRun(ex.ep, ex.onx, (), ex.kwargs())
    assert run.status.extra["program_source"] == PREPARED_REPRODUCED, run.status.extra.get(
        "program_detail"
    )
    specs = run.prepared.program.graph_signature.output_specs
    assert sum(s.kind.name == "USER_INPUT_MUTATION" for s in specs) == 6
    records = list(run)
    assert summarize(records).verdict == "pass"
    _outputs_paired(records, ex.onx)


@pytest.mark.slow
def test_a_value_the_program_returns_twice_is_paired_both_times():
    """Two sliding layers return the same length: the second is ``add_N_alias_<i>``."""
    ex = _exported("sliding_cache", "auto")
    aliases = [o.name for o in ex.onx.graph.output if "_alias_" in o.name]
    assert aliases, "the export no longer aliases a value returned twice"
    _faithful(ex)


def test_the_cache_leaves_pair_with_the_program_inputs_by_their_flattened_names():
    ex = _exported("dynamic_cache", "dynamic")
    placeholders = [n.name for n in ex.ep.graph.nodes if n.op == "placeholder"]
    leaves = torch.utils._pytree.tree_leaves(ex.kwargs()["past_key_values"])
    cache_inputs = [i.name for i in ex.onx.graph.input if i.name.startswith("past_key_values")]
    assert len(cache_inputs) == len(leaves) and set(cache_inputs) <= set(placeholders)
