"""The models of the honest-answers corpus (tests/corpus/test_honest_answers.py), built in code with
random weights, and a table of what the run says on each case (scripts/corpus_report.py
--honest): verdict, culprit, why and coverage."""

from __future__ import annotations

import copy
import io
import warnings
from collections.abc import Callable

import onnx
import onnx.numpy_helper
import torch


def random_bn(model: torch.nn.Module) -> torch.nn.Module:
    # eval-mode BatchNorms far from identity: folding them changes the weights a lot
    torch.manual_seed(0)
    for m in model.modules():
        if isinstance(m, torch.nn.BatchNorm1d | torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
            m.bias.data.uniform_(-0.5, 0.5)
    return model


class _Block(torch.nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(c, c, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(c)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x))) + x


class CNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU()
        )
        self.blocks = torch.nn.Sequential(_Block(8), _Block(8))
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


class MLPBN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.bn = torch.nn.BatchNorm1d(16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


class Residual(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Sequential(torch.nn.Conv2d(4, 8, 1, bias=False), torch.nn.BatchNorm2d(8))
        self.b = torch.nn.Sequential(
            torch.nn.Conv2d(8, 4, 3, padding=1, bias=False), torch.nn.BatchNorm2d(4)
        )

    def forward(self, x):
        return torch.relu(x + self.b(torch.relu(self.a(x))))


class NanToNum64(torch.nn.Module):
    def forward(self, x):
        return torch.nan_to_num(torch.log(x), nan=0.0) * 2


class Floor64(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(torch.where(x > 0, x, torch.finfo(torch.float64).min), -1)


class Affine(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(8, 16)

    def forward(self, x):
        return torch.relu(self.fc(x)) * 2


class ConvOnly(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        return torch.relu(self.conv(x)) * 2


def with_nan(x: torch.Tensor) -> torch.Tensor:
    x = x.clone()
    x.view(-1)[0] = float("nan")
    return x


def changed(onx: onnx.ModelProto, name: str, delta: float) -> onnx.ModelProto:
    """The model with one element of initializer ``name`` moved by ``delta``."""
    m = copy.deepcopy(onx)
    init = next(i for i in m.graph.initializer if i.name == name)
    a = onnx.numpy_helper.to_array(init).copy()
    a.reshape(-1)[a.size // 2] += delta
    init.CopyFrom(onnx.numpy_helper.from_array(a, name))
    return m


def torchscript(model: torch.nn.Module, x: torch.Tensor) -> onnx.ModelProto:
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (x,), f, dynamo=False)
    return onnx.load_from_string(f.getvalue())


def few_off(expected: torch.Tensor, got: torch.Tensor) -> dict:
    """The user's own check: passes while at most one element in eight is off."""
    off = ((expected.double() - got.double()).abs() > 1e-3).double().mean().item()
    return {"passed": off <= 1 / 8, "off": off}


class Expm1(torch.nn.Module):
    def forward(self, x):
        return torch.expm1(x) * 3


def _export(model: torch.nn.Module, x: torch.Tensor):
    from tests.models import export

    torch.manual_seed(1)
    return export(random_bn(model), (x,))


def _line(emit: Callable[[str], None], case: str, records: list, onx: onnx.ModelProto) -> None:
    from onnx_sbs_nb.align.blame.summary import summarize

    s = summarize(records, node_inputs=onx)
    c = s.culprit
    cov = s.coverage
    head = s.verdict.upper() + (" (partial)" if s.partial else "")
    named = "-" if c is None else f"{c.label()} [{c.rule}]"
    counts = (
        ""
        if c is None or c.inputs_total is None
        else (f" fields: input {c.input_index}, {c.inputs_failing} of {c.inputs_total}")
    )
    folded = sum(1 for r in records if r.status == "weight_differs")
    emit(
        f"{case:<44} {head:<16} cov {cov.onnx_covered}/{cov.onnx_nodes}  "
        f"weight_differs {folded}  culprit: {named}{counts}"
    )
    if c is not None:
        emit(f"{'':<44} why: {c.why}")


def report(emit: Callable[[str], None]) -> None:
    """One line per case of the honest-answers corpus (and the culprit's why)."""
    from onnx_sbs_nb import run_aligned
    from onnx_sbs_nb.errors import SbsInputError

    gen = torch.Generator().manual_seed(1)
    torch.manual_seed(0)  # the models' weights: the same table each time
    models = {
        "cnn": (CNN(), torch.randn(2, 3, 16, 16, generator=gen)),
        "mlp_bn1d": (MLPBN(), torch.randn(6, 8, generator=gen)),
        "residual": (Residual(), torch.randn(2, 4, 8, 8, generator=gen)),
    }
    faults = {"cnn": "blocks.1.conv.bias", "mlp_bn1d": "fc1.bias", "residual": "b.0.weight"}
    emit("== honest answers (tests/corpus/honest.py)")
    for name, (model, x) in models.items():
        ep, onx = _export(model, x)
        _line(emit, f"{name}: NaN input", list(run_aligned(ep, onx, (with_nan(x),))), onx)
        many = [(torch.randn(x.shape, generator=gen),) for _ in range(10)]
        many[7] = (with_nan(many[7][0]),)
        _line(emit, f"{name}: NaN in 1 of 10", list(run_aligned(ep, onx, inputs=many)), onx)
        bad = changed(onx, faults[name], 0.05)
        for label, kw in (
            ("default", {}),
            ("own_error", {"own_error": True}),
            ("own_error snr>=30", {"own_error": True, "verdict": "snr>=30"}),
        ):
            recs = list(run_aligned(ep, bad, (x,), **kw))
            _line(emit, f"{name}: {faults[name]} +0.05, {label}", recs, bad)
        ts = torchscript(model, x)
        try:
            _line(emit, f"{name}: TorchScript export", list(run_aligned(ep, ts, (x,))), ts)
        except SbsInputError as e:  # no name in common: pairing it is issue 46's item 3
            emit(f"{name + ': TorchScript export':<44} refused: {e}")
    for model in (NanToNum64, Floor64):
        x = torch.rand(4, 8, dtype=torch.float64) + 0.5
        ep, onx = _export(model(), x)
        many = [(torch.rand(4, 8, dtype=torch.float64, generator=gen) + 0.5,) for _ in range(20)]
        _line(emit, f"{model.__name__}: 20 benign", list(run_aligned(ep, onx, inputs=many)), onx)
        t = many[11][0].clone()
        t[0, 0] = 0.0 if model is NanToNum64 else -1.0
        many[11] = (t,)
        recs = list(run_aligned(ep, onx, inputs=many))
        _line(emit, f"{model.__name__}: 1 of 20 triggers", recs, onx)
    for model, x, bias in ((Affine, torch.randn(6, 8), "fc.bias"),
                           (ConvOnly, torch.randn(1, 3, 8, 8), "conv.bias")):  # fmt: skip
        ep, onx = _export(model(), x)
        bad = changed(onx, bias, 0.5)
        recs = list(run_aligned(ep, bad, (x,), own_error=True, compare=few_off))
        _line(emit, f"{model.__name__}: compare=fn passes 1/8 off", recs, bad)
    x = torch.rand(4, 8)
    ep, onx = _export(Expm1(), x)
    many = [(torch.rand(4, 8, generator=gen) + 1,) for _ in range(20)]
    many[3], many[9] = (torch.full((4, 8), 1e-6),), (torch.full((4, 8), -2e-6),)
    recs = list(run_aligned(ep, onx, inputs=many, atol=1e-12, rtol=1e-5))
    _line(emit, "expm1 near 0: 2 of 20 (atol 1e-12, rtol 1e-5)", recs, onx)
