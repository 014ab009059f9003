"""The rough edges a new user meets (issue 48): each test is one of the rows."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import onnx
import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "onnx", "onnxruntime", "numpy")


# ---- the command line answers --help and argument errors before torch loads ------------


@pytest.mark.parametrize(
    "argv",
    [
        ["--help"],
        ["run", "--help"],
        ["diff", "--help"],
        ["precision", "--help"],
        ["run", "--atol", "x"],
        ["bogus"],
        [],
        ["run", "missing.pt2", "missing.onnx", "missing.pt"],
        ["diff", "a_missing.onnx", "b_missing.onnx", "--inputs", "x_missing.pt"],
    ],
)
def test_help_and_argument_errors_import_no_torch(argv):
    # structural, not timed: the console script's entry, in a fresh process
    code = (
        "import sys\n"
        "from onnx_sbs_nb.__main__ import main\n"
        f"sys.argv = ['onnx-sbs', *{argv!r}]\n"
        "rc = main()\n"
        f"print('RC', rc, 'HEAVY', [m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    last = out.stdout.strip().splitlines()[-1]
    expected_rc = 0 if "--help" in argv else 2
    assert last == f"RC {expected_rc} HEAVY []", (out.stdout, out.stderr)


def test_a_command_that_runs_imports_the_engine_before_the_collector_is_tuned():
    from onnx_sbs_nb.cli import startup as cli

    assert cli.runs_a_command(["demo", "-o", "x"])
    assert not cli.runs_a_command(["--help"])
    assert not cli.runs_a_command(["run", "--atol", "x"])
    # a missing file is said before torch loads too (main says which)
    assert not cli.runs_a_command(["run", "no.pt2", "no.onnx", "no.pt"])


# ---- save_culprit_bundle takes what run_aligned returns ---------------------------------


class _TwoStage(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(6, 8)
        self.b = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


def _export(model: torch.nn.Module, args: tuple) -> tuple[Any, onnx.ModelProto]:
    ep = torch.export.export(model.eval(), args)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onx = torch.onnx.export(ep, args, dynamo=True, verbose=False).model_proto
    return ep, onx


@pytest.fixture(scope="module")
def planted():
    """A Tanh exported as a Sigmoid: the culprit is that one node."""
    torch.manual_seed(0)
    x = torch.randn(3, 6)
    ep, onx = _export(_TwoStage(), (x,))
    next(n for n in onx.graph.node if n.op_type == "Tanh").op_type = "Sigmoid"
    return ep, onx, x


def test_save_culprit_bundle_takes_what_run_aligned_returns(planted, tmp_path):
    from onnx_sbs_nb import run_aligned, save_culprit_bundle

    ep, onx, x = planted
    bundle = save_culprit_bundle(run_aligned(ep, onx, (x,)), tmp_path / "fresh")
    assert bundle is not None and bundle.reproduced and bundle.nodes == 1
    # partly consumed: the rest is computed first, the bundle is the same
    stream = run_aligned(ep, onx, (x,))
    next(stream)
    again = save_culprit_bundle(stream, tmp_path / "partly")
    assert again is not None and again.node == bundle.node
    assert stream.records and stream.status.finished
    # many inputs through run_aligned(inputs=...): the input showing it
    many = save_culprit_bundle(run_aligned(ep, onx, inputs=[(x,), (x + 1,)]), tmp_path / "many")
    assert many is not None and many.input_index is not None and many.reproduced


def test_save_culprit_bundle_runs_a_run_not_yet_iterated(planted, tmp_path):
    from onnx_sbs_nb import AlignedRun, save_culprit_bundle

    ep, onx, x = planted
    run = AlignedRun(ep, onx, (x,))
    bundle = save_culprit_bundle(run, tmp_path)  # was None: no records, no culprit
    assert bundle is not None and bundle.reproduced
    assert run.status.finished and run.records


def test_save_culprit_bundle_of_records_says_what_to_pass(planted, tmp_path):
    from onnx_sbs_nb import AlignedRun, run_aligned, save_culprit_bundle
    from onnx_sbs_nb.errors import SbsInputError

    ep, onx, x = planted
    records = list(run_aligned(ep, onx, (x,)))
    with pytest.raises(SbsInputError, match=r"records \(a list\).*pass the run itself"):
        save_culprit_bundle(records, tmp_path)
    with pytest.raises(SbsInputError, match="pass the run itself"):
        save_culprit_bundle(iter(records), tmp_path)
    run = AlignedRun(ep, onx, (x,))
    it = iter(run)
    next(it)
    with pytest.raises(SbsInputError, match="still being iterated"):
        save_culprit_bundle(run, tmp_path)
    assert not any(tmp_path.iterdir())


# ---- one meaning of inputs= everywhere --------------------------------------------------


def test_a_list_of_inputs_is_many_inputs_in_the_widget_as_in_run_aligned(planted):
    from onnx_sbs_nb import SbsWidget, run_aligned

    ep, onx, x = planted
    many = [(x,), (x + 1,)]
    stream = run_aligned(ep, onx, inputs=many)
    assert stream.run.status.extra["inputs_total"] == 2
    w = SbsWidget(ep, onx, inputs=many)  # was: "takes 1 input(s) (x) but 2 were given"
    assert w.session.inputs["total"] == 2
    w.session.start()
    w.session.wait()
    assert w.session.inputs["done"] == 2
    # one input stays one input: a tuple of tensors, a list of tensors
    assert SbsWidget(ep, onx, (x,)).session.inputs is None
    assert SbsWidget(ep, onx, [x]).session.inputs is None


def test_a_tuple_of_inputs_says_how_to_pass_several(planted):
    from onnx_sbs_nb import AlignedRun
    from onnx_sbs_nb.errors import SbsInputError

    ep, onx, x = planted
    with pytest.raises(SbsInputError, match=r"but 2 were given.*inputs=\[\(x1,\), \(x2,\)\]"):
        AlignedRun(ep, onx, ((x,), (x + 1,)))


# ---- --compare-func module:fn finds the module of the current folder --------------------


def test_compare_func_module_is_found_in_the_current_folder(tmp_path):
    (tmp_path / "mycheck_rough.py").write_text(
        "def rowwise(expected, got):\n    return {'passed': True}\n"
    )
    # as the console script runs: neither '' nor the current folder on sys.path
    code = (
        "import os, sys\n"
        "sys.path[:] = [p for p in sys.path if p not in ('', os.getcwd())]\n"
        "from onnx_sbs_nb.cli.main import build_parser\n"
        "from onnx_sbs_nb.notebook.run_args import options_from_args\n"
        "args = build_parser().parse_args(['run', 'a', 'b', 'c', "
        "'--compare-func', 'mycheck_rough:rowwise'])\n"
        "fn = options_from_args(args).compare\n"
        "print('FOUND', fn.__module__, fn.__name__, os.getcwd() in sys.path)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert "FOUND mycheck_rough rowwise False" in out.stdout, out.stderr[-2000:]


# ---- the public API as the README names it ----------------------------------------------


def test_supported_ops_as_the_readme_says():
    import onnx_sbs_nb
    from onnx_sbs_nb import TorchOnnxEvaluator, supported_ops

    ops = supported_ops()
    assert ("", "Add", 7) in ops or any(o[:2] == ("", "Add") for o in ops)
    x = onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])
    y = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)])
    ev = TorchOnnxEvaluator(model, custom_kernels={("my.domain", "Mine"): lambda a: a})
    assert set(ops) <= set(ev.supported_ops())
    assert ("my.domain", "Mine", 1) in ev.supported_ops()
    assert "supported_ops" in onnx_sbs_nb.__all__


def test_dir_lists_the_lazy_public_api():
    code = (
        "import sys, onnx_sbs_nb\n"
        "names = dir(onnx_sbs_nb)\n"
        "missing = [n for n in onnx_sbs_nb.__all__ if n not in names]\n"
        "print('MISSING', missing, 'TORCH', 'torch' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    assert "MISSING [] TORCH False" in out.stdout, out.stderr[-2000:]


def _readme_block(tag: str) -> str:
    """The README's python block under ``<!-- readme-test: tag -->``, dedented."""
    import re
    import textwrap

    text = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(rf"<!-- readme-test: {tag} -->\s*```python\n(.*?)```", text, re.S)
    assert m, f"README has no block tagged {tag}"
    return textwrap.dedent(m.group(1))


