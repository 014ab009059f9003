"""The exporter's preparation reproduced without a re-trace (align/source/prepare/: the
walk in reproduce.py, its decomposed calls traced in expansions.py), the check that decides
whether it is used (prepare/check.py), and the op decisions and disk cache it reads
(prepare/exporter_ops.py, align/source/disk_cache.py).

The reproduction is compared node for node with torch's private preparation function in
the installed torch: names, targets, arguments, recorded dtypes/shapes/strides, graph
signature and the user node each prepared node comes from.
"""

from __future__ import annotations

import copy
import json
import re
import warnings

import onnx
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from onnx_sbs_nb.align.pairing.names import pair_values
from onnx_sbs_nb.align.run import AlignedRun
from onnx_sbs_nb.align.source import disk_cache
from onnx_sbs_nb.align.source.fx_metadata import FxMetadata, fx_name_from_metadata, fx_node_text
from onnx_sbs_nb.align.source.prepare import exporter_ops
from onnx_sbs_nb.align.source.prepare.check import NodePrinter, disagreement
from onnx_sbs_nb.align.source.prepare.exporter import _exporter_prepare
from onnx_sbs_nb.align.source.prepare.prepared import PREPARED_BY_EXPORTER, PREPARED_REPRODUCED
from onnx_sbs_nb.align.source.prepare.program import prepare_program
from onnx_sbs_nb.align.source.prepare.reproduce import prepare_light
from onnx_sbs_nb.align.source.prepare.unsupported import Unsupported
from onnx_sbs_nb.align.source.provenance import program_provenance

from ...models import (
    Attention,
    CausalAttention,
    Cond,
    LlamaLogits,
    NonZero,
    ShapeOps,
    tiny_llama,
    tiny_llama_config,
)


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.down = nn.Conv2d(8, 4, 3, stride=2)

    def forward(self, x):
        return F.adaptive_avg_pool2d(self.down(F.relu(self.bn(self.conv(x)))), 1).flatten(1)


class MultiOutput(nn.Module):
    """List and tuple outputs, some unused (the re-trace unpacks every one)."""

    def forward(self, x):
        a, b = x.split(4, dim=-1)
        c = torch.chunk(x, 2, 1)
        v, idx = x.topk(3, -1)
        m, am = x.max(-1)
        return a * b + c[0] + v.sum() + idx.float().sum() + m.unsqueeze(-1) + am.unsqueeze(-1)


