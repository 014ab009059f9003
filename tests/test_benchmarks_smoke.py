"""The benchmark scripts run end to end on a tiny Llama, so they cannot rot.

Nothing here asserts on time: only that every measurement was taken and that the
engine reports no failing pair on a faithful export.  The prior-art columns run only
where onnx_diagnostic is importable (the bench venv), and are skipped otherwise.
"""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks import bench_engine, bench_engine_device, bench_memory, bench_real_size
from benchmarks.common import ChainSpec, LlamaSpec, export_llama, export_spec, has_onnx_diagnostic
from tests.models import LlamaLogits, tiny_llama_config

TINY = LlamaSpec("tiny", hidden=32, layers=1, seq=4)


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    return export_llama(TINY, tmp_path_factory.mktemp("bench"))


@pytest.mark.slow
def test_bench_engine_core(tiny_files, capsys):
    with_theirs = has_onnx_diagnostic()
    result = bench_engine.bench_model(
        tiny_files,
        repeats=1,
        theirs_repeats=1,
        memory_repeats=1,
        with_theirs=with_theirs,
        memory_names=[bench_engine.MEMORY_BASE, "ours"],
    )
    floor = result.floor
    assert len(floor.eager.values) == len(floor.ort_run.values) == len(floor.ort_build.values) == 1
    variants = {v.name: v for v in result.variants}
    assert set(variants) >= {*bench_engine.OURS, bench_engine.OURS_ONNX_PROGRAM}
    for name in (*bench_engine.OURS, bench_engine.OURS_ONNX_PROGRAM):
        v = variants[name]
        assert v.paired > 0 and v.records >= v.paired, name
        assert v.failing == 0, name
        assert len(v.cold_ratios) == 1 and v.cold_ratios[0] > 0, name
    assert variants["ours"].warm is not None and len(variants["ours"].warm.values) == 1
    # the ONNXProgram carries the exporter's program: pairing is the same
    assert variants[bench_engine.OURS_ONNX_PROGRAM].paired == variants["ours"].paired
    if with_theirs:
        assert variants[bench_engine.THEIRS].paired > 0
    else:
        assert any("onnx-diagnostic" in s for s in result.skipped)
    memory = {m.name: m for m in result.memory}
    assert set(memory) == {bench_engine.MEMORY_BASE, "ours"}
    for m in memory.values():
        (run,) = m.runs
        assert run["method"] in ("VmHWM", "psutil-sampling")
        assert run["first"] >= 0 and run["steady"] >= 0 and run["baseline"] > 0
    assert variants["ours_retrace"].paired == variants["ours"].paired
    for v in result.variants:
        assert v.first.values and 0 < v.first.values[0] <= v.cold.values[0], v.name
    bench_engine.print_results([result], {"ours": 0.0})
    out = capsys.readouterr().out
    for title in ("Floor", "Wall time", "Records", "Peak RSS", "Goals"):
        assert title in out


@pytest.mark.slow
def test_bench_engine_fresh_processes_and_chains(tiny_files, tmp_path, capsys):
    """Cold runs from the files in fresh processes (and the `onnx-sbs run` command), and
    the cost-versus-size table on two short chains."""
    names = ["ours", bench_engine.FRESH_EMPTY_CACHE, bench_engine.CLI]
    fresh = {f.name: f for f in bench_engine.measure_fresh(tiny_files, names, repeats=1)}
    assert set(fresh) == set(names)
    for name in names[:2]:
        (run,) = fresh[name].runs
        assert run["paired"] > 0 and run["failing"] == 0, run
        assert 0 < run["first"] <= run["run"] < run["wall"] and run["imports"] > 0, run
    assert fresh[bench_engine.CLI].runs[0]["wall"] > 0
    chains = [export_spec(ChainSpec(f"chain{n}", n), tmp_path) for n in (10, 40)]
    results = [
        bench_engine.bench_model(
            f, repeats=1, theirs_repeats=1, with_theirs=False, with_memory=False
        )
        for f in chains
    ]
    for r in results:
        assert {v.name for v in r.variants} == set(bench_engine.CHAIN_VARIANTS)
        assert all(v.warm is None and v.paired >= r.files.spec.nodes for v in r.variants)
    bench_engine.print_results(results, {})
    out = capsys.readouterr().out
    assert "Cost versus graph size" in out and "3. growth" in out
    # files already exported are reused when asked
    assert export_spec(ChainSpec("chain10", 10), tmp_path, reuse=True).folder == chains[0].folder