def test_the_readmes_quantized_models_block_runs_as_written(tmp_path, monkeypatch, capsys):
    """The README's quantization block, run as printed: the quantized model passes as
    quantization noise and the advice prints as text (not a dataclass's repr)."""
    from onnxruntime.quantization import CalibrationDataReader

    from .models import MLP

    torch.manual_seed(0)
    model = MLP().eval()
    calibration = [torch.randn(8, 8) for _ in range(8)]
    x = calibration[0]
    ep = torch.export.export(model, (x,))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onx = torch.onnx.export(ep, (x,), dynamo=True, verbose=False)

    class Reader(CalibrationDataReader):
        def __init__(self):
            name = onx.model_proto.graph.input[0].name
            self.feeds = iter({name: c.numpy()} for c in calibration)

        def get_next(self):
            return next(self.feeds, None)

    monkeypatch.chdir(tmp_path)
    namespace = {"ep": ep, "onx": onx, "x": x, "calibration": calibration, "reader": Reader()}
    exec(compile(_readme_block("quantized"), "README.md", "exec"), namespace)
    out = capsys.readouterr().out
    assert "verdict: PASS" in out and "quantization noise:" in out, out
    assert "quantization advice" in out and "QuantizationAdvice(" not in out, out


def test_the_readmes_generation_block_runs_as_written(capsys):
    pytest.importorskip("transformers")
    from onnx_sbs_nb import SbsWidget

    from .corpus.cache_decoders import export_case

    case = export_case("dynamic_cache", "dynamic")
    namespace = {"ep": case.ep, "onx": case.onx, "kwargs": case.kwargs()}
    block = _readme_block("generation").replace("steps=32", "steps=4")  # the same, shorter
    exec(compile(block, "README.md", "exec"), namespace)
    out = capsys.readouterr().out
    assert out.startswith("generation parity: PASS over 4 steps"), out
    # the notebook line under the block
    w = SbsWidget(records=namespace["parity"], decode=lambda t: f"<{t}>")
    sides = {side["name"]: side for side in w.timeline["sides"]}
    assert sides and all(side["text"] for side in sides.values()), w.timeline
    assert w.timeline["parted_at"] is None


