"""Deployment pipelines: what engineers do to an export before they ship it.

Each pipeline takes the faithful export of a corpus model and returns what the user runs
(issue 40): graph tools that drop the exporter's node metadata (onnxslim, onnxsim),
onnxscript's optimizer, a save with external data, onnxruntime's transformer fusions
(bert, gpt2 and unet model types: ``SkipLayerNormalization``, ``BiasGelu``,
``SkipSimplifiedLayerNormalization``...), float16 conversion with onnxconverter-common
(with and without ``keep_io_types``, and with a block list), and bfloat16.  Every part is
the real tool; models are the corpus's own, built in code with random weights.

Four architectures: an encoder (BERT), a decoder with its KV cache in and out (Llama,
dynamic batch and lengths), a diffusion block (time embedding, GroupNorm, self- and
cross-attention) and a conv net with BatchNorm (ResNet).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper
from torch import nn

from .zoo import ZooEntry


@dataclass
class Pipeline:
    name: str
    apply: Callable[[onnx.ModelProto, str], onnx.ModelProto]  # (model, folder) -> model
    what: str
    # architectures it applies to (None: all); onnxruntime's fusions are per model type
    archs: tuple[str, ...] | None = None
    # the pipeline's model is given to the engine by path (external data)
    by_path: bool = False
    notes: str = ""
    extra: dict = field(default_factory=dict)


def _slim(model: onnx.ModelProto, folder: str) -> onnx.ModelProto:
    import onnxslim

    return onnxslim.slim(model)


def _onnxsim(model: onnx.ModelProto, folder: str) -> onnx.ModelProto:
    import onnxsim

    simplified, ok = onnxsim.simplify(model)
    assert ok, "onnxsim could not check its result"
    return simplified


def _onnxscript_optimizer(model: onnx.ModelProto, folder: str) -> onnx.ModelProto:
    import onnxscript.optimizer

    return onnxscript.optimizer.optimize(model)


def _external_data(model: onnx.ModelProto, folder: str) -> onnx.ModelProto:
    path = os.path.join(folder, "model.onnx")
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # saving with external data rewrites the initializers it saves
    onnx.save_model(
        copy,
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="model.onnx.data",
    )
    return onnx.load(path, load_external_data=False)


def _fp16(keep_io_types: bool, block_ops: tuple[str, ...] = ()):
    def apply(model: onnx.ModelProto, folder: str) -> onnx.ModelProto:
        from onnxconverter_common import float16

        kw = {"op_block_list": list(block_ops)} if block_ops else {}
        return float16.convert_float_to_float16(model, keep_io_types=keep_io_types, **kw)

    return apply


def _ort_fusion(model_type: str, heads: int, hidden: int):
    def apply(model: onnx.ModelProto, folder: str) -> onnx.ModelProto:
        from onnxruntime.transformers.optimizer import optimize_model

        path = os.path.join(folder, "for_fusion.onnx")
        onnx.save(model, path)
        opt = optimize_model(
            path, model_type=model_type, num_heads=heads, hidden_size=hidden, opt_level=0
        )
        return opt.model

    return apply


def to_low_precision(
    model: onnx.ModelProto, elem_type: int = onnx.TensorProto.BFLOAT16, keep_io_types: bool = True
) -> onnx.ModelProto:
    """The graph computed in ``elem_type`` (bfloat16 or float16) where the ONNX schemas
    allow it, float32 elsewhere, the way converters do it: float initializers and
    constants stored in the low type, Casts to float retargeted, a Cast inserted where a
    node needs the other type, float32 kept at the graph's inputs and outputs with
    ``keep_io_types`` (onnxconverter-common has no bfloat16 converter, and its float16
    converter breaks a decoder whose Casts it does not retarget)."""
    from onnx import defs

    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    f32 = onnx.TensorProto.FLOAT
    low_name = helper.tensor_dtype_to_string(elem_type).replace("TensorProto.", "").lower()
    low_str = f"tensor({low_name})"
    opset = next((o.version for o in m.opset_import if o.domain in ("", "ai.onnx")), 18)
    types = {vi.name: vi.type.tensor_type.elem_type for vi in (*g.input, *g.value_info, *g.output)}
    for init in g.initializer:
        types[init.name] = init.data_type
    low: set[str] = set()
    for k, init in enumerate(g.initializer):
        if init.data_type == f32:
            g.initializer[k].CopyFrom(_low_tensor(init, elem_type))
            low.add(init.name)
    nodes: list[onnx.NodeProto] = []
    counter = [0]

    def cast(name: str, to: int) -> str:
        counter[0] += 1
        out = f"{name}__to{to}_{counter[0]}"
        nodes.append(helper.make_node("Cast", [name], [out], to=to, name=f"cast_{out}"))
        return out

    inputs_f32 = [i.name for i in g.input if i.type.tensor_type.elem_type == f32]
    renamed = {}
    for name in inputs_f32:
        if keep_io_types:
            renamed[name] = cast(name, elem_type)
            low.add(renamed[name])
        else:
            low.add(name)
    for node in g.node:
        node.input[:] = [renamed.get(i, i) for i in node.input]
        supports = node.domain in ("", "ai.onnx") and _allows(node, opset, low_str, defs)
        if node.op_type == "Cast":
            to = next(a for a in node.attribute if a.name == "to")
            if to.i == f32:
                to.i = elem_type
                low.update(node.output)
            nodes.append(node)
            continue
        if node.op_type in ("Constant", "ConstantOfShape"):
            for a in node.attribute:
                if a.name == "value" and a.t.data_type == f32:
                    a.t.CopyFrom(_low_tensor(a.t, elem_type))
                    low.update(node.output)
            nodes.append(node)
            continue
        for i, name in enumerate(node.input):
            if not name:
                continue
            if supports and types.get(name) == f32 and name not in low:
                node.input[i] = cast(name, elem_type)
            elif not supports and name in low:
                node.input[i] = cast(name, f32)
        nodes.append(node)
        if supports:
            low.update(o for o in node.output if types.get(o) == f32)
    outputs = {o.name for o in g.output}
    for o in g.output:
        if o.name in low and keep_io_types:
            # the producer writes a renamed low value, a Cast makes the float32 output
            inner = f"{o.name}__{low_name}"
            for n in nodes:
                n.output[:] = [inner if x == o.name else x for x in n.output]
                n.input[:] = [inner if x == o.name else x for x in n.input]
            nodes.append(
                helper.make_node("Cast", [inner], [o.name], to=f32, name=f"cast_out_{o.name}")
            )
            low.discard(o.name)
            low.add(inner)
        elif o.name in low:
            o.type.tensor_type.elem_type = elem_type
    for inp in g.input:
        if inp.name in low:
            inp.type.tensor_type.elem_type = elem_type
    del g.node[:]
    g.node.extend(nodes)
    kept = [vi for vi in g.value_info if vi.name not in outputs]
    for vi in kept:
        if vi.name in low:
            vi.type.tensor_type.elem_type = elem_type
    del g.value_info[:]
    g.value_info.extend(kept)
    return m


def _allows(node: onnx.NodeProto, opset: int, low_str: str, defs) -> bool:
    """Whether the node's schema takes the low float type wherever it takes float32."""
    try:
        schema = defs.get_schema(node.op_type, opset, "")
    except Exception:
        return False
    for c in schema.type_constraints:
        allowed = set(c.allowed_type_strs)
        if "tensor(float)" in allowed and low_str not in allowed:
            return False
    return True


