"""The pairing rules as a registry: each rule a class that runs alone on a context, the
tuples the pairings run (the program's, two models', one model on two devices, the graph
onnxruntime deploys), and each rule's name and strength declared once."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
import torch

from onnx_sbs_nb import run_aligned
from onnx_sbs_nb.align.devices import run_onnx_on_two_devices
from onnx_sbs_nb.align.pairing import deployed, names, onnx_pairing, same_model
from onnx_sbs_nb.align.pairing import rules as rules_module
from onnx_sbs_nb.align.pairing.basic_rules import ByPosition, SameName, StateDictName
from onnx_sbs_nb.align.pairing.deployed import DEPLOYED_RULES
from onnx_sbs_nb.align.pairing.fx_rules import ByMetadata
from onnx_sbs_nb.align.pairing.lowered_by import graph_outputs
from onnx_sbs_nb.align.pairing.names import FX_RULES, fx_pairing_context, pair_values
from onnx_sbs_nb.align.pairing.onnx_pairing import ONNX_RULES, pair_onnx_models
from onnx_sbs_nb.align.pairing.optimized import optimize_model
from onnx_sbs_nb.align.pairing.rules import (
    PAIRED_BY_METADATA,
    PAIRED_BY_NAME,
    PAIRED_BY_POSITION,
    PAIRED_BY_STATE_DICT,
    RULES,
    NameRule,
    PairingStep,
    RenamedRule,
    proven_rules,
    rule,
    rule_names,
)
from onnx_sbs_nb.align.pairing.same_model import SAME_MODEL_RULES
from onnx_sbs_nb.align.pairing.structure_rules import AroundPaired
from onnx_sbs_nb.records import (
    KIND_INPUT,
    KIND_OUTPUT,
    KIND_WEIGHT,
    STATUS_UNPAIRED_EP,
    UNPAIRED,
)

from ...models import MLP, export


@functools.cache
def mlp():
    torch.manual_seed(0)
    x = torch.randn(3, 8)
    ep, onx = export(MLP(), (x,))
    weights = {s.arg.name: s.target for s in ep.graph_signature.input_specs if s.target}
    return ep, onx, weights


@functools.cache
def optimized_mlp() -> onnx.ModelProto:
    return optimize_model(mlp()[1], "all").model


def _context():
    ep, onx, weights = mlp()
    return fx_pairing_context(ep.graph, onx, weights, ["x"])


def test_state_dict_rule_alone_pairs_each_weight_with_its_numbers():
    ep, onx, weights = mlp()
    ctx = _context()
    made = StateDictName().pair(ctx)
    assert made == len(ctx.pairing) == len(weights) == 6
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in onx.graph.initializer}
    state = ep.state_dict
    for pair in ctx.pairing.by_onnx.values():
        assert pair.rule == PAIRED_BY_STATE_DICT and pair.kind == KIND_WEIGHT
        np.testing.assert_array_equal(
            inits[pair.onnx_name], state[weights[pair.fx_name]].detach().numpy()
        )


def test_metadata_rule_alone_finds_what_the_names_say():
    """Without the name rule before it, the metadata rule pairs each computed value with
    the ONNX value the exporter named after the same fx node."""
    ctx = _context()
    made = ByMetadata().pair(ctx)
    pairs = list(ctx.pairing.by_onnx.values())
    assert made == len(pairs) >= 5
    assert all(p.rule == PAIRED_BY_METADATA and p.onnx_name == p.fx_name for p in pairs)


def test_position_rule_alone_pairs_the_graph_inputs_and_outputs():
    ep, onx, _ = mlp()
    ctx = _context()
    assert ByPosition().pair(ctx) == 2
    output = graph_outputs(ep.graph)[0]
    assert {(p.onnx_name, p.fx_name, p.rule) for p in ctx.pairing.by_onnx.values()} == {
        ("x", "x", PAIRED_BY_POSITION),
        (onx.graph.output[0].name, output, PAIRED_BY_POSITION),
    }
    ctx.mark_outputs()
    assert ctx.pairing.by_onnx["x"].kind == KIND_INPUT
    assert ctx.pairing.by_onnx[onx.graph.output[0].name].kind == KIND_OUTPUT


class _Recording(PairingStep):
    def __init__(self, inner: PairingStep, log: list[PairingStep]):
        self.inner, self.log = inner, log

    def pair(self, ctx) -> int:
        self.log.append(self.inner)
        return self.inner.pair(ctx)


@pytest.mark.parametrize(
    "module, registry, run",
    [
        (names, "FX_RULES", lambda: pair_values(mlp()[0].graph, mlp()[1], mlp()[2], ["x"])),
        (onnx_pairing, "ONNX_RULES", lambda: pair_onnx_models(mlp()[1], optimized_mlp())),
    ],
)
def test_a_pairing_runs_its_registry_in_order(module, registry, run, monkeypatch):
    rules = getattr(module, registry)
    want = run()
    assert len(want) >= 6
    log: list[PairingStep] = []
    monkeypatch.setattr(module, registry, tuple(_Recording(r, log) for r in rules))
    got = run()
    assert log == list(rules)
    assert got.by_onnx == want.by_onnx and list(got.by_onnx) == list(want.by_onnx)


def test_every_pair_names_a_rule_of_the_registry():
    pairing = pair_values(mlp()[0].graph, mlp()[1], mlp()[2], ["x"])
    assert {p.rule for p in pairing.by_onnx.values()} == {PAIRED_BY_NAME, PAIRED_BY_STATE_DICT}
    assert {p.rule for p in pairing.by_onnx.values()} <= {r.name for r in FX_RULES}


def _all_steps() -> list[PairingStep]:
    return [
        *FX_RULES,
        *AroundPaired.rounds,
        *ONNX_RULES,
        *SAME_MODEL_RULES,
        *DEPLOYED_RULES,
    ]


_DECLARED = ("name", "strength", "links_models", "doc", "caveat")


def test_every_rule_takes_its_name_and_strength_from_its_one_declaration():
    """A rule's name, strength, link and caveat are written once, on its class in
    rules.py; the rules as code derive from it and write none of them."""
    for step in _all_steps():
        declaring = [c for c in type(step).__mro__ if "name" in vars(c)]
        assert declaring == [rule(step.name)], step
        assert declaring[0] in RULES
        for cls in type(step).__mro__:
            if cls not in (PairingStep, declaring[0], object):
                assert not set(_DECLARED) & set(vars(cls)), cls
    # every declaration has code, and the shared rules are the same in every pairing
    assert {r.name for r in RULES} == {s.name for s in _all_steps()}
    assert len({r.name for r in RULES}) == len(RULES)
    assert {SameName, StateDictName, ByPosition} <= {type(s) for s in ONNX_RULES}
    assert {type(s) for s in SAME_MODEL_RULES} == {SameName}
    assert {s.name for s in _all_steps() if s.strength == "proven"} == proven_rules()


def test_no_module_spells_a_rule_name_of_its_own():
    """The values of paired_by are not declared again as string constants (records.py
    had PAIRED_BY_*): the names in rules.py are read from the rule classes."""
    import ast
    from pathlib import Path

    import onnx_sbs_nb
    import onnx_sbs_nb.records as records

    assert not [k for k in vars(records) if k.startswith("PAIRED_BY_")]
    assert rules_module.PAIRED_BY_NAME is NameRule.name
    root = Path(onnx_sbs_nb.__file__).parent
    bad = []
    for path in root.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Assign) or not isinstance(node.value, ast.Constant):
                continue
            if node.value.value not in rule_names():
                continue
            for t in node.targets:
                spelled = ast.unparse(t)
                if spelled.startswith("PAIRED_BY") or (
                    spelled == "name" and path.name != "rules.py"
                ):
                    bad.append(f"{path.relative_to(root)}:{node.lineno} {spelled}")
    assert not bad, bad


def test_every_paired_by_of_a_run_names_a_registered_rule():
    """The records of a run, a two-device run and an optimized run say which rule of the
    registry paired them (or that nothing did)."""
    ep, onx, _ = mlp()
    x = torch.randn(3, 8)
    runs = {
        "program": run_aligned(ep, onx, (x,)),
        "two devices": run_onnx_on_two_devices(
            onx, {"x": x}, reference=("onnxruntime", "cpu"), candidate=("torch", "cpu")
        ),
        "optimized": run_aligned(ep, onx, (x,), optimize="all"),
    }
    for label, run in runs.items():
        seen = {r.paired_by for r in run}
        assert seen <= rule_names() | {UNPAIRED}, (label, seen)
        assert seen & rule_names(), label


def test_two_devices_pair_through_the_registry(monkeypatch):
    """The two-device pairing is the name rule of the registry run on the model against
    itself: without it in SAME_MODEL_RULES, nothing pairs."""
    onx = mlp()[1]
    pairing = same_model.same_model_pairing(onx)
    g = onx.graph
    want = [i.name for i in g.input] + [o for n in g.node for o in n.output if o]
    assert list(pairing.by_onnx) == want
    assert {p.rule for p in pairing.by_onnx.values()} == {NameRule.name}
    assert pairing.by_onnx["x"].kind == KIND_INPUT
    assert pairing.by_onnx[g.output[0].name].kind == KIND_OUTPUT
    monkeypatch.setattr(same_model, "SAME_MODEL_RULES", ())
    assert len(same_model.same_model_pairing(onx)) == 0


def test_values_onnxruntime_renamed_pair_by_the_renamed_rule(monkeypatch):
    """optimize=: a float16 value onnxruntime computes anew in float32 pairs through the
    registry's renamed rule, which its record names; without the rule it is unpaired."""
    from ...quant_models import exported

    ep, onx, args = exported("mlp16")
    recs = list(run_aligned(ep, onx, args, optimize="basic"))
    renamed = {r.ep_name: r for r in recs if r.paired_by == RenamedRule.name}
    assert set(renamed) == {"linear", "relu"}
    assert all(
        "paired through it (its original paired by name)" in r.comment for r in renamed.values()
    )
    assert rule(RenamedRule.name).strength == "guess"
    monkeypatch.setattr(deployed, "DEPLOYED_RULES", ())
    recs = list(run_aligned(ep, onx, args, optimize="basic"))
    assert not [r for r in recs if r.paired_by == RenamedRule.name]
    assert {"linear", "relu"} <= {r.ep_name for r in recs if r.status == STATUS_UNPAIRED_EP}


