"""Issue 39: hostile files and broken runs, second pass.  Writes stay in the chosen folder
(a link planted at any output is replaced, never followed), a model that cannot run is
refused instead of passing, one bad node (a custom runner's wrong return) is a record and
the run goes on, bad inputs are named."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from onnx_sbs_nb import run_aligned
from onnx_sbs_nb.align.blame.summary import summarize
from onnx_sbs_nb.errors import SbsInputError
from onnx_sbs_nb.records import STATUS_ERROR, STATUS_NOT_COMPUTED
from tests.models import export
from tests.notebook.test_session import _broken_mlp

ROOT = Path(__file__).resolve().parents[1]


class Small(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


@pytest.fixture(scope="module")
def small():
    """A faithful export: its run passes."""
    torch.manual_seed(0)
    x = torch.randn(3, 8)
    ep = torch.export.export(Small(), (x,))
    onx = torch.onnx.export(ep, (x,), dynamo=True, verbose=False).model_proto
    return ep, onx, (x,)


@pytest.fixture(scope="module")
def broken():
    return _broken_mlp()


def _copy(onx: onnx.ModelProto) -> onnx.ModelProto:
    return onnx.ModelProto.FromString(onx.SerializeToString())


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "onnx_sbs_nb", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=300,
    )


# ---- 1. every output kind replaces a link planted at its name -------------------------


def _plant(path: Path, tmp_path: Path) -> Path:
    """A link at ``path`` to a precious file outside the output folder."""
    outside = tmp_path / "outside" / f"precious-{path.name}"
    outside.parent.mkdir(exist_ok=True)
    outside.write_text("precious")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(outside)
    return outside


def _replaced(path: Path, outside: Path) -> None:
    assert outside.read_text() == "precious", f"the write followed the link at {path}"
    assert path.is_file() and not path.is_symlink()


def test_node_data_replaces_a_planted_link(broken, tmp_path):
    from onnx_sbs_nb.reports.model_explorer import write_node_data

    ep, onx, x = broken
    records = list(run_aligned(ep, onx, x))
    path = tmp_path / "out" / "run.node_data.json"
    outside = _plant(path, tmp_path)
    write_node_data(records, path, onx)
    _replaced(path, outside)


def test_html_report_replaces_a_planted_link(broken, tmp_path):
    from onnx_sbs_nb.reports.html import write_report_html

    ep, onx, x = broken
    records = list(run_aligned(ep, onx, x))
    path = tmp_path / "out" / "report.html"
    outside = _plant(path, tmp_path)
    write_report_html(records, path)
    _replaced(path, outside)


def test_exported_notebook_replaces_a_planted_link(tmp_path):
    pytest.importorskip("nbformat")
    from onnx_sbs_nb.reports.notebook import export_notebook

    path = tmp_path / "out" / "nb.html"
    outside = _plant(path, tmp_path)
    export_notebook(ROOT / "notebooks" / "01_quickstart.ipynb", path)
    _replaced(path, outside)


@pytest.mark.parametrize("large", [False, True])
def test_saved_model_and_its_data_replace_planted_links(small, tmp_path, monkeypatch, large):
    """The optimized graph written beside node data (and its .data file when large)."""
    from onnx_sbs_nb.align.pairing import onnxruntime_session as optimized

    if large:  # every weight to the data file, as a model above the inline limit
        monkeypatch.setattr(optimized, "_INLINE_LIMIT", 0)
    onx = _copy(small[1])
    # above onnx's 1 KB threshold: this one goes to the data file
    onx.graph.initializer.append(onnx.numpy_helper.from_array(np.ones(1024, np.float32), "big"))
    path = tmp_path / "out" / "run.optimized.onnx"
    outside = _plant(path, tmp_path)
    data = path.with_name(path.name + ".data")
    outside_data = _plant(data, tmp_path)
    optimized.save_model(onx, path)
    _replaced(path, outside)
    if large:
        _replaced(data, outside_data)
        back = onnx.load(str(path))
        assert [t.name for t in back.graph.initializer] == [t.name for t in onx.graph.initializer]
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".tmp")]


def test_replay_bundle_replaces_planted_links(broken, tmp_path):
    from onnx_sbs_nb.align.post.replay import BUNDLE_FILES
    from onnx_sbs_nb.notebook.session import SbsSession

    ep, onx, x = broken
    s = SbsSession(ep, onx, x, batch_interval=0, replay_root=tmp_path / "replays").start()
    node = next(r for r in s.records if r.onnx_op_type == "Gemm")
    first = s.save_replay(node)
    planted = {}
    for name in BUNDLE_FILES:
        if (first.bundle / name).exists():
            (first.bundle / name).unlink()
            planted[name] = _plant(first.bundle / name, tmp_path)
    assert "model.onnx" in planted and "replay.py" in planted
    again = s.save_replay(node)
    for name, outside in planted.items():
        _replaced(again.bundle / name, outside)


def test_demo_files_replace_planted_links(tmp_path):
    from onnx_sbs_nb.cli.demo import write_demo

    folder = tmp_path / "demo"
    planted = {n: _plant(folder / n, tmp_path) for n in ("model.pt2", "model.onnx", "inputs.pt")}
    write_demo(folder)
    for name, outside in planted.items():
        _replaced(folder / name, outside)


def test_output_under_a_dangling_linked_folder_is_named(broken, tmp_path):
    """Not a bare '[Errno 17] File exists': the link and where it points."""
    from onnx_sbs_nb.files import writable_location
    from onnx_sbs_nb.reports.model_explorer import write_node_data

    ep, onx, x = broken
    (tmp_path / "gone").symlink_to(tmp_path / "nowhere")
    path = tmp_path / "gone" / "sub" / "run.node_data.json"
    assert "is a link to" in (writable_location(path) or "")
    with pytest.raises(SbsInputError, match="is a link to .*nowhere.*which does not exist"):
        write_node_data(list(run_aligned(ep, onx, x)), path, onx)


# ---- 2. a model that cannot run is refused; not computed is never PASS ----------------


def _cycle(onx):
    m = _copy(onx)
    first, second = m.graph.node[0], m.graph.node[1]
    first.input[0] = second.output[0]
    return m


def _reads_nobody(onx):
    m = _copy(onx)
    m.graph.node[1].input[0] = "computed_by_nobody"
    return m


def _opset_1(onx):
    m = _copy(onx)
    for o in m.opset_import:
        if o.domain == "":
            o.version = 1  # no onnxruntime kernel for Gemm(1)
    return m


def _bad_function(onx):
    """A local function onnxruntime refuses to load (no body, no opsets): nothing calls
    it, node by node the run would pass."""
    m = _copy(onx)
    m.functions.append(onnx.helper.make_function("local", "unused", ["a"], ["b"], [], []))
    return m


def _types_clash(onx):
    """The second Gemm reads the relu as int64 next to float weights: every node has a
    kernel, the model has no valid typing."""
    m = _copy(onx)
    gemm = [n for n in m.graph.node if n.op_type == "Gemm"][1]
    cast = onnx.helper.make_node("Cast", [gemm.input[0]], ["as_int"], to=onnx.TensorProto.INT64)
    gemm.input[0] = "as_int"
    m.graph.node.insert(list(m.graph.node).index(gemm), cast)
    return m


@pytest.mark.parametrize(
    "defect, message",
    [
        (_cycle, "cycle or is not in topological order"),
        (_reads_nobody, "'computed_by_nobody', which no node computes"),
        (_opset_1, "imports ai.onnx opset 1: onnxruntime runs opset 7 and above"),
        (_bad_function, "onnxruntime cannot build a session for the ONNX model"),
    ],
)
def test_a_model_that_cannot_run_is_refused(small, defect, message):
    ep, onx, x = small
    with pytest.raises(SbsInputError, match=message):
        list(run_aligned(ep, defect(onx), x))


def test_a_node_onnxruntime_refuses_is_that_nodes_record(small):
    """A refusal about one node (here its types) is not the whole model's: the node's
    record says it, the culprit is that node, the rest is compared."""
    ep, onx, x = small
    summary = summarize(list(run_aligned(ep, _types_clash(onx), x)))
    assert summary.verdict == "fail"
    assert summary.culprit.onnx_op_type == "Gemm" and "Type Error" in summary.culprit.why


def test_cli_exit_2_for_a_model_that_cannot_run(small, tmp_path):
    ep, onx, x = small
    torch.export.save(ep, str(tmp_path / "m.pt2"))
    onnx.save(_reads_nobody(onx), str(tmp_path / "m.onnx"))
    torch.save(x, str(tmp_path / "in.pt"))
    out = _cli(
        "run", "--ep", "m.pt2", "--onnx", "m.onnx", "--inputs", "in.pt", "-o", "r.jsonl",
        cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 2, out.stderr
    assert "computed_by_nobody" in out.stderr and "Traceback" not in out.stderr


def test_not_computed_values_are_never_a_pass(small):
    ep, onx, x = small
    records = list(run_aligned(ep, onx, x))
    assert summarize(records).verdict == "pass"
    node = next(r for r in records if r.kind == "node")
    node.status, node.passed = STATUS_NOT_COMPUTED, None
    summary = summarize(records)
    assert summary.totals["not_computed"] == 1
    assert summary.verdict == "incomplete"
    assert "1 not computed" in summary.to_text()


def test_functions_calling_each_other_too_deep_are_refused(small):
    """Checked without recursion before onnxruntime walks it (which crashed at 10,000)."""
    from onnx_sbs_nb.align.source.model_check import MAX_NESTING, check_nesting

    ep, onx, x = small
    m = _copy(onx)
    depth = 10_000
    fns = []
    for k in range(depth):
        body = (
            onnx.helper.make_node(f"f{k + 1}", ["x"], ["y"], domain="deep")
            if k + 1 < depth
            else onnx.helper.make_node("Identity", ["x"], ["y"])
        )
        fns.append(
            onnx.helper.make_function(
                "deep", f"f{k}", ["x"], ["y"], [body], [onnx.helper.make_opsetid("", 18)]
            )
        )
    m.functions.extend(fns)
    m.opset_import.append(onnx.helper.make_opsetid("deep", 1))
    out = m.graph.output[0].name
    last = m.graph.node[-1]
    last.output[0] = "before_deep"
    m.graph.node.append(onnx.helper.make_node("f0", ["before_deep"], [out], domain="deep"))
    with pytest.raises(SbsInputError, match=f"more than {MAX_NESTING} deep"):
        check_nesting(m)
    with pytest.raises(SbsInputError, match="more than .* deep"):
        list(run_aligned(ep, m, x))
    # a function calling itself is refused too
    loop = _copy(onx)
    body = onnx.helper.make_node("g", ["x"], ["y"], domain="deep")
    loop.functions.append(
        onnx.helper.make_function(
            "deep", "g", ["x"], ["y"], [body], [onnx.helper.make_opsetid("", 18)]
        )
    )
    with pytest.raises(SbsInputError, match="calls itself"):
        check_nesting(loop)


def test_subgraphs_nested_too_deep_are_refused():
    from onnx_sbs_nb.align.source.model_check import MAX_NESTING, check_nesting

    out = [onnx.helper.make_tensor_value_info("o", onnx.TensorProto.FLOAT, [])]
    leaf = onnx.helper.make_graph([onnx.helper.make_node("Identity", ["v"], ["o"])], "g", [], out)
    inner = leaf
    for _ in range(MAX_NESTING + 1):
        node = onnx.helper.make_node("If", ["c"], ["o"], then_branch=inner, else_branch=leaf)
        inner = onnx.helper.make_graph([node], "g", [], out)
    with pytest.raises(SbsInputError, match="nests subgraphs more than"):
        check_nesting(onnx.helper.make_model(inner))


# ---- 7. a custom runner's wrong return is that node's record --------------------------


def _runner_returning(bad):
    """Runs every node with the ONNX reference evaluator, but Relu returns ``bad``."""
    from onnx.reference import ReferenceEvaluator

    def run(node, inputs):
        if node.op_type == "Relu":
            return bad
        g = onnx.helper.make_graph(
            [node],
            "one",
            [onnx.helper.make_tensor_value_info(n, 1, None) for n in node.input if n],
            [onnx.helper.make_tensor_value_info(n, 1, None) for n in node.output],
        )
        ref = ReferenceEvaluator(onnx.helper.make_model(g))
        return ref.run(None, {n: v for n, v in zip(node.input, inputs) if n})

    return run


@pytest.mark.parametrize(
    "bad, message",
    [
        ([], "returned 0 values for the node's 1 outputs"),
        ([np.zeros((3, 8), np.float32)] * 2, "returned 2 values"),
        (["relu"], "returned a str for output"),
        (None, "'NoneType' object is not iterable"),
    ],
)
def test_custom_runner_wrong_return_is_a_record(small, bad, message):
    ep, onx, x = small
    records = list(run_aligned(ep, onx, x, runner=_runner_returning(bad)))
    relu = next(r for r in records if r.onnx_op_type == "Relu")
    assert relu.status == STATUS_ERROR and message in relu.error
    # the run went on to the last node, fed from torch's value of the broken one
    assert records[-1].kind == "output" and records[-1].passed is True
    assert summarize(records).verdict == "fail"


def test_custom_runner_wrong_shape_is_a_record(small):
    ep, onx, x = small
    records = list(run_aligned(ep, onx, x, runner=_runner_returning([np.zeros(3, np.float32)])))
    relu = next(r for r in records if r.onnx_op_type == "Relu")
    assert relu.failed and relu.status == "shape_mismatch"
    assert records[-1].kind == "output"


if os.name != "posix":  # links and FIFOs
    pytestmark = pytest.mark.skip("POSIX only")


# ---- 5. initializers whose data does not match their dims ------------------------------


def _weight(onx):
    m = _copy(onx)
    return m, next(t for t in m.graph.initializer if len(t.dims) == 2)


def _huge_dims(onx):
    m, w = _weight(onx)
    w.dims[:] = [1_000_000, 1_000_000]  # 1e12 elements declared, 256 floats held
    return m, w.name


def _short_raw(onx):
    m, w = _weight(onx)
    arr = onnx.numpy_helper.to_array(w)
    w.ClearField("float_data")
    w.raw_data = arr.tobytes()[:-4]
    return m, w.name


def _short_typed(onx):
    m, w = _weight(onx)
    arr = onnx.numpy_helper.to_array(w)
    w.ClearField("raw_data")
    w.float_data[:] = arr.reshape(-1)[:-1].tolist()
    return m, w.name


@pytest.mark.parametrize("corrupt", [_huge_dims, _short_raw, _short_typed])
def test_initializer_data_not_matching_dims_is_refused(small, tmp_path, corrupt):
    ep, onx, x = small
    m, name = corrupt(onx)
    with pytest.raises(SbsInputError, match=f"tensor '{name}' of the ONNX model declares"):
        list(run_aligned(ep, m, x))
    torch.export.save(ep, str(tmp_path / "m.pt2"))
    onnx.save(m, str(tmp_path / "m.onnx"))
    torch.save(x, str(tmp_path / "in.pt"))
    out = _cli("run", "--ep", "m.pt2", "--onnx", "m.onnx", "--inputs", "in.pt", cwd=tmp_path)
    assert out.returncode == 2 and name in out.stderr, out.stderr


# ---- 3. NaN or inf in the inputs is named -----------------------------------------------


def test_nonfinite_inputs_are_named_in_the_summary(small, tmp_path):
    ep, onx, (x,) = small
    bad = x.clone()
    bad[0, 0], bad[1, 1] = float("nan"), float("inf")
    records = list(run_aligned(ep, onx, (bad,)))
    summary = summarize(records)
    assert summary.nonfinite_inputs == ["x"]
    inp = next(r for r in records if r.kind == "input")
    assert "1 NaN, 1 inf of 24" in inp.comment
    text = summary.to_text()
    assert "non-finite inputs: x" in text and "NaN/inf patterns" in text
    assert summary.to_dict()["nonfinite_inputs"] == ["x"]
    # the records carry it: a report rebuilt from the .jsonl says it too
    from onnx_sbs_nb.reports.report import read_records, write_jsonl

    write_jsonl(records, tmp_path / "r.jsonl")
    assert summarize(read_records(tmp_path / "r.jsonl")).nonfinite_inputs == ["x"]
    # finite inputs: nothing said
    assert summarize(list(run_aligned(ep, onx, (x,)))).nonfinite_inputs == []


# ---- 8 and 12. inputs the program cannot take are named ---------------------------------


def test_meta_input_is_named(small):
    ep, onx, (x,) = small
    with pytest.raises(SbsInputError, match="input 'x' is on the meta device"):
        list(run_aligned(ep, onx, (x.to("meta"),)))


def test_keyword_input_of_a_positional_program_is_bound_by_name(small):
    # as Python binds forward(**batch): a dict of inputs (a DataLoader's batch) names them
    ep, onx, (x,) = small
    by_name = list(run_aligned(ep, onx, (), {"x": x}))
    by_place = list(run_aligned(ep, onx, (x,)))
    assert [(r.onnx_name, r.status, r.err_abs) for r in by_name] == [
        (r.onnx_name, r.status, r.err_abs) for r in by_place
    ]
    with pytest.raises(SbsInputError, match=r"it takes \[\] by keyword and \['x'\] positionally"):
        list(run_aligned(ep, onx, (), {"y": x}))


class _TwoInputs(torch.nn.Module):
    def forward(self, ids, x):
        return torch.tanh(x) * ids.float().unsqueeze(-1)


def test_many_inputs_given_as_dicts_are_bound_by_name():
    ids, x = torch.tensor([1, 2, 3]), torch.randn(3, 4)
    ep, onx = export(_TwoInputs(), (ids, x))
    batches = [{"x": x + k, "ids": ids + k} for k in range(3)]  # another order than forward's
    s = summarize(list(run_aligned(ep, onx, inputs=batches)))
    assert s.verdict == "pass", s.to_text()
    # a name the program does not have is still refused, naming it
    with pytest.raises(SbsInputError, match="not inputs of the program"):
        list(run_aligned(ep, onx, (), {"ids": ids, "y": x}))


# ---- 6. inputs nested 100,000 deep ------------------------------------------------------


def _deep_inputs(path: Path, depth: int = 100_000) -> None:
    """A torch.save file holding a list nested ``depth`` deep (torch.save itself would
    overflow the C stack writing it: the pickle is written by hand)."""
    import io
    import zipfile

    buf = io.BytesIO()
    torch.save([], buf)
    src = zipfile.ZipFile(io.BytesIO(buf.getvalue()))
    with zipfile.ZipFile(path, "w") as out:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename.endswith("data.pkl"):
                data = b"\x80\x02" + b"]" * (depth + 1) + b"a" * depth + b"."
            out.writestr(info, data)


def test_inputs_nested_too_deep_are_refused(small, tmp_path):
    ep, onx, x = small
    _deep_inputs(tmp_path / "deep.pt")
    with pytest.raises(SbsInputError, match="nested more than 64"):
        list(run_aligned(ep, onx, tmp_path / "deep.pt"))
    torch.export.save(ep, str(tmp_path / "m.pt2"))
    onnx.save(onx, str(tmp_path / "m.onnx"))
    out = _cli("run", "--ep", "m.pt2", "--onnx", "m.onnx", "--inputs", "deep.pt", cwd=tmp_path)
    assert out.returncode == 2 and "nested more than 64" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


# ---- 4. a .pt2 zip bomb -----------------------------------------------------------------


@pytest.mark.parametrize(
    "member, message",
    [
        ("data/weights/weight_0", "need 256"),
        ("data/sample_inputs/model.pt", "inflates .* bytes from"),
    ],
)
def test_pt2_zip_bomb_is_refused_before_inflating(small, tmp_path, member, message):
    import zipfile

    ep, onx, x = small
    good = tmp_path / "good.pt2"
    torch.export.save(ep, str(good))
    bomb = tmp_path / "bomb.pt2"
    size = 64 << 20  # 64 MiB of zeros in about 64 KB
    with zipfile.ZipFile(good) as z, zipfile.ZipFile(bomb, "w") as out:
        for info in z.infolist():
            if info.filename.endswith(member):
                zinfo = zipfile.ZipInfo(info.filename)
                zinfo.compress_type = zipfile.ZIP_DEFLATED
                with out.open(zinfo, "w") as f:
                    chunk = bytes(1 << 20)
                    for _ in range(size >> 20):
                        f.write(chunk)
            else:
                out.writestr(info, z.read(info))
    assert bomb.stat().st_size < 1 << 20
    with pytest.raises(SbsInputError, match=message):
        list(run_aligned(bomb, onx, x))
    with pytest.raises(SbsInputError, match=message):
        list(run_aligned(bomb, onx, x, trust_pickles=True))
    list(run_aligned(good, onx, x))  # the archive torch wrote loads


# ---- 13. an external-data location or a model that is a FIFO -----------------------------


@pytest.mark.timeout(120)
def test_fifo_external_data_is_named_not_missing(small, tmp_path):
    from onnx_sbs_nb.align.source.loading import load_onnx_model

    ep, onx, x = small
    path = tmp_path / "m.onnx"
    onnx.save(
        _copy(onx), str(path), save_as_external_data=True, location="w.data", size_threshold=0
    )
    (tmp_path / "w.data").unlink()
    os.mkfifo(tmp_path / "w.data")
    for defer in (True, False):  # optimize= runs load every weight: nothing may block
        with pytest.raises(SbsInputError, match="which is not a regular file"):
            load_onnx_model(path, defer_weights=defer)
    with pytest.raises(SbsInputError, match="which is not a regular file"):
        list(run_aligned(ep, path, x))
    os.mkfifo(tmp_path / "fifo.onnx")
    with pytest.raises(SbsInputError, match="is not a regular file"):
        load_onnx_model(tmp_path / "fifo.onnx")


# ---- 14. someone else's replay bundle, opened without running it -------------------------


def test_load_replay_runs_nothing_from_the_bundle(broken, tmp_path):
    from onnx_sbs_nb import load_replay
    from onnx_sbs_nb.notebook.session import SbsSession

    ep, onx, x = broken
    s = SbsSession(ep, onx, x, batch_interval=0, replay_root=tmp_path / "replays").start()
    gemm = [r for r in s.records if r.onnx_op_type == "Gemm"][1]  # the broken one
    bundle = s.save_replay(gemm).bundle
    marker = tmp_path / "ran"
    (bundle / "replay.py").write_text(f"open({str(marker)!r}, 'w').write('pwned')\n")
    replay = load_replay(bundle)
    assert replay.op_type == "Gemm" and replay.outputs
    out = replay.outputs[0]
    assert out["has_expected"] and out["torch_inputs"]["max_abs"] > 1e-3  # alpha 1.01
    assert "max abs" in replay.to_text()
    cli = _cli("replay", str(bundle), cwd=tmp_path)
    assert cli.returncode == 0, cli.stderr
    assert "Gemm" in cli.stdout and "max abs" in cli.stdout
    assert not marker.exists()
    # the bundle's README (its script's header) says whose bundles the script is for
    from onnx_sbs_nb.align.post.replay import TEMPLATE

    assert "for bundles you made yourself" in Path(TEMPLATE).read_text()


def test_load_replay_refuses_a_hostile_bundle(broken, tmp_path):
    from onnx_sbs_nb import load_replay
    from onnx_sbs_nb.notebook.session import SbsSession

    ep, onx, x = broken
    s = SbsSession(ep, onx, x, batch_interval=0, replay_root=tmp_path / "replays").start()
    bundle = s.save_replay(next(r for r in s.records if r.onnx_op_type == "Gemm")).bundle
    # a model whose weight lives outside the bundle
    m = onnx.load(str(bundle / "model.onnx"))
    w = m.graph.initializer[0]
    w.ClearField("raw_data")
    w.data_location = onnx.TensorProto.EXTERNAL
    w.external_data.add(key="location", value="../../outside.bin")
    onnx.save(m, str(bundle / "model.onnx"))
    with pytest.raises(SbsInputError, match="outside the model's folder"):
        load_replay(bundle)
    cli = _cli("replay", str(bundle), cwd=tmp_path)
    assert cli.returncode == 2 and "outside the model's folder" in cli.stderr
    # a pickle that would run code
    bundle2 = s.save_replay(next(r for r in s.records if r.onnx_op_type == "Relu")).bundle

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'ran'}",))

    torch.save({"x": Evil()}, str(bundle2 / "expected.pt"))
    with pytest.raises(SbsInputError, match="was not loaded"):
        load_replay(bundle2)
    assert not (tmp_path / "ran").exists()


# ---- 11. Ctrl-C while the command imports ------------------------------------------------


def test_ctrl_c_during_startup_exits_130_without_traceback(tmp_path):
    """A KeyboardInterrupt raised by the import of torch (where Ctrl-C lands in the first
    seconds of a run), made certain by an import hook instead of a timed signal."""
    code = (
        "import sys\n"
        "class Hook:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch':\n"
        "            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, Hook())\n"
        "from onnx_sbs_nb.__main__ import main\n"
        "sys.exit(main())\n"
    )
    for name in ("a.pt2", "b.onnx", "c.pt"):  # the paths are checked before torch loads
        (tmp_path / name).write_bytes(b"")
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            code,
            "run",
            "--ep",
            "a.pt2",
            "--onnx",
            "b.onnx",
            "--inputs",
            "c.pt",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert out.returncode == 130, out.stderr
    assert "interrupted" in out.stderr and "Traceback" not in out.stderr


# ---- 9. a full disk while records stream --------------------------------------------------

_LIMITED = (
    "import resource, signal, sys\n"
    "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"  # a write past the limit fails, EFBIG
    "limit = int(sys.argv.pop(1))\n"
    "resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))\n"
    "from onnx_sbs_nb.__main__ import main\n"
    "sys.exit(main())\n"
)


@pytest.fixture
def saved(small, tmp_path):
    ep, onx, x = small
    torch.export.save(ep, str(tmp_path / "m.pt2"))
    onnx.save(onx, str(tmp_path / "m.onnx"))
    torch.save(x, str(tmp_path / "in.pt"))
    return tmp_path


def test_full_disk_while_records_stream(saved):
    """No file may grow past 3,000 bytes (the records take about 8,000): as a full disk."""
    import json

    run = ["run", "--ep", "m.pt2", "--onnx", "m.onnx", "--inputs", "in.pt", "--no-progress"]
    out = subprocess.run(
        [sys.executable, "-c", _LIMITED, "3000", *run, "-o", "run.jsonl", "report.xlsx"],
        capture_output=True,
        text=True,
        cwd=saved,
        timeout=300,
    )
    assert out.returncode == 2, out.stderr
    assert "cannot write records to 'run.jsonl'" in out.stderr
    assert "Traceback" not in out.stderr and "Exception ignored" not in out.stderr
    lines = (saved / "run.jsonl").read_text().splitlines()
    assert all(json.loads(line) for line in lines)  # every line whole
    trailer = json.loads(lines[-1])
    assert trailer["onnx_sbs"] == "end" and trailer["completion"]["state"] == "incomplete"
    assert trailer["records"] == len(lines) - 2 > 0
    back = _cli("report", "run.jsonl", "-o", "back.html", cwd=saved)
    assert back.returncode == 3 and "INCOMPLETE" in back.stdout


def test_full_disk_for_the_xlsx_names_it_and_leaves_nothing(broken, tmp_path):
    import gc
    import resource
    import signal

    from onnx_sbs_nb.reports.report import write_xlsx

    ep, onx, x = broken
    records = list(run_aligned(ep, onx, x))
    unraisable = []
    hook, sys.unraisablehook = sys.unraisablehook, unraisable.append
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1000, hard))
        with pytest.raises(OSError, match="File too large"):
            write_xlsx(records, tmp_path / "report.xlsx")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)
        gc.collect()
        sys.unraisablehook = hook
    assert unraisable == []  # no "Exception ignored in ZipFile.__del__"
    assert list(tmp_path.iterdir()) == []


# ---- 10. two runs writing the same files --------------------------------------------------


def test_a_second_run_on_the_same_outputs_is_refused(saved):
    from onnx_sbs_nb.files import output_lock

    run = ["run", "--ep", "m.pt2", "--onnx", "m.onnx", "--inputs", "in.pt", "--no-progress"]
    with output_lock(saved / "run.jsonl"):  # a run writing run.jsonl now
        out = _cli(*run, "-o", "run.jsonl", cwd=saved)
    assert out.returncode == 2
    assert "'run.jsonl' is being written by another run" in out.stderr
    assert not (saved / "run.jsonl").exists()  # nothing of the other run's file touched
    again = _cli(*run, "-o", "run.jsonl", cwd=saved)
    assert again.returncode == 0, again.stderr


class NanToNum(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(torch.relu(torch.nan_to_num(x, nan=0.0)))


def test_first_nan_on_one_side_only_is_the_answer():
    """The export skips nan_to_num: with a NaN input the Relu is the first value NaN on
    one side only, and the summary names it as the culprit, and the NaN input."""
    torch.manual_seed(0)
    x = torch.randn(3, 8)
    ep = torch.export.export(NanToNum(), (x,))
    onx = _copy(torch.onnx.export(ep, (x,), dynamo=True, verbose=False).model_proto)
    relu = next(n for n in onx.graph.node if n.op_type == "Relu")
    relu.input[0] = onx.graph.input[0].name
    x[0, 0] = float("nan")
    summary = summarize(list(run_aligned(ep, onx, (x,))), node_inputs=onx)
    assert summary.verdict == "fail" and summary.nonfinite_inputs == ["x"]
    assert summary.first_nan.onnx_op_type == "Relu"
    assert summary.culprit is not None and summary.culprit.onnx_op_type == "Relu"


def test_two_models_refuse_a_model_that_cannot_run(small):
    from onnx_sbs_nb import run_aligned_onnx

    _, onx, (x,) = small
    with pytest.raises(SbsInputError, match="which no node computes"):
        list(run_aligned_onnx(onx, _reads_nobody(onx), {"x": x.numpy()}))
    m, name = _short_raw(onx)
    with pytest.raises(SbsInputError, match=f"tensor '{name}' of the ONNX model declares"):
        list(run_aligned_onnx(m, onx, {"x": x.numpy()}))