def _low_tensor(t: onnx.TensorProto, elem_type: int) -> onnx.TensorProto:
    arr = numpy_helper.to_array(t)
    torch_dtype = torch.bfloat16 if elem_type == onnx.TensorProto.BFLOAT16 else torch.float16
    low = torch.from_numpy(np.array(arr, dtype=np.float32)).to(torch_dtype)
    new = helper.make_tensor(
        t.name, elem_type, list(arr.shape), low.view(torch.int16).numpy().tobytes(), raw=True
    )
    new.metadata_props.extend(t.metadata_props)
    return new


def _bf16(model: onnx.ModelProto, folder: str) -> onnx.ModelProto:
    return to_low_precision(model, onnx.TensorProto.BFLOAT16)


def _fp16_schema(model: onnx.ModelProto, folder: str) -> onnx.ModelProto:
    return to_low_precision(model, onnx.TensorProto.FLOAT16)


PIPELINES: list[Pipeline] = [
    Pipeline("onnxslim", _slim, "onnxslim.slim: folds, fuses MatMul+Add into Gemm, drops metadata"),
    Pipeline("onnxsim", _onnxsim, "onnxsim.simplify: constant folding, metadata dropped"),
    Pipeline("onnxscript_opt", _onnxscript_optimizer, "onnxscript.optimizer.optimize"),
    Pipeline("external_data", _external_data, "saved with external data, run by path", by_path=True),
    Pipeline("ort_bert", _ort_fusion("bert", 4, 32), "onnxruntime.transformers optimizer, bert",
             archs=("bert",)),
    Pipeline("ort_gpt2", _ort_fusion("gpt2", 4, 32), "onnxruntime.transformers optimizer, gpt2",
             archs=("llama_kv_cache",)),
    Pipeline("ort_unet", _ort_fusion("unet", 2, 16), "onnxruntime.transformers optimizer, unet",
             archs=("diffusion_block",)),
    Pipeline("fp16_keep_io", _fp16(True), "onnxconverter-common float16, keep_io_types=True"),
    Pipeline("fp16", _fp16(False), "onnxconverter-common float16, float16 inputs and outputs"),
    Pipeline("fp16_blocked", _fp16(True, ("Softmax", "Pow", "ReduceMean")),
             "float16 with an op block list (Softmax, Pow, ReduceMean stay float32)"),
    Pipeline("bf16", _bf16, "bfloat16 where the schemas allow it, float32 inputs and outputs"),
    Pipeline("fp16_schema", _fp16_schema,
             "float16 where the schemas allow it, Casts retargeted, float32 inputs and outputs"),
]  # fmt: skip
PIPELINES_BY_NAME = {p.name: p for p in PIPELINES}


