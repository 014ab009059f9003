"""Models exported with ``torch.onnx.export(..., dynamo=True)`` run end to end in the
torch evaluator and match eager torch: tiny Llama, a ViT-style encoder, a ResNet-style CNN,
an LSTM and a GRU (random weights, built in code)."""

from __future__ import annotations

import warnings

import onnx
import pytest
import torch

from onnx_sbs_nb.evaluator.compiled import JIT_AFTER
from onnx_sbs_nb.evaluator.evaluator import TorchOnnxEvaluator, supported_ops

DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.cuda,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
        ],
    ),
]


def _export(model: torch.nn.Module, args: tuple, dynamic_shapes=None) -> onnx.ModelProto:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = torch.onnx.export(
            model, args, dynamo=True, dynamic_shapes=dynamic_shapes, verbose=False
        )
    return prog.model_proto


class TinyLlama(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        import transformers

        cfg = transformers.LlamaConfig(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            intermediate_size=128,
            vocab_size=100,
            max_position_embeddings=128,
        )
        self.model = transformers.LlamaForCausalLM(cfg).eval()

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids, use_cache=False).logits


class TinyViT(torch.nn.Module):
    def __init__(self, dim: int = 32, patch: int = 4, layers: int = 2) -> None:
        super().__init__()
        self.patch = torch.nn.Conv2d(3, dim, kernel_size=patch, stride=patch)
        self.cls = torch.nn.Parameter(torch.randn(1, 1, dim))
        self.pos = torch.nn.Parameter(torch.randn(1, 17, dim))
        layer = torch.nn.TransformerEncoderLayer(
            dim, nhead=4, dim_feedforward=64, dropout=0.0, batch_first=True, activation="gelu"
        )
        self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(dim)
        self.head = torch.nn.Linear(dim, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.patch(x).flatten(2).transpose(1, 2)
        p = torch.cat([self.cls.expand(p.shape[0], -1, -1), p], dim=1) + self.pos
        return self.head(self.norm(self.encoder(p))[:, 0])


class TinyResNet(torch.nn.Module):
    def __init__(self, c: int = 8) -> None:
        super().__init__()
        self.stem = torch.nn.Sequential(
            torch.nn.Conv2d(3, c, 3, padding=1, bias=False),
            torch.nn.BatchNorm2d(c),
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),
        )
        self.block = torch.nn.Sequential(
            torch.nn.Conv2d(c, c, 3, padding=1, bias=False),
            torch.nn.BatchNorm2d(c),
            torch.nn.ReLU(),
            torch.nn.Conv2d(c, c, 3, padding=1, bias=False),
            torch.nn.BatchNorm2d(c),
        )
        self.pool = torch.nn.AvgPool2d(2)
        self.up = torch.nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False)
        self.head = torch.nn.Linear(c, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        h = torch.relu(h + self.block(h))
        h = self.up(self.pool(h))
        h = torch.nn.functional.interpolate(h, scale_factor=0.5, mode="nearest")
        return self.head(torch.nn.functional.adaptive_avg_pool2d(h, 1).flatten(1))


class RNN(torch.nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        cls = torch.nn.LSTM if kind == "lstm" else torch.nn.GRU
        self.rnn = cls(8, 16, num_layers=2, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rnn(x)[0]


def _build(name: str):
    torch.manual_seed(0)
    if name.startswith("llama"):
        return TinyLlama(), (torch.randint(0, 100, (2, 8)),)
    if name == "vit":
        return TinyViT(), (torch.randn(2, 3, 16, 16),)
    if name == "resnet":
        return TinyResNet(), (torch.randn(2, 3, 16, 16),)
    return RNN(name), (torch.randn(2, 5, 8),)


_CACHE: dict[str, tuple] = {}


def _exported(name: str):
    """Exported once per session; Llama with dynamic batch and sequence (shape ops)."""
    if name not in _CACHE:
        model, args = _build(name)
        model.eval()
        dyn = None
        if name == "llama":
            dyn = (
                {
                    0: torch.export.Dim("batch", min=1, max=8),
                    1: torch.export.Dim("seq", min=2, max=64),
                },
            )
        _CACHE[name] = (model, args, _export(model, args, dynamic_shapes=dyn))
    return _CACHE[name]


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["llama", "vit", "resnet", "lstm", "gru"])
def test_model_matches_eager(name: str, device: str):
    model, args, onx = _exported(name)
    have = {(d, o) for d, o, _ in supported_ops()}
    missing = sorted({(n.domain, n.op_type) for n in onx.graph.node} - have - {("", "Constant")})
    assert not missing, f"ops without a kernel: {missing}"
    model = model.to(device)
    args = tuple(a.to(device) for a in args)
    with torch.no_grad():
        expected = model(*args)
    ev = TorchOnnxEvaluator(onx, device=device)
    feeds = dict(zip(ev.input_names, args))
    (got,) = ev.run(None, feeds)
    assert got.device.type == device
    # the generated code's inline forms and the kernels agree bit for bit
    plan = next(iter(ev._plans.values()))
    with torch.inference_mode():
        (by_kernels,) = plan.slow(list(args), ())
    assert torch.equal(got, by_kernels)
    assert device != "cpu" or plan.fast is not plan.slow  # forms were used, none fell back
    assert got.dtype == expected.dtype and got.shape == expected.shape
    # cuDNN may pick other (TF32) algorithms than eager on the GPU
    tol = 1e-4 if device == "cpu" else 2e-3
    torch.testing.assert_close(got, expected, atol=tol, rtol=tol)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["llama", "vit", "resnet", "lstm", "gru"])
def test_model_on_meta_reads_no_device_value_on_the_host(name: str):
    """The accelerator placement, checked without a GPU: on the meta device any read of a
    device value on the host (item, tolist, a 0-d index) raises, where on CUDA it would
    silently wait for the GPU. Weights and feeds are on "meta", shapes on the host."""
    model, args, onx = _exported(name)
    with torch.no_grad():
        expected = model(*args)
    ev = TorchOnnxEvaluator(onx, device="meta")
    for _ in range(3):  # the third run goes through the plan specialised on the shapes
        (got,) = ev.run(None, dict(zip(ev.input_names, [a.to("meta") for a in args])))
        assert got.device.type == "meta"
        assert got.shape == expected.shape and got.dtype == expected.dtype


@pytest.mark.slow
def test_static_llama_moves_to_torchscript():
    """Exported with static shapes, every node of the tiny Llama has an inline form: run
    often, the plan moves to TorchScript, with the kernels' results bit for bit."""
    model, args, onx = _exported("llama_static")
    ev = TorchOnnxEvaluator(onx)
    plan = next(iter(ev._plans.values()))
    assert plan.script is not None
    feeds = dict(zip(ev.input_names, args))
    before = [a.clone() for a in args]
    with torch.inference_mode():
        (by_kernels,) = plan.slow(list(args), ())
    for _ in range(JIT_AFTER + 3):
        (got,) = ev.run(None, feeds)
    assert plan.fast.__name__ == "run_scripted"
    assert torch.equal(got, by_kernels)
    # for these feeds' signature the TorchScript code writes dying values in place, the
    # softmax's NaN guard is one nan_to_num
    source = plan.fast.signature_source
    assert ".add_(" in source and ".mul_(" in source, source
    assert ".nan_to_num_(" in source and ".sqrt_()" in source, source
    for _ in range(3):  # the in-place code, run again: same bits, feeds untouched
        (again,) = ev.run(None, feeds)
        assert torch.equal(again, by_kernels)
    assert all(torch.equal(a, b) for a, b in zip(args, before))
    with torch.no_grad():
        torch.testing.assert_close(got, model(*args), atol=1e-4, rtol=1e-4)
    assert TorchOnnxEvaluator(onx, jit=False)._plans[tuple(ev.output_names)].script is None


@pytest.mark.slow
def test_llama_dynamic_shapes_second_run():
    """Exported with dynamic shapes: every shape runs right, and from the second run
    with a shape, through a plan specialised on it (shape computations folded), with
    the generic plan's results bit for bit; run often, that plan moves to TorchScript."""
    model, _, onx = _exported("llama")
    assert any(n.op_type == "Shape" for n in onx.graph.node)
    ev = TorchOnnxEvaluator(onx)
    generic = ev._plans[tuple(ev.output_names)]
    for shape, runs in [((2, 8), 3), ((3, 5), 2), ((1, 17), 1), ((2, 8), JIT_AFTER + 3)]:
        x = torch.randint(0, 100, shape)
        with torch.no_grad():
            expected = model(x)
        with torch.inference_mode():
            (by_kernels,) = generic.slow([x], ())
        for _ in range(runs):
            (got,) = ev.run(None, {ev.input_names[0]: x})
            assert torch.equal(got, by_kernels)
        torch.testing.assert_close(got, expected, atol=1e-4, rtol=1e-4)
    seen = next(iter(ev._specializer._seen.values()))
    plans = {sig[0][0]: plan for sig, plan in seen.items()}
    assert set(plans) == {(2, 8), (3, 5), (1, 17)} and isinstance(plans[(1, 17)], str)
    assert len(plans[(2, 8)].steps) < len(generic.steps)
    assert plans[(2, 8)].fast.__name__ == "run_scripted"


@pytest.mark.slow
def test_llama_with_accelerator_placement_on_cpu():
    """The placement pass an accelerator uses, exercised on CPU: shapes are host values,
    every Shape output is one, and the results do not change."""
    from onnx_sbs_nb.evaluator.compiler import Compiler

    model, _, onx = _exported("llama")
    opsets = {o.domain: o.version for o in onx.opset_import}
    compiler = Compiler(opsets, device=torch.device("cpu"), manage_placement=True)
    plan = compiler.compile_graph(onx.graph, top_level=True)
    shapes = [n.output[0] for n in onx.graph.node if n.op_type == "Shape"]
    assert shapes and all(plan.placement[s] == "h" for s in shapes)
    matmuls = [n.output[0] for n in onx.graph.node if n.op_type == "MatMul"]
    assert all(plan.placement[s] == "d" for s in matmuls)
    x = torch.randint(0, 100, (3, 7))
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(plan.execute([x])[0], expected, atol=1e-4, rtol=1e-4)


class CondModel(torch.nn.Module):
    """torch.cond exports an If whose branches read the weight from the outer scope."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 4))

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        def then_(x, y):
            return (x @ self.w + y).relu()

        def else_(x, y):
            return x - y * 2

        return torch.cond(x.sum() > 0, then_, else_, (x, y))


@pytest.mark.slow
def test_torch_cond_exports_if_with_outer_scope():
    torch.manual_seed(0)
    model = CondModel().eval()
    x, y = torch.randn(3, 4), torch.randn(3, 4)
    onx = _export(model, (x, y))
    assert any(n.op_type == "If" for n in onx.graph.node)
    ev = TorchOnnxEvaluator(onx)
    for sign in (1.0, -1.0):
        xs = x.abs() * sign
        (got,) = ev.run(None, dict(zip(ev.input_names, (xs, y))))
        with torch.no_grad():
            torch.testing.assert_close(got, model(xs, y))