class Promotions(nn.Module):
    """Mixed dtypes: the exporter inserts explicit casts."""

    def forward(self, x, i):
        y = (x * i + i // 2).sum(-1, keepdim=True) + torch.where(x > 0, x, 0.5).mean()
        return y + (i > 1).float()


class SameInputs(nn.Module):
    """Decomposed calls that read the same value (std and var of one tensor), an
    einsum, a buffer and an embedding."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.register_buffer("offset", torch.arange(4.0))

    def forward(self, x, ids):
        y = self.emb(ids) + self.offset
        y = torch.cumsum(y, 1) + torch.einsum("bij,bkj->bik", y, y).sum(-1, keepdim=True)
        z = x.permute(0, 2, 1).contiguous().view(x.shape[0], -1)
        return y.flatten(1).sum(1) + z.std(1) + z.var(1) + F.log_softmax(z, 1).mean(1)


class Constants(nn.Module):
    """torch.tensor(...) inside forward: lift_fresh_copy and detach_ in the program."""

    def forward(self, x, idx):
        rows = torch.tensor([0, 1, 2, 3])
        out = torch.zeros(4, 8).scatter_add(1, idx, x)
        return out + x.new_zeros(4, 8).index_add(0, rows, x) + x.masked_fill(x > 0.5, 0.0)


class Recurrent(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.LSTM(8, 16, batch_first=True)

    def forward(self, x):
        return self.rnn(x)[0]


class DecomposedByFunction(nn.Module):
    """A CompositeImplicitAutograd op the exporter decomposes with a Python function
    rather than its kernel (``rms_norm`` -> ``_fused_rms_norm``: its epsilon stays the
    double it is given, where the kernel rounds it to float)."""

    def __init__(self):
        super().__init__()
        self.norm = nn.RMSNorm(8)
        self.bare = nn.RMSNorm(8, elementwise_affine=False, eps=1e-3)

    def forward(self, x):
        return self.bare(self.norm(x) * 2.0) + x


class InPlaceSteps(nn.Module):
    """Kernels with in-place steps (``clamp_min_``, ``sub_``...): the re-trace
    functionalizes them."""

    def forward(self, x, y):
        target = torch.sign(x[:, 0])
        return (
            F.cosine_similarity(x, y).sum()
            + F.margin_ranking_loss(x[:, 0], y[:, 0], target)
            + F.hinge_embedding_loss(x, torch.sign(y))
            + F.cosine_embedding_loss(x, y, target)
        )


class InPlaceOnIntermediates(nn.Module):
    """In-place calls on values the program made (HF's Falcon ``attn += ...``,
    Mixtral's ``routing_weights /= ...sum()``, a chain of two): the re-trace
    functionalizes them (``add_`` -> ``add``, later reads read the result)."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8))

    def forward(self, x, z):
        y = x @ self.w
        y.add_(z)
        v, i = y.topk(2, dim=-1)
        v.div_(v.sum(-1, keepdim=True))
        h = (x * 2).mul_(3).add_(1)
        return y + h, v * i


class ViewsOfWrittenValues(nn.Module):
    """Views of a value written in place, made before the write and after it (Mixtral's
    ``routing_weights /= ...sum()`` then ``.view(-1)``): functionalization makes each
    again where it is read, from the value as written."""

    def forward(self, x):
        y = x * 2
        flat = y.view(-1)
        y.add_(1)
        v, i = x.topk(2, -1)
        early = v.view(-1)
        v.div_(v.sum(-1, keepdim=True)).mul_(2)  # two writes into v's memory
        rows = early + v.view(-1)
        w = (x * 3).sum() + 1
        return flat.sum() + y, rows.unsqueeze(-1) * w, i


class InPlaceThroughAView(nn.Module):
    """A write through a view into the value it views."""

    def forward(self, x):
        y = x * 2
        y.view(-1).add_(1)
        return y + 1


class WritesIntoInputs(nn.Module):
    """A static KV cache's writes (transformers' StaticCache): ``index_copy_`` into a
    user input at the new positions, ``add_`` on a buffer and on an int64 length read
    through a ``.to()`` that converts nothing, then a ``repeat_kv`` of the written cache
    (unsqueeze, expand, reshape: views of a written value).  The re-trace functionalizes
    the writes and returns each written input's last value first."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8, 8))
        self.register_buffer("steps", torch.zeros(1))

    def forward(self, x, cache, pos, length):
        k = x @ self.w
        cache.index_copy_(1, pos, k)
        self.steps.add_(1)
        n = length.to(torch.int64)
        grown = n.add_(pos.shape[0])
        rep = cache.unsqueeze(2).expand(2, 6, 3, 8).reshape(2, 18, 8)
        return rep * self.steps, cache.sum(1), grown


class WriteIntoAnInputReadAfter(nn.Module):
    """A view of the input made before the write and read after it: declined."""

    def forward(self, x, cache):
        early = cache.view(-1)
        cache.add_(x)
        return early * 2


class WriteIntoAParameter(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4))

    def forward(self, x):
        with torch.no_grad():
            self.w.add_(1)
        return x * self.w


def _writes_into_inputs():
    return WritesIntoInputs(), (
        torch.randn(2, 3, 8),
        torch.randn(2, 6, 8),
        torch.tensor([1, 2, 4]),
        torch.tensor([3]),
    )


def _llama():
    torch.manual_seed(0)
    return LlamaLogits(tiny_llama_config(64, 2)), (torch.randint(0, 128, (1, 12)),)


MODELS = {
    "attention": lambda: (Attention(), (torch.randn(2, 5, 16),)),
    "causal_attention": lambda: (CausalAttention(), (torch.randn(2, 5, 16),)),
    "shape_ops": lambda: (ShapeOps(), (torch.randn(2, 3, 8),)),
    "conv_bn": lambda: (ConvBN(), (torch.randn(2, 3, 8, 8),)),
    "multi_output": lambda: (MultiOutput(), (torch.randn(4, 8),)),
    "promotions": lambda: (Promotions(), (torch.randn(3, 4), torch.randint(0, 4, (3, 4)))),
    "same_inputs": lambda: (SameInputs(), (torch.randn(2, 3, 4), torch.randint(0, 10, (2, 3)))),
    "constants": lambda: (Constants(), (torch.randn(4, 8), torch.randint(0, 8, (4, 8)))),
    "lstm": lambda: (Recurrent(), (torch.randn(2, 5, 8),)),
    "decomposed_by_function": lambda: (DecomposedByFunction(), (torch.randn(2, 5, 8),)),
    "in_place_steps": lambda: (InPlaceSteps(), (torch.randn(4, 8), torch.randn(4, 8))),
    "in_place_on_intermediates": lambda: (
        InPlaceOnIntermediates(),
        (torch.randn(4, 8), torch.randn(4, 8)),
    ),
    "writes_into_inputs": _writes_into_inputs,
}


def _export(model, args, dynamic_shapes=None):
    return torch.export.export(model.eval(), args, dynamic_shapes=dynamic_shapes)


@pytest.fixture(scope="module")
def exporter_prepare():
    """torch's own preparation (private; the function the exporter calls)."""
    from torch.onnx._internal.exporter import _core, _registration

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        registry = _registration.ONNXRegistry.from_torchlib()
    return lambda ep: _core._prepare_exported_program_for_export(ep, registry=registry)


_USERS = re.compile(r"\[num_users=\d+\] ")


def _value(v):
    if isinstance(v, torch.Tensor):
        return (v.dtype, tuple(v.shape), tuple(v.stride()))
    if isinstance(v, list | tuple):
        return [_value(x) for x in v]
    return type(v).__name__


def _user_node(node):
    """The user's node a prepared node comes from (the deepest from_node entry; a node
    without one is the user's node itself, under its own name)."""
    if node.op != "call_function":
        return None  # torch records artifacts of its re-trace on placeholders and outputs
    sources = node.meta.get("from_node") or []
    name = None if sources else node.name
    while sources:
        name, sources = sources[-1].name, sources[-1].from_node
    return name


def _describe(program):
    return (
        [
            (_USERS.sub("", n.format_node()), _value(n.meta.get("val")), _user_node(n))
            for n in program.graph.nodes
        ],
        str(program.graph_signature),
    )


def _same(ours, theirs):
    (a, sig_a), (b, sig_b) = _describe(ours), _describe(theirs)
    diff = [(x, y) for x, y in zip(a, b) if x != y]
    assert not diff and len(a) == len(b), diff[:3] or (len(a), len(b))
    assert sig_a == sig_b


@pytest.mark.parametrize("name", sorted(MODELS))
def test_reproduction_is_the_exporters_preparation(name, exporter_prepare):
    model, args = MODELS[name]()
    ours = prepare_light(_export(model, args), exporter_ops.exporter_ops())
    _same(ours, exporter_prepare(_export(model, args)))


def test_reproduction_of_a_tiny_llama(exporter_prepare):
    model, args = _llama()
    ours = prepare_light(_export(model, args), exporter_ops.exporter_ops())
    theirs = exporter_prepare(_export(model, args))
    _same(ours, theirs)
    # the decomposed ops are gone (to, reshape, __and__, diff) and their users renamed
    targets = {str(n.target) for n in ours.graph.nodes}
    assert "aten.bitwise_and.Tensor" in targets and "aten.reshape.default" not in targets


class Elementwise(nn.Module):
    """Ops the exporter lowers as they are: its preparation changes nothing."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(8))

    def forward(self, x):
        y = torch.sin(x) * self.scale
        return torch.relu(y) + torch.tanh(x) * 1.5


def test_a_program_the_preparation_keeps_runs_as_it_is(exporter_prepare):
    """Nothing to decompose, promote, rename or remove: the prepared program is the user's
    own graph, not a copy, and it is the exporter's preparation node for node."""
    args = (torch.randn(2, 8),)
    ep = _export(Elementwise(), args)
    ours = prepare_light(ep, exporter_ops.exporter_ops())
    assert ours.graph_module is ep.graph_module
    _same(ours, exporter_prepare(_export(Elementwise(), args)))


@pytest.mark.parametrize("change", ["renamed", "promoted", "decomposed", "provenance"])
def test_a_program_the_preparation_changes_is_copied(change, exporter_prepare):
    """One node the re-trace would treat differently is enough for the copy: the result
    is still the exporter's preparation, never the user's graph with a stale name."""
    args = (torch.randn(2, 8),)
    model = Elementwise()
    if change == "promoted":
        model, args = Promotions(), (torch.randn(3, 4), torch.randint(0, 4, (3, 4)))
    elif change == "decomposed":
        model, args = MultiOutput(), (torch.randn(4, 8),)

    def program():
        ep = _export(model, args)
        nodes = [n for n in ep.graph.nodes if n.op == "call_function"]
        if change == "renamed":
            nodes[0]._rename("my_sin")
            ep.graph_module.recompile()
        elif change == "provenance":
            nodes[1].meta["from_node"] = []
        return ep

    ep = program()
    ours = prepare_light(ep, exporter_ops.exporter_ops())
    assert ours.graph_module is not ep.graph_module
    _same(ours, exporter_prepare(program()))


def _symbolic(name):
    if name == "dynamic":
        batch = torch.export.Dim("batch")
        return CausalAttention(), (torch.randn(2, 5, 16),), ({0: batch},)
    from ...corpus.zoo import ZOO_BY_NAME
    from ...corpus.zoo_kv_cache_and_popular_exports import ZOO3_BY_NAME
    from ...corpus.zoo_vision_and_program_features import ZOO2_BY_NAME

    name, _, dims = name.partition("@")
    entry = {**ZOO_BY_NAME, **ZOO2_BY_NAME, **ZOO3_BY_NAME}[name]
    torch.manual_seed(0)
    model, args = entry.build()
    if dims != "auto":
        return model.eval(), args, entry.dynamic_shapes
    # every input's batch and sequence left to export (Dim.AUTO), as users export LLMs
    auto = torch.export.Dim.AUTO
    shapes = tuple({0: auto, 1: auto} if a.dim() >= 2 else None for a in args)
    return model.eval(), args, (shapes,)  # the corpus' models take *args


@pytest.mark.parametrize(
    "name",
    [
        "nonzero",
        "cond",
        "in_place_through_a_view",
        "write_into_an_input_read_after",
        "write_into_a_parameter",
        "dynamic",
    ],
)
def test_declined_programs(name, exporter_prepare):
    """What the reproduction declines (subgraphs, sizes the data decides; symbolic sizes
    without a model to take the names from), the exporter's preparation (with the table
    built from the cached op names) prepares exactly as torch's own function does."""
    if name != "dynamic":
        model, args, ds = {
            "nonzero": (NonZero(), (torch.randn(4, 3),), None),
            "cond": (Cond(), (torch.randn(2, 4),), None),
            "in_place_through_a_view": (InPlaceThroughAView(), (torch.randn(2, 4),), None),
            "write_into_an_input_read_after": (
                WriteIntoAnInputReadAfter(),
                (torch.randn(2, 4), torch.randn(2, 4)),
                None,
            ),
            "write_into_a_parameter": (WriteIntoAParameter(), (torch.randn(4),), None),
        }[name]
        with pytest.raises(Unsupported):
            prepare_light(_export(model, args, ds), exporter_ops.exporter_ops())
    else:
        model, args, ds = _symbolic(name)
        assert prepare_program(_export(model, args, ds)).source == PREPARED_BY_EXPORTER
    _same(_exporter_prepare(_export(model, args, ds)), exporter_prepare(_export(model, args, ds)))


def _call_text(node):
    return re.sub(r"^%[^ ]+ : (\[num_users=\d+\] )?", "", node.format_node())


def _calls(program, model=None):
    """The program's calls in order; with ``model``, as far as the model can tell: a node
    it describes or whose value it holds in full, a node only read by one it describes
    (its lowering folded away) by name, the rest left out."""
    described = read = None
    if model is not None:
        md = FxMetadata(model)
        described = {o for n in model.graph.node for o in n.output}
        described |= {i.name for i in model.graph.initializer} | set(md.names)
        read = {r for t in md.texts if t for r in re.findall(r"%([A-Za-z_][A-Za-z0-9_]*)", t)}

    def shown(n):
        if described is None or n.name in described:
            return _USERS.sub("", n.format_node()), _value(n.meta.get("val"))
        return n.name if n.name in read else None

    return [shown(n) for n in program.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize(
    "name",
    [
        "dynamic",
        "llama_kv_cache",
        "llama_dynamic",
        "dynamic_attention",
        "gpt2@auto",
        "bart@auto",
        "roberta@auto",
        "falcon@auto",
        "gemma@auto",
    ],
)
def test_symbolic_sizes_are_reproduced_under_the_models_names(name, exporter_prepare):
    """Where sizes are symbolic the re-trace numbers its nodes after shape arithmetic it
    drops again (``add_43`` for the reproduction's ``add``): the reproduction takes the
    names the model gives the same calls, and is then the exporter's preparation node
    for node, names included.  The models exported with ``Dim.AUTO`` each hold a case:
    ``gpt2``'s ``diff`` computes sizes the re-trace recomputes from the inputs'
    (``insert_deferred_runtime_asserts``); ``llama_dynamic`` and ``bart`` build masks
    from look-alike ``unsqueeze`` chains the model folds in part (a name is only taken by
    a node of its op, names kept as built first); ``roberta`` holds a value no
    description reads (its node keeps its name); ``falcon`` writes in place; one of
    ``gemma``'s calls finds a size through another's input, and is traced alone."""
    model, args, ds = _symbolic(name)
    ep = _export(model, args, ds)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onx = torch.onnx.export(ep, args, dynamo=True).model_proto
    as_built = prepare_light(ep, exporter_ops.exporter_ops())
    theirs = exporter_prepare(_export(model, args, ds))
    assert _calls(as_built) != _calls(theirs)
    prepared = prepare_program(ep, onx)
    assert prepared.source == PREPARED_REPRODUCED, prepared.detail
    assert disagreement(prepared.program, onx) is None
    assert _calls(prepared.program, onx) == _calls(theirs, onx)
    # renamed, each node still says which node of the user's graph it computes
    described = set(FxMetadata(onx).names)
    users = [
        {k: v.user_name for k, v in program_provenance(p.graph, ep.graph).items() if k in described}
        for p in (prepared.program, theirs)
    ]
    # (the re-trace loses the user's name of the size reads the reproduction keeps, and
    # claims one by coincidence where its own numbering lands on a user's name: its
    # ``sym_size_int_11`` reads dimension 1, the user's reads dimension 0)
    user_calls = {n.name: _call_text(n) for n in ep.graph.nodes}
    retrace_calls = {n.name: _call_text(n) for n in theirs.graph.nodes}
    claims = {
        k: v
        for k, v in users[1].items()
        if v is not None and (k != v or user_calls.get(v) == retrace_calls.get(k))
    }
    assert claims.items() <= users[0].items()
    # the re-trace lists non-persistent buffers after lifted constants: the same inputs
    assert sorted(str(prepared.program.graph_signature).splitlines()) == sorted(
        str(theirs.graph_signature).splitlines()
    )


def test_views_of_written_values_are_made_where_they_are_read(exporter_prepare):
    """A view of a value written in place reads the written value: the reproduction makes
    it where it is read, from the value as written (as functionalization does), takes
    the model's names for it, and computes what the program computes."""
    torch.manual_seed(0)
    model, x = ViewsOfWrittenValues(), torch.randn(3, 5)
    ep = _export(model, (x,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onx = torch.onnx.export(ep, (x,), dynamo=True).model_proto
    prepared = prepare_program(ep, onx)
    assert prepared.source == PREPARED_REPRODUCED, prepared.detail
    assert _calls(prepared.program, onx) == _calls(exporter_prepare(_export(model, (x,))), onx)
    with torch.no_grad():
        for ours, eager in zip(prepared.program.module()(x), model(x)):
            torch.testing.assert_close(ours, eager)


def _expansions(monkeypatch, ep, fresh_sizes=True, concrete=True):
    """The expansions ``prepare_light`` traces for ``ep`` and the make_fx traces it took;
    ``fresh_sizes=False`` gives every input the program's own size objects;
    ``concrete=False`` traces every call with symbolic sizes."""
    from onnx_sbs_nb.align.source.prepare import expansions, reproduce

    traces, found = [], {}
    trace_calls, trace_expansions = expansions._trace_calls, reproduce.trace_expansions

    def counted(unique, ops, functional=False, generic=frozenset()):
        traces.append(len(unique))
        return trace_calls(unique, ops, functional, generic)

    def kept(*a):
        found.update(trace_expansions(*a))
        return found

    monkeypatch.setattr(expansions, "_trace_calls", counted)
    monkeypatch.setattr(reproduce, "trace_expansions", kept)
    if not fresh_sizes:
        monkeypatch.setattr(expansions, "_fresh_size", lambda v: v)
    if not concrete:
        monkeypatch.setattr(expansions, "_size_free_call", lambda n: False)
    prepare_light(ep, exporter_ops.exporter_ops())
    return found, traces


def test_symbolic_calls_are_traced_together(monkeypatch):
    """Each traced input gets sizes of its own, so every decomposed call of a symbolic
    program is traced in one make_fx, reading its sizes from its own inputs; with shared
    sizes a call reads another's, and the calls that do are traced again one by one, to
    the same expansions."""
    model, args, ds = _symbolic("llama_kv_cache")
    ep = _export(model, args, ds)
    together, traces = _expansions(monkeypatch, ep)
    assert len(together) >= 10 and traces == [len(together)]
    # a reshape reads its sizes from its own inputs: the expansion's view takes them
    reshapes = [e for k, e in together.items() if "reshape" in k[0]]
    assert reshapes and all(
        any(getattr(a, "kind", None) == "in" for a in e.nodes[-1][1][1]) for e in reshapes
    )
    monkeypatch.undo()
    one_by_one, traces = _expansions(monkeypatch, ep, fresh_sizes=False)
    # only the calls that read another's sizes are traced again, alone
    assert traces[0] == len(together) and 1 <= len(traces[1:]) < len(together)
    assert set(traces[1:]) == {1}
    assert _plain(one_by_one) == _plain(together)


class SizeFreeAndSized(torch.nn.Module):
    """``to`` and ``&`` make one node whatever the sizes; ``flatten`` views with a size the
    input's symbolic sizes compute."""

    def forward(self, x, m):
        return x.to(torch.float64), (m & (x > 0)).flatten(1), x.reshape(x.shape[0], -1)


def test_size_free_calls_are_traced_on_concrete_sizes(monkeypatch):
    """A call of a symbolic program whose expansion is one node reading no size (``to``,
    ``&``) is traced on its example's sizes, the rest symbolically: the same expansions,
    shapes included, as tracing all of them with symbolic sizes; one whose concrete trace
    bakes in a size (``flatten``) is traced again symbolically."""
    from onnx_sbs_nb.align.source.prepare import expansions

    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
    args = (torch.randn(3, 4, 5), torch.rand(3, 4, 5) > 0.5)
    ep = _export(SizeFreeAndSized(), args, ({0: batch, 1: seq}, {0: batch, 1: seq}))
    generic, rejected = [], []
    size_free, size_free_expansion = expansions._size_free_call, expansions._size_free_expansion

    def rejects(expansion, node):
        kept = size_free_expansion(expansion, node)
        if kept is None:
            rejected.append(node.name)
        return kept

    monkeypatch.setattr(
        expansions, "_size_free_call", lambda n: size_free(n) and not generic.append(n.name)
    )
    monkeypatch.setattr(expansions, "_size_free_expansion", rejects)
    mixed, _ = _expansions(monkeypatch, ep)
    assert any(n.startswith("to") for n in generic) and any("and" in n for n in generic)
    assert [n for n in rejected if "flatten" not in n] == [] and rejected, (generic, rejected)
    monkeypatch.undo()
    symbolic, _ = _expansions(monkeypatch, ep, concrete=False)
    assert _plain(mixed) == _plain(symbolic)
    flatten = next(e for k, e in mixed.items() if "flatten" in k[0])
    assert len(flatten.nodes) > 1  # the size it views with is computed from the input's


def _plain(expansions):
    """Expansions without their fake values (which compare as tensors), but with their
    shapes."""
    return {
        key: (
            [(t, a, k, str(getattr(m["val"], "shape", m["val"]))) for t, a, k, m in e.nodes],
            e.output,
        )
        for key, e in expansions.items()
    }


# ------------------------------------------------------------------ the check
@pytest.fixture(scope="module")
def llama():
    ep, onx, args = tiny_llama()
    return ep, onx, args


def test_the_engine_pairs_with_the_reproduction_as_with_the_retrace(llama):
    """AlignedRun prepares with the reproduction; the records are those of a run on the
    exporter's re-traced program (same pairs, same verdicts, same errors)."""
    ep, onx, args = llama
    run = AlignedRun(ep, onx, args)
    assert run.prepared.source == PREPARED_REPRODUCED, run.prepared.detail
    assert run.status.extra["program_source"] == PREPARED_REPRODUCED
    retraced = prepare_program(ep)  # no model: the exporter's preparation
    assert retraced.source == PREPARED_BY_EXPORTER

    class WithProgram:  # what torch.onnx.export returns: the model and its program
        model_proto = onx
        exported_program = retraced.program

    def rows(records):
        # in one order: a second run of this program (stretches) may list a value only
        # torch computes earlier
        return sorted(
            ((r.ep_name, r.onnx_name, r.paired_by, r.status, r.err_abs) for r in records), key=str
        )

    ours = rows(run)
    assert ours == rows(AlignedRun(ep, WithProgram(), args))
    assert sum(1 for r in ours if r[2] != "unpaired") >= 100


def _fx_metadata(node: onnx.NodeProto) -> onnx.StringStringEntryProto | None:
    return next((p for p in node.metadata_props if p.key == "pkg.torch.onnx.fx_node"), None)


def test_a_model_that_disagrees_gets_the_exporters_preparation(llama):
    ep, onx, _ = llama
    reproduced = prepare_program(ep, onx)
    assert reproduced.source == PREPARED_REPRODUCED
    assert disagreement(reproduced.program, onx) is None

    changed = copy.deepcopy(onx)
    entry = next(
        _fx_metadata(n) for n in changed.graph.node if n.op_type == "Mul" and _fx_metadata(n)
    )
    entry.value = entry.value.replace("aten.mul.Tensor", "aten.div.Tensor")
    why = disagreement(reproduced.program, changed)
    assert why and "differs" in why
    prepared = prepare_program(ep, changed)
    assert prepared.source == PREPARED_BY_EXPORTER and "differs" in prepared.detail

    renamed = copy.deepcopy(onx)
    entry = next(_fx_metadata(n) for n in renamed.graph.node if _fx_metadata(n))
    entry.value = entry.value.replace("%", "%not_a_node_", 1)
    assert "missing" in disagreement(reproduced.program, renamed)

    bare = copy.deepcopy(onx)
    for n in bare.graph.node:
        del n.metadata_props[:]
    assert "no fx node metadata" in disagreement(reproduced.program, bare)


def test_a_folded_constant_of_another_shape_disagrees(llama):
    ep, onx, _ = llama
    program = prepare_program(ep, onx).program
    nodes = {n.name for n in program.graph.nodes if n.op == "call_function"}
    changed = copy.deepcopy(onx)
    init = next(i for i in changed.graph.initializer if i.name in nodes)
    init.dims.insert(0, 1)
    assert "ONNX value" in disagreement(program, changed)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_the_check_prints_nodes_as_format_node_does(name, exporter_prepare):
    """The preparation check prints fx nodes itself (format_node is a third of a cold
    run's check); every node of the prepared programs prints the same, and the fast
    printing is the one used (a torch that printed otherwise would turn it off)."""
    model, args = MODELS[name]()
    program = exporter_prepare(_export(model, args))
    node_text = NodePrinter()
    for node in program.graph.nodes:
        assert node_text(node) == node.format_node(), node.name
    assert node_text._trusted is True


def test_the_check_falls_back_to_format_node_where_it_prints_otherwise():
    graph = torch.fx.Graph()
    x = graph.placeholder("x")
    typed = graph.call_function(torch.ops.aten.sin.default, (x,))
    typed.type = torch.Tensor  # printed with its type: format_node's own path
    odd = graph.call_function(torch.ops.aten.mul.Tensor, (typed, torch.ones(2)))
    graph.output((odd,))
    node_text = NodePrinter()
    assert node_text(typed) == typed.format_node()
    assert node_text(odd) == odd.format_node()  # a tensor argument
    assert node_text._trusted is None  # neither was printed by the fast path
    node_text._trusted = False  # what a torch printing differently leaves
    plain = graph.call_function(torch.ops.aten.cos.default, (x,))
    assert node_text(plain) == plain.format_node()


def test_node_metadata_is_read_once_for_every_step(llama):
    ep, onx, _ = llama
    metadata = FxMetadata(onx)
    assert metadata.texts == [fx_node_text(n) for n in onx.graph.node]
    assert metadata.names == [fx_name_from_metadata(n) for n in onx.graph.node]
    assert metadata.texts is metadata.texts and any(metadata.names)
    program = prepare_program(ep, onx).program
    assert disagreement(program, onx, metadata) is None
    weights = {s.arg.name: s.target for s in program.graph_signature.input_specs if s.target}
    inputs = [n.name for n in program.graph.nodes if n.op == "placeholder"][-1:]
    with_reading = pair_values(program.graph, onx, weights, inputs, None, metadata)
    alone = pair_values(program.graph, onx, weights, inputs)
    assert with_reading.by_onnx == alone.by_onnx and len(alone) > 50


def test_declined_program_says_why():
    """A size the data decides: the exporter prepares, the run says why, and pairs as well."""
    x = torch.randn(4, 3)
    ep = _export(NonZero(), (x,), None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onx = torch.onnx.export(ep, (x,), dynamo=True, verbose=False).model_proto
    prepared = prepare_program(ep, onx)
    assert prepared.source == PREPARED_BY_EXPORTER
    assert "data-dependent" in prepared.detail
    run = AlignedRun(ep, onx, (x,))
    assert "data-dependent" in run.status.extra["program_detail"]
    assert not [r for r in run if r.failed]


# ------------------------------------------------------------------ op decisions, disk cache
def test_exporter_ops_from_json_rejects_what_is_not_ours():
    ops = exporter_ops.exporter_ops()
    assert exporter_ops.ExporterOps.from_json(ops.to_json()) == ops
    for bad in (
        None,
        [],
        {"format": 99},
        {**ops.to_json(), "python": "aten.add.Tensor"},
        {**ops.to_json(), "cia": [1, 2]},
        {**ops.to_json(), "format": "1"},
        # a function may only be looked up in torch's own registries
        {**ops.to_json(), "cia_functions": [["aten.rms_norm.default", "os"]]},
        {**ops.to_json(), "cia_functions": [["aten.rms_norm.default"]]},
        {**ops.to_json(), "cia_functions": None},
    ):
        assert exporter_ops.ExporterOps.from_json(bad) is None


def test_exporter_ops_decisions():
    ops = exporter_ops.exporter_ops()
    aten = torch.ops.aten
    assert not ops.decomposes(aten.add.Tensor)  # torchlib has it
    assert not ops.decomposes(aten.linear.default)  # a CIA op with an ONNX function: kept
    assert ops.decomposes(aten.reshape.default)  # CIA, not functional: always decomposed
    assert ops.decomposes(aten.diff.default)
    assert not ops.decomposes("not an op")
    # decomposed with torch's Python function, not with its kernel
    overrides = ops.cia_overrides()
    assert (
        overrides[aten._fused_rms_norm.default]
        is torch._decomp.decomposition_table[aten._fused_rms_norm.default]
    )
    # a Python kernel the op already has is what the trace runs: nothing to override
    assert aten.one_hot.default not in overrides and ops.decomposes(aten.one_hot.default)


def test_op_names_resolve_to_ops_only():
    assert exporter_ops._resolve("aten.add.Tensor") is torch.ops.aten.add.Tensor
    for name in ("os.system.call", "aten.add", "aten..Tensor", "__import__.os.x", "a.b.c.d"):
        assert exporter_ops._resolve(name) is None


def test_exporter_ops_are_read_from_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(disk_cache.ENV_DIR, str(tmp_path))
    monkeypatch.setattr(exporter_ops, "_LOADED", None)
    doctored = exporter_ops.ExporterOps(frozenset({"aten.add.Tensor"}), frozenset(), frozenset())
    name = f"exporter-ops-{disk_cache.versions()}.json"
    assert disk_cache.write_json(name, doctored.to_json())
    assert exporter_ops.exporter_ops() == doctored
    assert exporter_ops.exporter_ops().decomposes(torch.ops.aten.add.Tensor)


@pytest.mark.slow
def test_a_broken_cache_file_is_recomputed(tmp_path, monkeypatch):
    monkeypatch.setenv(disk_cache.ENV_DIR, str(tmp_path))
    monkeypatch.setattr(exporter_ops, "_LOADED", None)
    name = f"exporter-ops-{disk_cache.versions()}.json"
    (tmp_path / name).write_text('{"format": 1, "python": [')
    ops = exporter_ops.exporter_ops()
    assert "aten.diff.default" in ops.table_names()
    assert exporter_ops.ExporterOps.from_json(json.loads((tmp_path / name).read_text())) == ops


def test_disk_cache_round_trip_and_refusals(tmp_path, monkeypatch):
    monkeypatch.setenv(disk_cache.ENV_DIR, str(tmp_path / "cache"))
    assert disk_cache.read_json("absent.json") is None
    assert disk_cache.write_json("a.json", {"x": [1, 2]})
    assert disk_cache.read_json("a.json") == {"x": [1, 2]}
    assert list((tmp_path / "cache").iterdir()) == [tmp_path / "cache" / "a.json"]  # no temp
    for bad in ("../a.json", "a/b.json", ".hidden.json", "a b.json"):
        assert not disk_cache.write_json(bad, 1)
        assert disk_cache.read_json(bad) is None
    assert not disk_cache.write_json("nan.json", float("nan"))  # only strict JSON
    (tmp_path / "cache" / "bad.json").write_text("{not json")
    assert disk_cache.read_json("bad.json") is None
    monkeypatch.setattr(disk_cache, "MAX_BYTES", 4)
    assert disk_cache.read_json("a.json") is None
    monkeypatch.setenv(disk_cache.ENV_DIR, "")  # off
    assert disk_cache.cache_dir() is None and not disk_cache.write_json("b.json", 1)