# ---- "own error" only where an own-error rerun measured it -----------------------------


def test_the_culprit_says_error_unless_an_own_error_run_measured_it(planted):
    from onnx_sbs_nb import AlignedRun, summarize
    from onnx_sbs_nb.reports.html import _culprit_html

    ep, onx, x = planted
    plain = summarize(list(AlignedRun(ep, onx, (x,))))
    assert plain.culprit is not None and plain.culprit.own_measured is False
    text = _culprit_html(plain)
    assert "own error" not in text and " error " in text.replace("<", " <")
    own = summarize(list(AlignedRun(ep, onx, (x,), own_error=True)))
    assert own.culprit.own_measured is True
    assert "own error" in _culprit_html(own)


# ---- --inputs runs draw their progress bar once ----------------------------------------


def test_the_inputs_progress_bar_is_not_drawn_after_the_summary(planted, tmp_path, monkeypatch):
    import io

    from onnx_sbs_nb.align.engine.options import RunOptions
    from onnx_sbs_nb.cli.main import run_many_and_report

    ep, onx, x = planted
    files = []
    for k in range(2):
        files.append(str(tmp_path / f"in{k}.pt"))
        torch.save((x + k,), files[-1])
    log = io.StringIO()  # the terminal: both streams, in the order written
    monkeypatch.setattr(sys, "stderr", log)
    run_many_and_report(
        ep, onx, files, [tmp_path / "r.jsonl"], RunOptions(), progress=True, stdout=log
    )
    text = log.getvalue()
    summary_at = text.index("records: ")
    assert "2/2" in text[:summary_at]  # the bar, drawn to its end before the summary
    assert "input/s" not in text[summary_at:] and "2/2 [" not in text[summary_at:], text


# ---- scripts/setup.sh says what it installs and lets pip show its progress -------------

_FAKE_PYTHON = """#!/bin/bash
# python3 -m venv .venv makes a .venv whose python is this script again; pip calls are
# logged and answered as pip would (a download line), torch is not installed yet
if [ "$1 $2" = "-m venv" ]; then
    mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && exit 0
fi
if [ "$1" = "-c" ]; then exit 1; fi
echo "$*" >> "$PIP_LOG"
case "$*" in *-q*) ;; *) echo "Collecting fake-package";; esac
case "$*" in *" -e "*) echo "Requirement already satisfied: x";; esac
"""


