"""The model users ship (issue 40): corpus models after deployment pipelines.

For each (architecture, pipeline) of tests/corpus/pipelines.py, with the real tools
(onnxslim, onnxsim, onnxscript's optimizer, external data, onnxruntime's bert/gpt2/unet
fusions, onnxconverter-common's float16 with and without keep_io_types and a block list,
a schema-aware float16/bfloat16 conversion):

- the faithful pipeline passes with nothing named, and compares at least 90% of the
  torch nodes the unprocessed export compares (fusions: reported, values they make
  internal cannot be compared);
- three faults planted after the pipeline (a weight, an attribute, a swapped op) are
  each named;
- where the tool itself breaks the model (onnxruntime refuses it), the run is no pass and
  names the node that cannot run.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from tests.corpus.evaluate import _bad_records, fault_plan  # noqa: E402
from tests.corpus.naming import named_correctly, what_summary_names  # noqa: E402
from tests.corpus.pipelines import (  # noqa: E402
    ARCHITECTURES,
    BROKEN,
    COVERAGE_FLOOR,
    FUSIONS,
    PIPELINES_BY_NAME,
    apply_pipeline,
    cases,
    entry,
    loaded,
    plant_fault,
    saved_like,
)
from tests.corpus.zoo import export_entry  # noqa: E402

pytestmark = pytest.mark.corpus


class PipelineSession:
    """Exports each architecture once, runs each pipeline once, each case once."""

    def __init__(self) -> None:
        self._exported: dict = {}
        self._models: dict = {}
        self._runs: dict = {}

    def exported(self, arch: str):
        if arch not in self._exported:
            self._exported[arch] = export_entry(entry(arch))
        return self._exported[arch]

    def model(self, arch: str, pipeline: str):
        key = (arch, pipeline)
        if key not in self._models:
            ex = self.exported(arch)
            self._models[key] = apply_pipeline(PIPELINES_BY_NAME[pipeline], ex.onx)
        return self._models[key]

    def run(self, arch: str, pipeline: str, fault: tuple[str, str] | None = None):
        key = (arch, pipeline, fault)
        if key not in self._runs:
            from onnx_sbs_nb import run_aligned
            from onnx_sbs_nb.align.blame.summary import summarize

            ex = self.exported(arch)
            if pipeline == "plain":
                model = ex.onx
            else:
                model = self.model(arch, pipeline)
            injected = None
            if fault is not None:
                picked, bad = plant_fault(loaded(model), ex.args, *fault, ex.entry.attribute_ops)
                injected = picked
                model = saved_like(PIPELINES_BY_NAME[pipeline], bad)
            records = list(run_aligned(ex.ep, model, ex.args, own_error=True))
            proto = loaded(model)
            summary = summarize(records, node_inputs=proto)
            self._runs[key] = (records, summary, proto, injected)
        return self._runs[key]


@pytest.fixture(scope="session")
def pipelines() -> PipelineSession:
    return PipelineSession()


CASES = [pytest.param(a, p, id=f"{a}-{p}") for a, p in cases() if (a, p) not in BROKEN]
FAULTS = [
    pytest.param(a, p, kind, depth, id=f"{a}-{p}-{kind}-{depth}")
    for i, (a, p) in enumerate(cases())
    if (a, p) not in BROKEN
    for kind, depth in fault_plan(i)
]


def test_the_corpus_is_what_the_issue_asks_for():
    """At least 10 pipelines on at least 4 architectures (encoder, decoder with a cache,
    diffusion block, conv net)."""
    used = {p for _, p in cases()}
    assert len(used) >= 10 and len(ARCHITECTURES) >= 4
    assert {"bert", "llama_kv_cache", "diffusion_block", "resnet"} <= set(ARCHITECTURES)


@pytest.mark.parametrize("arch,pipeline", CASES)
def test_faithful_pipeline_passes_and_compares_what_the_export_does(pipelines, arch, pipeline):
    records, summary, _, _ = pipelines.run(arch, pipeline)
    bad = _bad_records(records)
    assert not bad, "\n".join(b.line() for b in bad[:8]) + "\n" + summary.to_text()
    assert summary.verdict == "pass", summary.to_text()
    assert summary.culprit is None, summary.to_text()
    assert not summary.partial, summary.to_text()
    plain = pipelines.run(arch, "plain")[1].coverage
    got = summary.coverage
    share = got.torch_compared / plain.torch_compared
    print(f"{arch} {pipeline}: {got.to_text()} ({share:.0%} of the plain export's)")
    if pipeline not in FUSIONS:
        assert share >= COVERAGE_FLOOR, (
            f"{arch} after {pipeline}: {got.torch_compared} torch nodes compared, the plain "
            f"export {plain.torch_compared}\n{summary.to_text()}"
        )


@pytest.mark.parametrize("arch,pipeline,kind,depth", FAULTS)
def test_fault_planted_after_the_pipeline_is_named(pipelines, arch, pipeline, kind, depth):
    try:
        _, summary, proto, fault = pipelines.run(arch, pipeline, (kind, depth))
    except LookupError as e:
        pytest.skip(str(e))  # no such fault changes this small model's outputs
    named = what_summary_names(summary, proto)
    assert summary.verdict == "fail", f"{fault.what}\n{summary.to_text()}"
    assert named_correctly(summary, proto, fault.target), (
        f"{arch} after {pipeline}: injected {fault.what} [{fault.op_type} {fault.target}]; "
        f"named {named.label() if named else 'nothing'}\n{summary.to_text()}"
    )


@pytest.mark.parametrize("arch,pipeline", [pytest.param(*k, id="-".join(k)) for k in BROKEN])
def test_a_model_the_tool_broke_is_no_pass_and_its_broken_node_is_named(pipelines, arch, pipeline):
    import onnxruntime as ort

    model = pipelines.model(arch, pipeline)
    with pytest.raises(Exception, match="Type Error"):
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    _, summary, _, _ = pipelines.run(arch, pipeline)
    assert summary.verdict == "fail", summary.to_text()
    assert summary.culprit is not None and summary.culprit.rule == "error", summary.to_text()
    assert "Type Error" in summary.culprit.why


def test_a_fused_node_is_named_with_the_fx_nodes_it_computes(pipelines):
    """onnxruntime's gpt2 fusion makes one SkipSimplifiedLayerNormalization of a residual
    add and an RMSNorm, with no exporter metadata: the culprit is that node, in its own
    lowering (not the embedding's, which a walk up the residual stream reaches), fusing
    the add and the norm's fx nodes by the user's names."""
    from onnx_sbs_nb import run_aligned
    from onnx_sbs_nb.align.blame.summary import summarize
    from tests.corpus.faults import copy_model

    ex = pipelines.exported("llama_kv_cache")
    model = loaded(pipelines.model("llama_kv_cache", "ort_gpt2"))
    fused = [n.name for n in model.graph.node if n.op_type == "SkipSimplifiedLayerNormalization"]
    assert len(fused) >= 2
    bad = copy_model(model)
    node = next(n for n in bad.graph.node if n.name == fused[1])
    next(a for a in node.attribute if a.name == "epsilon").f = 0.5
    records = list(run_aligned(ex.ep, bad, ex.args, own_error=True))
    culprit = summarize(records, node_inputs=bad).culprit
    assert culprit is not None and culprit.onnx_node == fused[1]
    assert culprit.onnx_nodes == [fused[1]], culprit.onnx_nodes
    user = {n.name: str(n.target) for n in ex.ep.graph.nodes}
    computed = [user[name] for name in culprit.fuses.split(", ")]
    for op in ("add", "pow", "mean", "rsqrt", "mul"):
        assert any(f"aten.{op}" in t for t in computed), (op, culprit.fuses)
    assert culprit.ep_user_name in culprit.fuses.split(", ")
    assert "fusing " + culprit.fuses.split(", ")[0] in culprit.label()
    # each fused norm is its own lowering: the fx node its (first) value pairs with
    norms = [r for r in records if r.onnx_op_type == "SkipSimplifiedLayerNormalization"]
    first = {r.onnx_node_name: r.ep_name for r in norms if r.onnx_id_output == 0}
    assert len(first) == len(fused)
    assert all(r.onnx_fx_node == first[r.onnx_node_name] for r in norms), [
        (r.onnx_node_name, r.onnx_id_output, r.ep_name, r.onnx_fx_node)
        for r in norms
        if r.onnx_fx_node != first[r.onnx_node_name]
    ]


def test_two_models_pair_a_fused_node_by_the_name_it_kept(pipelines):
    """onnx-sbs diff of an export against its onnxruntime-fused twin: a fused node (no
    metadata, another op) keeps the value name the exporter gave after its fx node, so
    it is compared, and a fault inside it is named there, not at its first consumer."""
    from onnx_sbs_nb import run_aligned_onnx
    from onnx_sbs_nb.align.blame.summary import summarize
    from tests.corpus.faults import copy_model

    ex = pipelines.exported("llama_kv_cache")
    original = loaded(ex.onx)
    model = loaded(pipelines.model("llama_kv_cache", "ort_gpt2"))
    fused = [n for n in model.graph.node if n.op_type == "SkipSimplifiedLayerNormalization"]
    faithful = list(run_aligned_onnx(original, model, ex.args))
    compared = {r.onnx_node_name for r in faithful if r.status == "ok"}
    assert {n.name for n in fused} <= compared, sorted({n.name for n in fused} - compared)
    assert summarize(faithful, node_inputs=model).verdict == "pass"
    bad = copy_model(model)
    node = next(n for n in bad.graph.node if n.name == fused[1].name)
    next(a for a in node.attribute if a.name == "epsilon").f = 0.5
    culprit = summarize(list(run_aligned_onnx(original, bad, ex.args)), node_inputs=bad).culprit
    assert culprit is not None and culprit.onnx_node == fused[1].name, culprit