def test_count_theirs_verdicts():
    """The prior art's records are judged like ours: shape/type mismatch or err_abs > atol."""

    class Rec:
        def __init__(self, ep, onx, shape_ep="CT1s2", shape_onnx="CT1s2", err_abs=0.0, err_rel=0.0):
            self.ep_name, self.onnx_name = ep, onx
            self.ep_shape_type, self.onnx_shape_type = shape_ep, shape_onnx
            self.err_abs, self.err_rel = err_abs, err_rel

    records = [
        Rec("a", "a"),
        Rec("b", "b", shape_onnx="CT1s3"),
        Rec("c", "c", err_abs=1.0, err_rel=1.0),
        Rec("d", "d", err_rel=1.0),
        Rec("e", None),
        Rec("f", "f", err_abs=None, err_rel=None),  # no error computed (integers): not a failure
    ]
    assert bench_engine.count_theirs(records) == (5, 2, 2)


def test_profile_ours(tiny_files):
    text = bench_engine.profile_ours(tiny_files, top=5)
    assert "cold run" in text and "warm run" in text and "cumulative" in text


@pytest.mark.slow
def test_bench_memory_core(tmp_path, capsys):
    specs = [TINY, LlamaSpec("tiny2", hidden=32, layers=2, seq=4)]
    points = bench_memory.bench_depth(specs, tmp_path, repeats=1, variants=["ours"])
    assert [p.files.spec.layers for p in points] == [1, 2]
    assert points[1].files.weight_bytes > points[0].files.weight_bytes
    assert points[1].activation_bytes > points[0].activation_bytes > 0
    diffs = bench_memory.print_depth(points)
    assert diffs["extra_weights"] == points[1].files.weight_bytes - points[0].files.weight_bytes
    assert set(diffs["ours"]) == {"first", "steady"}
    assert "extra weights" in capsys.readouterr().out


def test_gpu_check_script_runs_every_cuda_test():
    """scripts/gpu_check.sh names the modules it runs: a CUDA test added elsewhere must be
    added there too, or the next GPU check would silently leave it out."""
    import pathlib
    import re
    import subprocess
    import sys

    root = pathlib.Path(__file__).resolve().parent.parent
    script = (root / "scripts" / "gpu_check.sh").read_text()
    listed = set(re.findall(r"tests/(?:\w+/)*test_\w+\.py", script))
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "--co", "-q", "-m", "cuda", "-p", "no:cacheprovider"]
        + [
            str(p.relative_to(root))
            for p in sorted((root / "tests").rglob("test_*.py"))
            if "ui" not in p.parts
        ],
        cwd=root,
        capture_output=True,
        text=True,
    ).stdout
    cuda_modules = {line.split("::")[0] for line in out.splitlines() if "::" in line}
    assert len(cuda_modules) >= 5, out[-2000:]
    assert cuda_modules <= listed, f"not in scripts/gpu_check.sh: {cuda_modules - listed}"


def test_bench_instructions_child_runs_its_counted_runs(tiny_files, tmp_path):
    """The child that callgrind counts, run here without valgrind: the parent's signals
    are already there, so it runs straight through, warm and cold."""
    from benchmarks import bench_instructions

    flag = tmp_path / "run.flag"
    for what in ("go", "end"):
        flag.with_suffix("." + what).touch()
    for mode in bench_instructions.MODES:
        flag.with_suffix(".done").unlink(missing_ok=True)
        bench_instructions.child(mode, tiny_files.folder, 1, flag)
        assert flag.with_suffix(".ready").exists() and flag.with_suffix(".done").exists()
    with pytest.raises(SystemExit):
        bench_instructions.main(["--models", "no-such-model"])