def test_setup_script_shows_what_it_installs(tmp_path):
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    (repo / "scripts" / "setup.sh").write_text((REPO_ROOT / "scripts" / "setup.sh").read_text())
    fake = tmp_path / "bin" / "python3"
    fake.parent.mkdir()
    fake.write_text(_FAKE_PYTHON)
    fake.chmod(0o755)
    log = tmp_path / "pip.log"
    out = subprocess.run(
        ["bash", str(repo / "scripts" / "setup.sh")],
        capture_output=True,
        text=True,
        env={"PATH": f"{fake.parent}:/usr/bin:/bin", "PIP_LOG": str(log)},
        check=True,
    )
    lines = out.stdout.splitlines()
    steps = [s for s in lines if s.startswith("setup: ")]
    assert any("torch 2.13.0" in s for s in steps) and any("onnx_sbs_nb" in s for s in steps)
    # the downloads are not silenced: pip's lines reach the terminal (less the idle ones)
    assert lines.count("Collecting fake-package") == 2
    assert not any(s.startswith("Requirement already satisfied") for s in lines)
    installs = [c for c in log.read_text().splitlines() if "torch" in c or "-e" in c.split()]
    assert installs and all("-q" not in c.split() for c in installs), installs


# ---- %sbs takes a Python expression of the notebook -----------------------------------


def test_sbs_magic_accepts_an_expression_for_inputs(planted):
    from onnx_sbs_nb.notebook.magic import SbsMagicError, parse_line

    ep, onx, x = planted
    ns = {"ep": ep, "onx": onx, "x": x, "batch": {"a": x}}
    kwargs, _ = parse_line("ep onx (x,)", ns)
    assert isinstance(kwargs["inputs"], tuple) and kwargs["inputs"][0] is x
    kwargs, _ = parse_line("ep onx [(x,), (x + 1,)] --atol 1e-3", ns)
    assert len(kwargs["inputs"]) == 2 and kwargs["options"].atol == 1e-3
    kwargs, _ = parse_line("ep onx (batch['a'],) --replay-root 'my dir'", ns)
    assert kwargs["inputs"][0] is x and kwargs["replay_root"] == "my dir"
    kwargs, _ = parse_line('ep onx batch["a"]', ns)  # a subscript keeps its quotes
    assert kwargs["inputs"] is x
    with pytest.raises(SbsMagicError, match=r"\(y,\).*NameError"):
        parse_line("ep onx (y,)", ns)


# ---- a .pt2 whose outputs are a type not registered here says so ------------------------


def _load_in_fresh_process(path: Path) -> str:
    code = (
        "from onnx_sbs_nb.align.source.loading import load_exported_program\n"
        "from onnx_sbs_nb.errors import SbsInputError\n"
        "try:\n"
        f"    load_exported_program({str(path)!r})\n"
        "    print('LOADED')\n"
        "except SbsInputError as e:\n"
        "    print('ERROR', e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
        check=False,
    )
    return out.stdout + out.stderr[-2000:]


def test_a_pt2_returning_a_model_output_names_the_unregistered_type(tmp_path):
    from transformers.modeling_outputs import BaseModelOutput

    class Encoder(torch.nn.Module):
        def forward(self, x):
            return BaseModelOutput(last_hidden_state=torch.relu(x))

    path = tmp_path / "model.pt2"
    torch.export.save(torch.export.export(Encoder(), (torch.randn(2, 3),)), path)
    said = _load_in_fresh_process(path)  # a process that has not imported transformers
    assert "ERROR" in said and "check the warnings above" not in said, said
    assert "transformers.modeling_outputs.BaseModelOutput" in said
    assert "not registered" in said and "import transformers.modeling_outputs" in said
    assert "return_dict=False" in said


def test_a_pt2_returning_a_registered_dataclass_names_it_too(tmp_path):
    import dataclasses

    @dataclasses.dataclass
    class Pair:
        first: torch.Tensor
        second: torch.Tensor

    torch.export.register_dataclass(Pair, serialized_type_name="my_project.outputs.Pair")

    class Split(torch.nn.Module):
        def forward(self, x):
            return Pair(x[:1] * 2, x[1:] + 1)

    path = tmp_path / "split.pt2"
    torch.export.save(torch.export.export(Split(), (torch.randn(2, 3),)), path)
    said = _load_in_fresh_process(path)
    assert "my_project.outputs.Pair" in said and "import my_project.outputs" in said, said


# ---- onnx-sbs diff: each module path once, coverage words for two ONNX models ----------


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.relu(self.lin(x))


