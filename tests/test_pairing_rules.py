"""The pairing rules as a registry: each rule a class that runs alone on a context, the
tuples the pairings run, and each rule's strength read from its declaration."""

from __future__ import annotations

import functools

import numpy as np
import onnx
import pytest
import torch

from onnx_sbs_nb.align.pairing import names, onnx_pairing
from onnx_sbs_nb.align.pairing.basic_rules import ByPosition, SameName, StateDictName
from onnx_sbs_nb.align.pairing.context import PairingStep
from onnx_sbs_nb.align.pairing.fx_rules import ByMetadata
from onnx_sbs_nb.align.pairing.lowered_by import graph_outputs
from onnx_sbs_nb.align.pairing.names import FX_RULES, fx_pairing_context, pair_values
from onnx_sbs_nb.align.pairing.onnx_pairing import ONNX_RULES, pair_onnx_models
from onnx_sbs_nb.align.pairing.optimized import optimize_model
from onnx_sbs_nb.align.pairing.rules import RULES, proven_rules, rule
from onnx_sbs_nb.align.pairing.structure_rules import AroundPaired
from onnx_sbs_nb.records import (
    KIND_INPUT,
    KIND_OUTPUT,
    KIND_WEIGHT,
    PAIRED_BY_METADATA,
    PAIRED_BY_NAME,
    PAIRED_BY_POSITION,
    PAIRED_BY_STATE_DICT,
)

from .models import MLP, export


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
        self.declared = inner.declared

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
    return [*FX_RULES, *AroundPaired.rounds, *ONNX_RULES]


def test_every_rule_takes_its_name_and_strength_from_its_declaration():
    for step in _all_steps():
        assert step.declared is rule(step.name), step
        assert step.strength == step.declared.strength
        for cls in type(step).__mro__:
            if cls is not PairingStep:
                assert "name" not in vars(cls) and "strength" not in vars(cls), cls
    # every declaration has code, and the shared rules are the same in both pairings
    assert {r.name for r in RULES} == {s.name for s in FX_RULES}
    assert {SameName, StateDictName, ByPosition} <= {type(s) for s in ONNX_RULES}
    assert {s.name for s in _all_steps() if s.strength == "proven"} == proven_rules()


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