def test_bench_engine_device_on_the_cpu(capsys):
    """The CUDA benchmark of scripts/gpu_check.sh, on the CPU and a tiny Llama."""
    assert bench_engine_device.main(["--device", "cpu", "--small", "--runs", "1"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| h32")]
    assert len(rows) == 2  # without and with own errors
    assert all(line.rstrip(" |").endswith("| 0") for line in rows), rows  # no failing pair


def test_bench_budget_splits_a_run(tiny_files, capsys):
    """The budget's split: torch and onnxruntime calls counted, own-error reruns only with
    own errors, every wrapper taken off afterwards, and the sessions timed again alone."""
    import torch
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_c

    from benchmarks import bench_budget
    from onnx_sbs_nb.align.engine import loop

    originals = (
        torch._ops.OpOverload.__call__,
        ort_c.InferenceSession.run,
        *(getattr(loop.SideBySideRun, m) for m in bench_budget.OWN_METHODS),
    )
    ep, onx, args = tiny_files.load()
    splits = {}
    for name, options in bench_budget.VARIANTS.items():
        bench_engine.run_ours(ep, onx, args, options)
        splits[name] = bench_budget.measure_split(ep, onx, args, options, repeats=2)
    for name, split in splits.items():
        assert split.runs == 2 and split.torch_calls > 0 and split.ort_calls > 0, name
        assert split.torch > 0 and split.ort_main > 0 and split.rest > 0, name
        assert split.wall > split.torch + split.ort_main + split.ort_own, name
        (inside, alone), *_ = bench_budget.alone(split, top=1, repeats=2)
        assert inside > 0 and alone > 0
    assert splits["ours"].ort_own == 0 < splits["ours_rerun"].ort_own
    assert originals == (
        torch._ops.OpOverload.__call__,
        ort_c.InferenceSession.run,
        *(getattr(loop.SideBySideRun, m) for m in bench_budget.OWN_METHODS),
    )
    with pytest.raises(SystemExit):
        bench_budget.main(["--models", "no-such-model"])
    capsys.readouterr()
    bench_budget.bench(tiny_files, repeats=1)
    out = capsys.readouterr().out
    assert out.count("left to the rest at 3x the floor") == len(bench_budget.VARIANTS)
    assert "timed again alone" in out and "floor (min of 1)" in out


def test_bench_many_inputs_measures(tiny_files):
    from benchmarks import bench_many_inputs

    result = bench_many_inputs.measure(tiny_files.folder, 3, threads=0, memory=True)
    assert result["n"] == 3 and result["records"] > 0
    assert 0 < result["first"] <= result["total"] and result["rest_mean"] > 0
    assert 0 < result["cpu_first"] <= result["cpu_total"] and result["cpu_rest_mean"] > 0
    assert result["bare"] > 0
    assert result["peak"] > 0 and result["method"] in ("VmHWM", "psutil-sampling")


def test_bench_kv_cache_measures_both_variants():
    """The dynamic/static benchmark's child, in process: a model exported with Dim.AUTO
    on every input (NAME@auto) and with static shapes, each run twice."""
    from benchmarks import bench_kv_cache

    for variant in bench_kv_cache.VARIANTS:
        result = bench_kv_cache.measure("dynamic_attention@auto", variant)
        assert result["verdict"] == "pass", result
        assert result["cold"] > 0 and result["warm"] > 0
        assert 0 < result["torch_compared"] <= result["torch_nodes"]


# --- bench_real_size (issue 50): the low-memory export of a real-size Llama, on a tiny one

TINY_REAL = {"hidden": 32, "layers": 1, "intermediate": 64, "vocab": 128, "seq": 4}


def test_bench_real_size_weights_move_into_mapped_files_unchanged(tmp_path):
    torch.manual_seed(0)
    model = LlamaLogits(tiny_llama_config(hidden=32, layers=1, vocab=128)).eval()
    ids = torch.randint(0, 128, (1, 4))
    with torch.no_grad():
        expected = model(ids)
    params = {n: p for n, p in model.named_parameters()}
    bench_real_size._to_mapped_files(model, tmp_path)
    # the same Parameter objects (the optimizer-free model keeps its identity), now each
    # backed by a file of its own under the folder
    assert {n: p for n, p in model.named_parameters()} == params
    files = set()
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        filename = tensor.untyped_storage().filename
        assert filename is not None and filename.startswith(str(tmp_path)), name
        files.add(filename)
    assert len(files) == len([*model.named_parameters(), *model.named_buffers()])
    with torch.no_grad():
        torch.testing.assert_close(model(ids), expected, rtol=0, atol=0)


def test_bench_real_size_estimated_weight_bytes_matches_the_export(tmp_path):
    meta = bench_real_size.export_child(tmp_path / "m", TINY_REAL)
    estimate = bench_real_size.estimated_weight_bytes(TINY_REAL)
    # the estimate leaves out the rotary frequencies (a few hundred bytes)
    assert 0 <= meta["weight_bytes"] - estimate <= 1024
    assert not (tmp_path / "m" / "mapped_weights").exists()  # deleted after the export
    assert {"built", "mapped", "exported", "onnx_saved", "pt2_saved"} <= set(
        meta["export_anon_rss"]
    )


@pytest.mark.slow
def test_bench_real_size_end_to_end(tmp_path, capsys):
    argv = [f"--{k}={v}" for k, v in TINY_REAL.items()]
    argv += ["--workdir", str(tmp_path), "--keep", "--variants", "ort_whole_model,ours,ours_rerun"]
    assert bench_real_size.main(argv) == 0
    out = capsys.readouterr().out
    rows = {
        cells[0]: cells
        for line in out.splitlines()
        if line.startswith("| ")
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }
    header = rows["variant"]
    for name in ("ort_whole_model", "ours", "ours_rerun"):
        assert name in rows, out
    failing, drifted = header.index("failing"), header.index("of them drifted")
    assert rows["ours"][failing] == "0" and rows["ours_rerun"][failing] == "0"
    assert rows["ours_rerun"][drifted] == "0" and rows["ours"][drifted] == "-"
    assert int(rows["ours"][header.index("paired")]) > 0
    meta = json.loads((tmp_path / "real_llama" / "meta.json").read_text())
    assert meta["config"] == TINY_REAL