class _Nested(torch.nn.Module):
    """Modules three deep (m.blocks.1.lin), as a transformers model's are."""

    def __init__(self) -> None:
        super().__init__()
        self.m = torch.nn.Module()
        self.m.blocks = torch.nn.ModuleList([_Block(), _Block()])

    def forward(self, x):
        for b in self.m.blocks:
            x = b(x)
        return x * 2


def test_diff_names_each_module_path_once_and_counts_reference_nodes(tmp_path, capsys):
    from onnx_sbs_nb.cli.main import EXIT_FAIL, main

    torch.manual_seed(0)
    x = torch.randn(2, 8)
    _, onx = _export(_Nested(), (x,))
    a, b, inputs = tmp_path / "a.onnx", tmp_path / "b.onnx", tmp_path / "x.pt"
    onnx.save(onx, a)
    # the second block's relu broken: its module path is m.blocks.1
    [n for n in onx.graph.node if n.op_type == "Relu"][1].op_type = "Sigmoid"
    onnx.save(onx, b)
    torch.save((x,), inputs)
    argv = ["diff", str(a), str(b), "--inputs", str(inputs), "-o", str(tmp_path / "d.jsonl")]
    assert main([*argv, "--no-progress"]) == EXIT_FAIL
    out = capsys.readouterr().out
    assert "in m.blocks.1 " in out and "m.m." not in out and "blocks.blocks" not in out, out
    coverage = next(line for line in out.splitlines() if line.startswith("coverage:"))
    assert "torch" not in coverage and "nodes of the reference model" in coverage, coverage


def test_scope_paths_full_or_relative_give_the_module_once():
    from onnx_sbs_nb.align.source.provenance import _scope_path

    assert _scope_path(["m", "m.biogpt", "m.biogpt.layers.1"]) == "m.biogpt.layers.1"
    assert _scope_path(["model", "layers.0", "mlp"]) == "model.layers.0.mlp"
    assert _scope_path([]) is None


# ---- the CLI's top suspects: the user's names and module, the op whole ------------------


def test_top_suspects_name_the_users_node_and_module_and_keep_the_op_whole(planted):
    from onnx_sbs_nb import AlignedRun, summarize
    from onnx_sbs_nb.records import Record

    ep, onx, x = planted
    s = summarize(list(AlignedRun(ep, onx, (x,))))
    text = s.to_text()
    table = text[text.index("own err") :]
    r = next(r for r in s.top_suspects if r.ep_module)  # linear_1 in b
    assert f"{r.ep_user_name} in {r.ep_module}" in table, table
    # a long op type (a fused node of onnxruntime) is printed whole, the user's name first
    long_op = Record(
        ep_name="getitem_9",
        ep_user_name="attn_weights",
        ep_module="model.layers.0.self_attn",
        onnx_name="val_42",
        onnx_op_type="SkipSimplifiedLayerNormalization",
        kind="node",
        status="fail",
        passed=False,
        err_abs=0.5,
        atol=1e-4,
        rtol=1e-4,
        step=3,
    )
    text = summarize([long_op]).to_text()
    table = text[text.index("own err") :]
    row = next(line for line in table.splitlines() if "SkipSimplified" in line)
    assert "SkipSimplifiedLayerNormalization " in row
    assert "attn_weights in model.layers.0.self_attn (value val_42)" in row
    assert "getitem_9" not in row


# ---- torch.onnx.InputObserver: its captured calls are the inputs of a run ---------------


