"""``onnx-sbs generate`` and ``onnx-sbs quantize-advice`` from files, in fresh processes, as a
user runs them: exit codes, what they print and write, bad input answered in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
import torch

from ..corpus.cache_decoders import (
    export_case,
    export_model_output_case,
    mistyped_node,
    rotary_frequency_off,
)
from ..models import MLP, export

REPO = Path(__file__).resolve().parents[2]


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "onnx_sbs_nb", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=600,
    )


@pytest.fixture(scope="module")
def decoder_files(tmp_path_factory):
    pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("decoder")
    case = export_case("dynamic_cache", "dynamic")
    torch.export.save(case.ep, folder / "model.pt2")
    onnx.save(case.onx, folder / "model.onnx")
    torch.save(case.inputs(*case.case.sizes), folder / "inputs.pt")
    return folder, case


def test_generate_agrees_on_a_faithful_export(decoder_files):
    folder, _ = decoder_files
    p = _cli(
        "generate", "--ep", "model.pt2", "--onnx", "model.onnx", "--inputs", "inputs.pt",
        "--steps", "4", "--trust-pickles", "-o", "parity.json", "--no-progress", cwd=folder,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert "generation parity: PASS over 4 steps" in p.stdout
    saved = json.loads((folder / "parity.json").read_text())
    assert saved["verdict"] == "pass" and len(saved["steps"]) == 4


def test_generate_names_the_step_and_writes_its_node_report(decoder_files):
    folder, case = decoder_files
    onnx.save(rotary_frequency_off(case.onx, 1.001), folder / "broken.onnx")
    p = _cli(
        "generate", "--ep", "model.pt2", "--onnx", "broken.onnx", "--inputs", "inputs.pt",
        "--steps", "3", "--trust-pickles", "--step-report", "step.csv", "--no-progress",
        cwd=folder,
    )  # fmt: skip
    assert p.returncode == 1, p.stderr[-2000:]
    assert "FAIL" in p.stdout and "step 0" in p.stdout
    assert (folder / "step.csv").is_file()
    # the CLI names its flag, not the Python method (trial finding 10)
    assert "step_run()" not in p.stdout and "--step-report" in p.stdout


def test_generate_refuses_a_model_onnxruntime_cannot_build_in_one_line(decoder_files):
    """Trial finding 09: exit 2 and one line naming the node, no onnxruntime traceback."""
    folder, case = decoder_files
    bad, node = mistyped_node(case.onx)
    onnx.save(bad, folder / "mistyped.onnx")
    p = _cli(
        "generate", "--ep", "model.pt2", "--onnx", "mistyped.onnx", "--inputs", "inputs.pt",
        "--steps", "2", "--trust-pickles", "--no-progress", cwd=folder,
    )  # fmt: skip
    assert p.returncode == 2, p.stderr[-2000:]
    lines = [x for x in p.stderr.splitlines() if x.strip() and not x.startswith(("W1", "["))]
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert "onnxruntime cannot build a session" in lines[0] and repr(node) in lines[0]


@pytest.fixture(scope="module")
def model_output_files(tmp_path_factory):
    """The transformers model itself exported with ``cache=`` (transformers 5)."""
    pytest.importorskip("transformers")
    folder = tmp_path_factory.mktemp("model_output")
    case = export_model_output_case()
    torch.export.save(case.ep, folder / "model.pt2")
    onnx.save(case.onx, folder / "model.onnx")
    torch.save(case.kwargs(), folder / "inputs.pt")
    torch.save(tuple(case.kwargs().values()), folder / "tuple.pt")
    return folder


def test_generate_says_why_a_passing_run_writes_no_step_report(model_output_files):
    """Trial finding 10: the report asked for is not written on a pass, and stderr says why;
    the cache is read from the program's output under its own key (no transformers
    deprecation warning for ``past_key_values``)."""
    folder = model_output_files
    p = _cli(
        "generate", "--ep", "model.pt2", "--onnx", "model.onnx", "--inputs", "inputs.pt",
        "--steps", "3", "--trust-pickles", "--step-report", "step.html", "--no-progress",
        cwd=folder,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert "no step report: the decodes agree on all 3 steps" in p.stderr
    assert not (folder / "step.html").exists()
    assert "deprecated" not in p.stderr, p.stderr[-2000:]


def test_generate_hints_the_cache_keyword_the_program_takes(model_output_files):
    """Trial finding 13, part 2: inputs saved as a tuple: the fix names the program's own
    keywords (``cache`` here), not ``past_key_values``."""
    p = _cli(
        "generate", "--ep", "model.pt2", "--onnx", "model.onnx", "--inputs", "tuple.pt",
        "--trust-pickles", cwd=model_output_files,
    )  # fmt: skip
    assert p.returncode == 2, p.stderr[-2000:]
    assert "'cache': cache" in p.stderr and "past_key_values" not in p.stderr, p.stderr
    assert "'input_ids': ..., 'attention_mask': ..." in p.stderr


def test_generate_refuses_bad_input_in_one_line(decoder_files):
    folder, _ = decoder_files
    p = _cli(
        "generate", "--ep", "model.pt2", "--onnx", "nope.onnx", "--inputs", "inputs.pt", cwd=folder
    )
    assert p.returncode == 2 and "nope.onnx" in p.stderr and "Traceback" not in p.stderr
    p = _cli(
        "generate", "--ep", "model.pt2", "--onnx", "model.onnx", "--inputs", "inputs.pt",
        "-o", "parity.txt", cwd=folder,
    )  # fmt: skip
    assert p.returncode == 2 and "FILE.json" in p.stderr
    p = _cli(
        "generate", "--ep", "model.pt2", "--onnx", "model.onnx", "--inputs", "inputs.pt", cwd=folder
    )
    assert p.returncode == 2 and "--trust-pickles" in p.stderr, p.stderr[-2000:]


def test_quantize_advice_writes_the_advice_and_the_model(tmp_path):
    torch.manual_seed(0)
    model = MLP()
    x = torch.randn(4, 8)
    ep, onx = export(model, (x,))
    onnx.save(onx, tmp_path / "model.onnx")
    names = []
    for i in range(4):
        torch.save((torch.randn(4, 8),), tmp_path / f"in{i}.pt")
        names.append(f"in{i}.pt")
    p = _cli(
        "quantize-advice", "--onnx", "model.onnx", "--inputs", *names, "--mode", "dynamic",
        "-o", "advice.json", "--save-model", "advised.onnx", cwd=tmp_path,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    advice = json.loads((tmp_path / "advice.json").read_text())
    assert "nodes_to_exclude" in advice and advice["mode"] == "dynamic"
    onnx.checker.check_model(onnx.load(tmp_path / "advised.onnx"))
    # measured as deployed by default, and the text says so; --execution as-written switches
    assert advice["execution"] == "deployed" and "default onnxruntime CPU session" in p.stdout
    p = _cli(
        "quantize-advice", "--onnx", "model.onnx", "--inputs", *names, "--mode", "dynamic",
        "--execution", "as-written", "-o", "written.json", cwd=tmp_path,
    )  # fmt: skip
    assert p.returncode == 0 and "graph optimizations off" in p.stdout, p.stderr[-2000:]
    assert json.loads((tmp_path / "written.json").read_text())["execution"] == "as-written"
    p = _cli(
        "quantize-advice", "--onnx", "model.onnx", "--inputs", "in0.pt", "--mode", "x", cwd=tmp_path
    )
    assert p.returncode == 2 and "Traceback" not in p.stderr


def test_generate_on_a_program_of_positional_inputs_says_to_export_keywords(tmp_path):
    """Trial finding 13, part 2: a program that takes no keyword input gets no empty
    ``torch.save({})`` hint: it is told to export the decoder with its keyword inputs."""
    torch.manual_seed(0)
    x = torch.randn(4, 8)
    ep, onx = export(MLP(), (x,))
    torch.export.save(ep, tmp_path / "m.pt2")
    onnx.save(onx, tmp_path / "m.onnx")
    torch.save((x,), tmp_path / "in.pt")
    p = _cli("generate", "--ep", "m.pt2", "--onnx", "m.onnx", "--inputs", "in.pt", cwd=tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert "takes no keyword input" in p.stderr and "torch.save({}" not in p.stderr


def test_quantize_advice_refuses_an_already_quantized_model(tmp_path):
    """The trial's mistake (findings 13): the QDQ model given instead of the float one; the
    advisor quantized it again and onnxruntime failed on duplicate node names."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    torch.manual_seed(0)
    _, onx = export(MLP(), (torch.randn(4, 8),))
    onnx.save(onx, tmp_path / "model.onnx")
    name = onx.graph.input[0].name
    feeds = iter([{name: torch.randn(4, 8).numpy()} for _ in range(4)])

    class Reader(CalibrationDataReader):
        def get_next(self):
            return next(feeds, None)

    quantize_static(
        str(tmp_path / "model.onnx"), str(tmp_path / "q.onnx"), Reader(),
        quant_format=QuantFormat.QDQ,
    )  # fmt: skip
    torch.save((torch.randn(4, 8),), tmp_path / "in0.pt")
    p = _cli("quantize-advice", "--onnx", "q.onnx", "--inputs", "in0.pt", cwd=tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert "q.onnx is already quantized" in p.stderr
    assert "QuantizeLinear" in p.stderr and "pass the float model" in p.stderr
    assert "same node name" not in p.stderr


def test_generate_exit_code_follows_the_verdict_on_an_int8_decoder(decoder_files):
    """Trial 2 findings 03 and 04: an unedited int8 decoder is no fault (exit 0, its
    decodes may part by quantization noise), one with a weight scale x2 that its step's
    node-by-node run names is one (exit 1, the culprit in the JSON)."""
    quantization = pytest.importorskip("onnxruntime.quantization")
    from ..align.test_generation_quantized import _weight_scale_times

    folder, _ = decoder_files
    quantization.quantize_dynamic(
        str(folder / "model.onnx"), str(folder / "int8.onnx"),
        weight_type=quantization.QuantType.QInt8,
    )  # fmt: skip
    faulty = _weight_scale_times(onnx.load(folder / "int8.onnx"), "node_linear_7_quant", 2.0)
    onnx.save(faulty, folder / "int8_scale2.onnx")
    for name, code in (("int8.onnx", 0), ("int8_scale2.onnx", 1)):
        p = _cli(
            "generate", "--ep", "model.pt2", "--onnx", name, "--inputs", "inputs.pt",
            "--steps", "3", "--trust-pickles", "-o", f"{name}.json", "--no-progress", cwd=folder,
        )  # fmt: skip
        assert p.returncode == code, (name, p.stdout[-2000:], p.stderr[-2000:])
        saved = json.loads((folder / f"{name}.json").read_text())
        assert saved["verdict"] == ("pass" if code == 0 else "fail"), saved["why"]
    # the program loaded from its file names the q_proj's output (its transpose) or its
    # weight: the layer's attention either way
    assert "layers.1.self_attn" in saved["culprit"]["ep_module"], saved["why"]
    assert "no fault" not in saved["why"] and "a fault there" in saved["why"]