# --------------------------------------------------------------------------- a diffusion block


class DiffusionBlock(nn.Module):
    """A UNet mid-block as latent diffusion models have it: a ResNet block with the time
    embedding added, GroupNorm and SiLU, then a transformer block over the pixels
    (self-attention, cross-attention to a text context, GEGLU feed-forward)."""

    def __init__(self, c: int = 16, ctx: int = 12, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.time = nn.Sequential(nn.Linear(8, c), nn.SiLU(), nn.Linear(c, c))
        self.norm1, self.conv1 = nn.GroupNorm(4, c), nn.Conv2d(c, c, 3, padding=1)
        self.norm2, self.conv2 = nn.GroupNorm(4, c), nn.Conv2d(c, c, 3, padding=1)
        self.norm3 = nn.LayerNorm(c)
        self.q, self.k, self.v, self.o = (nn.Linear(c, c, bias=False) for _ in range(4))
        self.norm4 = nn.LayerNorm(c)
        self.cq = nn.Linear(c, c, bias=False)
        self.ck, self.cv = nn.Linear(ctx, c, bias=False), nn.Linear(ctx, c, bias=False)
        self.co = nn.Linear(c, c)
        self.norm5 = nn.LayerNorm(c)
        self.ff1, self.ff2 = nn.Linear(c, 4 * c), nn.Linear(2 * c, c)
        for m in self.modules():  # biases and norms away from their identity init
            if isinstance(m, nn.GroupNorm | nn.LayerNorm):
                nn.init.uniform_(m.weight, 0.5, 1.5)
                nn.init.uniform_(m.bias, -0.2, 0.2)

    def _attend(self, q, k, v):
        b, n, c = q.shape
        h = self.heads
        q, k, v = (t.reshape(b, -1, h, c // h).transpose(1, 2) for t in (q, k, v))
        a = torch.softmax(q @ k.transpose(-1, -2) / (c // h) ** 0.5, dim=-1)
        return (a @ v).transpose(1, 2).reshape(b, n, c)

    def forward(self, x, t, context):
        half = torch.arange(4, dtype=torch.float32)
        freqs = torch.exp(-half * 2.3) * t[:, None]
        emb = self.time(torch.cat([freqs.sin(), freqs.cos()], dim=-1))
        h = self.conv1(torch.nn.functional.silu(self.norm1(x))) + emb[:, :, None, None]
        x = x + self.conv2(torch.nn.functional.silu(self.norm2(h)))
        b, c, hh, ww = x.shape
        s = x.flatten(2).transpose(1, 2)
        n = self.norm3(s)
        s = s + self.o(self._attend(self.q(n), self.k(n), self.v(n)))
        n = self.norm4(s)
        s = s + self.co(self._attend(self.cq(n), self.ck(context), self.cv(context)))
        a, gate = self.ff1(self.norm5(s)).chunk(2, dim=-1)
        s = s + self.ff2(a * torch.nn.functional.gelu(gate))
        return x + s.transpose(1, 2).reshape(b, c, hh, ww)


def _diffusion_block():
    return DiffusionBlock(), (torch.randn(1, 16, 4, 4), torch.tensor([3.0]), torch.randn(1, 5, 12))


DIFFUSION_BLOCK = ZooEntry(
    "diffusion_block", "UNet mid-block: time embedding, GroupNorm, self/cross-attention",
    _diffusion_block, attribute_ops=("Softmax", "GroupNormalization", "Conv"),
)  # fmt: skip

# the corpus models the pipelines run on (by zoo name; the diffusion block is defined here)
ARCHITECTURES = ("bert", "llama_kv_cache", "diffusion_block", "resnet")


def entry(name: str) -> ZooEntry:
    if name == DIFFUSION_BLOCK.name:
        return DIFFUSION_BLOCK
    from .evaluate import entry_by_name

    return entry_by_name(name)


def cases() -> list[tuple[str, str]]:
    """(architecture, pipeline) pairs the corpus runs."""
    return [
        (arch, p.name)
        for p in PIPELINES
        for arch in ARCHITECTURES
        if p.archs is None or arch in p.archs
    ]


def apply_pipeline(pipeline: Pipeline, model: onnx.ModelProto, folder: str | None = None):
    """The pipeline's model (or, for a pipeline that saves by path, the path)."""
    folder = folder or tempfile.mkdtemp(prefix=f"sbs-{pipeline.name}-")
    out = pipeline.apply(model, folder)
    if pipeline.by_path:
        return os.path.join(folder, "model.onnx")
    return out


# --------------------------------------------------------------------------- evaluation

# pipelines whose output for an architecture is a model onnxruntime refuses (a converter
# bug, not the export's): there the engine must name the node that cannot run
BROKEN = {
    ("llama_kv_cache", "fp16_keep_io"): "onnxconverter-common 1.16 leaves Casts to float32 "
    "whose outputs it declares float16 (the rotary embedding's positions)",
    ("llama_kv_cache", "fp16"): "the same converter bug",
    ("llama_kv_cache", "fp16_blocked"): "the same converter bug",
}
# pipelines that keep the exporter's metadata or values: coverage within 90% of the plain
# export's torch nodes compared (issue 40); onnxruntime's fusions make values internal
COVERAGE_FLOOR = 0.9
FUSIONS = ("ort_bert", "ort_gpt2", "ort_unet")


def model_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list | None:
    """Whole-model outputs: onnxruntime's, else (a node it has no CPU kernel for, such as
    the unet fusion's NhwcConv) the torch evaluator's."""
    from .faults import ort_outputs

    got = ort_outputs(model, feeds)
    if got is not None:
        return got
    from onnx_sbs_nb import TorchOnnxEvaluator

    try:
        sess = TorchOnnxEvaluator(model)
        out = sess.run(None, {k: torch.from_numpy(v) for k, v in feeds.items()})
    except Exception:
        return None
    return [o.float().numpy() if o.dtype == torch.bfloat16 else o.numpy() for o in out]


def feeds_for(model: onnx.ModelProto, args: tuple) -> dict[str, np.ndarray]:
    """The program's inputs as feeds of ``model``, cast to its float input types."""
    inits = {i.name for i in model.graph.initializer}
    inputs = [i for i in model.graph.input if i.name not in inits]
    flat = [a for a in torch.utils._pytree.tree_leaves(args) if isinstance(a, torch.Tensor)]
    feeds = {}
    for inp, a in zip(inputs, flat):
        elem = inp.type.tensor_type.elem_type
        if elem == onnx.TensorProto.FLOAT16:
            a = a.half()
        elif a.dtype == torch.bfloat16 or elem == onnx.TensorProto.BFLOAT16:
            a = a.float()
        feeds[inp.name] = a.detach().numpy()
    return feeds


def plant_fault(model: onnx.ModelProto, args: tuple, kind: str, depth: str, prefer=()):
    """(Fault, faulted model): the first fault of that kind and depth that changes the
    pipeline model's outputs (tests/corpus/faults.py's candidates)."""
    from .faults import candidates, outputs_differ

    feeds = feeds_for(model, args)
    reference = model_outputs(model, feeds)
    assert reference is not None, "the pipeline's model does not run"
    declared = [
        onnx.TensorProto.DataType.Name(o.type.tensor_type.elem_type).lower()
        for o in model.graph.output
    ]
    for k, fault in enumerate(candidates(model, kind, depth, prefer)):
        if k >= 30:
            break
        bad = fault.apply(model)
        got = model_outputs(bad, feeds)
        if got is not None and outputs_differ(reference, got, declared):
            return fault, bad
    raise LookupError(f"no {kind} fault at depth {depth} changes the outputs")


def saved_like(pipeline: Pipeline, model: onnx.ModelProto):
    """The model as the pipeline hands it to the user (a path for external data)."""
    if not pipeline.by_path:
        return model
    folder = tempfile.mkdtemp(prefix=f"sbs-{pipeline.name}-fault-")
    _external_data(model, folder)
    return os.path.join(folder, "model.onnx")


def loaded(model) -> onnx.ModelProto:
    """A pipeline's model in memory, its external weights read."""
    if isinstance(model, str):
        return onnx.load(model)
    return model