class _Scaled(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(6, 4)

    def forward(self, x, scale):
        return torch.tanh(self.lin(x)) * scale


@pytest.fixture(scope="module")
def observed():
    """Three real calls of different batch sizes, observed, then the export they infer."""
    if not hasattr(torch.onnx, "InputObserver"):
        pytest.skip("torch.onnx.InputObserver needs torch >= 2.11")
    torch.manual_seed(0)
    model = _Scaled().eval()
    observer = torch.onnx.InputObserver()
    with observer(model):
        for batch in (2, 3, 5):
            model(torch.randn(batch, 6), scale=torch.rand(batch, 4))
    args = observer.infer_arguments()
    kwargs = {}
    if isinstance(args, dict):
        args, kwargs = (), args
    shapes = observer.infer_dynamic_shapes()
    ep = torch.export.export(model, tuple(args), kwargs=kwargs, dynamic_shapes=shapes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onx = torch.onnx.export(ep, dynamo=True, verbose=False).model_proto
    return ep, onx, observer


def test_an_input_observer_is_the_many_inputs_of_a_run(observed):
    from onnx_sbs_nb import SbsSession, run_aligned

    ep, onx, observer = observed
    stream = run_aligned(ep, onx, inputs=observer)
    records = list(stream)
    assert stream.run.status.extra["inputs_total"] == 3
    assert records and not any(r.failed for r in records)
    assert {r.inputs_total for r in records if r.inputs_total} == {3}
    session = SbsSession(ep, onx, inputs=observer).start()
    session.wait()
    assert session.inputs["total"] == 3 and session.inputs["done"] == 3


def test_observed_inputs_saved_for_the_command_line(observed, tmp_path, capsys):
    from onnx_sbs_nb import save_observed_inputs
    from onnx_sbs_nb.cli.main import EXIT_PASS, main

    ep, onx, observer = observed
    files = save_observed_inputs(observer, tmp_path / "inputs")
    assert [f.name for f in files] == ["input_000.pt", "input_001.pt", "input_002.pt"]
    torch.export.save(ep, tmp_path / "m.pt2")
    onnx.save(onx, tmp_path / "m.onnx")
    argv = ["run", str(tmp_path / "m.pt2"), str(tmp_path / "m.onnx"), str(tmp_path / "inputs")]
    assert main([*argv, "-o", str(tmp_path / "r.jsonl"), "--no-progress"]) == EXIT_PASS
    assert "worst of 3 inputs" in capsys.readouterr().out


def test_an_observer_that_saw_no_call_says_so(observed):
    from onnx_sbs_nb import run_aligned
    from onnx_sbs_nb.errors import SbsInputError

    ep, onx, _ = observed
    with pytest.raises(SbsInputError, match="captured no call"):
        run_aligned(ep, onx, inputs=torch.onnx.InputObserver())


def test_an_input_observer_of_positional_calls_too():
    from onnx_sbs_nb import run_aligned

    if not hasattr(torch.onnx, "InputObserver"):
        pytest.skip("torch.onnx.InputObserver needs torch >= 2.11")
    torch.manual_seed(1)
    model = _TwoStage().eval()
    observer = torch.onnx.InputObserver()
    with observer(model):
        for batch in (2, 4):
            model(torch.randn(batch, 6))
    args = observer.infer_arguments()
    assert isinstance(args, tuple)  # positional calls: positional arguments
    ep = torch.export.export(model, args, dynamic_shapes=observer.infer_dynamic_shapes())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onx = torch.onnx.export(ep, dynamo=True, verbose=False).model_proto
    stream = run_aligned(ep, onx, inputs=observer)
    assert list(stream) and stream.run.status.extra["inputs_total"] == 2


def test_the_cli_startup_benchmark_runs(capsys):
    from benchmarks import bench_cli_startup

    bench_cli_startup.main(["--repeats", "1"])
    out = capsys.readouterr().out
    for name, _ in bench_cli_startup.CASES:
        assert name in out


def test_a_reader_that_closes_the_pipe_ends_the_command_quietly(tmp_path):
    # `onnx-sbs run ... | head -3` printed "onnx-sbs: error: [Errno 32] Broken pipe" when
    # the summary was printed after head had gone: a real pipe whose reader closed, the
    # CLI's own summary printing into it
    import subprocess
    import sys

    code = (
        "import os, sys\n"
        "r, w = os.pipe(); os.close(r)\n"  # a reader already gone
        "os.dup2(w, 1)\n"
        "sys.stdout = open(1, 'w', buffering=1)\n"
        "from onnx_sbs_nb.cli import main as cli\n"
        "cli.cmd_report = lambda args: print('verdict: PASS\\n' * 10000) or 0\n"
        "sys.exit(cli.main(['report', 'x.jsonl', '-o', 'r.html']))\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    assert "Broken pipe" not in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert p.returncode == 141, (p.returncode, p.stderr)


def test_two_models_count_unpaired_values_in_words_that_fit_them():
    # onnx-sbs diff printed "unpaired: 39 torch-only" for two ONNX models
    from onnx_sbs_nb.align.blame.summary import Coverage, Summary

    s = Summary(unpaired_ep=["a", "b"], unpaired_onnx=["c"], coverage=Coverage(reference_onnx=True))
    assert "unpaired: 2 reference-only, 1 candidate-only" in s.to_text(), s.to_text()
    s = Summary(unpaired_ep=["a"], unpaired_onnx=["c"])
    assert "unpaired: 1 torch-only, 1 onnx-only" in s.to_text(), s.to_text()