def test_pair_and_pairing_are_imported_from_where_they_live():
    """``Pair``/``Pairing`` live in pairs.py: no module reaches them through another
    (names.py was a hub imported for them alone)."""
    import ast
    from pathlib import Path

    import onnx_sbs_nb

    root = Path(onnx_sbs_nb.__file__).parent
    tests = Path(__file__).parent
    bad = []
    for path in [*root.rglob("*.py"), *tests.rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom):
                continue
            names = {a.name for a in node.names} & {"Pair", "Pairing"}
            if names and not (node.module or "").endswith("pairs"):
                bad.append(f"{path.relative_to(root.parent)}: from {node.module} import {names}")
    assert not bad, "\n".join(bad)


def test_every_pairing_module_is_under_700_lines():
    """names.py and optimized.py were hubs of several concepts: the pairing wing stays
    in small modules, one concept each."""
    from pathlib import Path

    import onnx_sbs_nb.align.pairing as pkg

    sizes = {
        p.name: len(p.read_text().splitlines()) for p in Path(pkg.__file__).parent.glob("*.py")
    }
    assert max(sizes.values()) < 700, sizes


def test_a_culprits_why_reads_what_its_pairing_rule_says():
    """certainty (the summary's why) takes a rule's caveat from the registry: structure
    says it is a likely pairing; the other registered rules add nothing; a name no rule
    has is a pairing nothing proves."""
    from onnx_sbs_nb.align.blame.certainty import certainty
    from onnx_sbs_nb.align.pairing.rules import StructureRule
    from onnx_sbs_nb.records import Record

    def why(paired_by: str) -> str:
        return certainty(Record(step=0, paired_by=paired_by), 10, 10, False)

    assert "a likely pairing, not a proven one" in why(StructureRule.name)
    assert why(StructureRule.name) == StructureRule.caveat
    for name in rule_names() - {StructureRule.name}:
        assert why(name) == "", name
    assert why(UNPAIRED) == ""
    assert "which nothing proves" in why("a_rule_nobody_declared")
