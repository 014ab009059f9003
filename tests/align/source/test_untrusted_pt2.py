"""Hostile .pt2 files: loading one never runs code from it (issue 12, items 1 and 7).

Each file is a real ``torch.export.save`` archive with one part rewritten the way an
attacker would; the code it carries creates a marker file, which must not exist after
the load was refused.  The same files load (and run their code) with
``trust_pickles=True``: the marker test can fail.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import zipfile

import pytest
import torch

from onnx_sbs_nb.align.source.loading import load_exported_program, load_inputs
from onnx_sbs_nb.align.source.untrusted_pt2 import unsafe_guard, unsafe_sym_expr
from onnx_sbs_nb.cli.main import EXIT_BAD_INPUT, main
from onnx_sbs_nb.errors import SbsInputError


class _Tiny(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)

    def forward(self, x):
        return self.lin(x).relu()


class _Opens:
    """Unpickles into ``open(path, "w")``: the file appears if the pickle runs."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture(scope="module")
def good_pt2(tmp_path_factory):
    path = tmp_path_factory.mktemp("pt2") / "good.pt2"
    torch.export.save(torch.export.export(_Tiny(), (torch.randn(2, 3),)), path)
    return path


def _rewrite(src, dst, edits: dict[str, object], extra: dict[str, bytes] | None = None):
    """Copy of archive ``src`` where each entry ending with a key of ``edits`` is replaced
    (bytes) or transformed (a function of the old bytes); ``extra`` adds entries."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        root = zin.namelist()[0].split("/")[0]
        for info in zin.infolist():
            data = zin.read(info.filename)
            for suffix, edit in edits.items():
                if info.filename.endswith(suffix):
                    data = edit(data) if callable(edit) else edit
            zout.writestr(info, data)
        for name, data in (extra or {}).items():
            zout.writestr(f"{root}/{name}", data)
    return dst


def _saved(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _edit_json(fn):
    def edit(data: bytes) -> bytes:
        d = json.loads(data)
        fn(d)
        return json.dumps(d).encode()

    return edit


def _sample_inputs(marker):
    return {"data/sample_inputs/model.pt": _saved(((torch.randn(2, 3), _Opens(marker)), {}))}


def _pickled_weight(marker):
    def config(d):
        d["config"]["lin.weight"]["use_pickle"] = True

    return {
        "data/weights/model_weights_config.json": _edit_json(config),
        "data/weights/weight_0": _saved(_Opens(marker)),
    }


def _opaque_constant(marker):
    def config(d):
        d["config"]["evil"] = {
            "path_name": "opaque_obj_0",
            "is_param": False,
            "use_pickle": True,
            "tensor_meta": None,
        }

    return {"data/constants/model_constants_config.json": _edit_json(config)}, {
        "data/constants/opaque_obj_0": pickle.dumps(_Opens(marker))
    }


def _symbolic_expression(marker):
    def model(d):
        sizes = next(iter(d["graph_module"]["graph"]["tensor_values"].values()))["sizes"]
        expr = f"open({marker!r}, 'w') and 2"
        sizes[0] = {"as_expr": {"expr_str": expr, "hint": {"as_int": 2}}}

    return {"models/model.json": _edit_json(model)}


HOSTILE = {
    "sample inputs": (_sample_inputs, "calls io.open"),
    "pickled weight": (_pickled_weight, "calls io.open"),
    "opaque constant": (_opaque_constant, "opaque object"),
    "symbolic expression": (_symbolic_expression, "symbolic shape expression"),
}


def _hostile(kind, good, tmp_path):
    marker = str(tmp_path / f"marker-{kind.replace(' ', '_')}")
    made = HOSTILE[kind][0](marker)
    edits, extra = made if isinstance(made, tuple) else (made, None)
    return _rewrite(good, tmp_path / "hostile.pt2", edits, extra), marker


@pytest.mark.parametrize("kind", list(HOSTILE))
def test_hostile_pt2_is_refused_and_runs_nothing(kind, good_pt2, tmp_path, capfd):
    pt2, marker = _hostile(kind, good_pt2, tmp_path)
    with pytest.raises(SbsInputError) as err:
        load_exported_program(pt2)
    message = str(err.value)
    assert HOSTILE[kind][1] in message and "trust_pickles=True" in message, message
    assert not os.path.exists(marker)
    # the command line: exit 2, the reason, the way out, no traceback
    for name in ("m.onnx", "i.pt"):
        (tmp_path / name).write_bytes(b"x")
    argv = ["run", "--ep", str(pt2), "--onnx", str(tmp_path / "m.onnx")]
    code = main([*argv, "--inputs", str(tmp_path / "i.pt"), "--no-progress"])
    out, errors = capfd.readouterr()
    assert code == EXIT_BAD_INPUT and "--trust-pickles" in errors
    assert "Traceback" not in errors + out
    assert not os.path.exists(marker)
    # trusting the file loads it as torch does: the marker test can fail
    try:
        load_exported_program(pt2, trust_pickles=True)
    except SbsInputError:
        pass  # the program may not survive the edit; its code ran before that
    assert os.path.exists(marker)


def test_guard_code_from_the_file_is_dropped(good_pt2, tmp_path):
    """torch exec()s guard strings when the program is unlifted (run_decompositions)."""
    marker = tmp_path / "marker-guard"

    def model(d):
        d["guards_code"] = [f"open({str(marker)!r}, 'w') is not None"]

    pt2 = _rewrite(good_pt2, tmp_path / "guard.pt2", {"models/model.json": _edit_json(model)})
    ep = load_exported_program(pt2)
    assert ep._guards_code == []
    ep.run_decompositions()  # what preparing the program for pairing does
    assert not marker.exists()
    trusted = load_exported_program(pt2, trust_pickles=True)
    trusted.run_decompositions()
    assert marker.exists()  # the guard is real code: trusting the file runs it


def test_compiled_model_in_archive_is_refused(good_pt2, tmp_path):
    pt2 = _rewrite(
        good_pt2, tmp_path / "aoti.pt2", {}, {"data/aotinductor/model/model.so": b"\x7fELF"}
    )
    with pytest.raises(SbsInputError, match="AOTInductor.*native code"):
        load_exported_program(pt2)


def test_real_programs_still_load(tmp_path):
    """Dynamic shapes write srepr expressions and guards: both are plain arithmetic."""

    class TwoInputs(torch.nn.Module):
        def forward(self, x, y):
            return x * 2 + y

    dim = torch.export.Dim("b", min=2, max=64)
    ep = torch.export.export(
        TwoInputs(),
        (torch.randn(4, 3), torch.randn(4, 3)),
        dynamic_shapes={"x": {0: dim}, "y": {0: dim}},
    )
    path = tmp_path / "dynamic.pt2"
    torch.export.save(ep, path)
    loaded = load_exported_program(path)
    assert loaded._guards_code == ep._guards_code != []
    x = torch.randn(5, 3)
    torch.testing.assert_close(loaded.module()(x, x), x * 3)
    assert os.environ.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD") is None  # restored


@pytest.mark.parametrize(
    "expr, safe",
    [
        ("Add(Mul(Integer(2), Symbol('s17', positive=True, integer=True)), Integer(1))", True),
        ("Mul(Float('1.5', precision=53), Symbol('s0'))", True),
        ("FloorDiv(s0, 2) <= oo", True),
        ("Max('open(1)')", False),  # sympy's classes sympify their string arguments
        ("exec(chr(112))", False),
        ("sympify('x')", False),
        ("Symbol('x').args", False),
        ("__import__", False),
        ("lambda: 1", False),
    ],
)
def test_symbolic_expressions_checked(expr, safe):
    assert (unsafe_sym_expr(expr, {"FloorDiv": None}) is None) is safe


@pytest.mark.parametrize(
    "guard, safe",
    [
        ("L['y'].size()[0] == L['x'].size()[0]", True),
        ("2 <= L['x'].size()[0] and max(L['x'].size()[1], 3) < 64", True),
        ("open('f', 'w') is not None", False),
        ("L['x'].__class__", False),
        ("torch.load('x')", False),
        ("""L['a"+str(1)+"'] == 1""", False),  # would close the quotes of torch's message
    ],
)
def test_guards_checked(guard, safe):
    assert (unsafe_guard(guard) is None) is safe


def test_garbage_pt2_is_bad_input_without_traceback(tmp_path, capfd):
    """torch logs a traceback for a file it cannot read: the user sees one line."""
    garbage = tmp_path / "garbage.pt2"
    garbage.write_bytes(os.urandom(256))
    empty_zip = tmp_path / "empty.pt2"
    with zipfile.ZipFile(empty_zip, "w") as z:
        z.writestr("x/hello.txt", "hi")
    for name in ("m.onnx", "i.pt"):
        (tmp_path / name).write_bytes(b"x")
    for bad in (garbage, empty_zip):
        argv = ["run", "--ep", str(bad), "--onnx", str(tmp_path / "m.onnx")]
        code = main([*argv, "--inputs", str(tmp_path / "i.pt"), "--no-progress"])
        out, errors = capfd.readouterr()
        assert code == EXIT_BAD_INPUT
        assert "is not an exported program" in errors
        assert "Traceback" not in errors + out and len(errors.splitlines()) == 1, errors


def test_inputs_file_needing_code_is_refused(tmp_path):
    marker = tmp_path / "marker-inputs"
    path = tmp_path / "inputs.pt"
    torch.save((torch.randn(2), _Opens(str(marker))), path)
    with pytest.raises(SbsInputError, match="trust_pickles=True"):
        load_inputs(str(path), None)
    assert not marker.exists()
    load_inputs(str(path), None, trust_pickles=True)
    assert marker.exists()


def test_trust_pickles_flag_reaches_the_options():
    from onnx_sbs_nb.cli.main import build_parser
    from onnx_sbs_nb.notebook.run_args import options_from_args

    argv = ["run", "--ep", "m.pt2", "--onnx", "m.onnx", "--inputs", "i.pt"]
    assert options_from_args(build_parser().parse_args(argv)).trust_pickles is False
    trusted = options_from_args(build_parser().parse_args([*argv, "--trust-pickles"]))
    assert trusted.trust_pickles is True and trusted.to_dict()["trust_pickles"] is True


def test_the_torch_internals_wrapped_are_there():
    """The loader wraps names inside torch: a torch that renames them must fail here, not
    silently load files the old way."""
    import importlib
    import inspect

    from onnx_sbs_nb.align.source import untrusted_pt2

    package = importlib.import_module(untrusted_pt2.PACKAGE_MODULE)
    serialize = importlib.import_module(untrusted_pt2.SERIALIZE_MODULE)
    assert package.pickle is pickle and callable(package._load_aoti)
    assert "pickle.loads" in inspect.getsource(package._load_constants)
    assert "sympy.sympify" in inspect.getsource(serialize.GraphModuleDeserializer._parse_sym_expr)
    assert "typing.get_type_hints" in inspect.getsource(serialize._dict_to_dataclass)
    assert "TORCH_FORCE_WEIGHTS_ONLY_LOAD" in inspect.getsource(torch.serialization.load)
    assert "_guards_code" in inspect.getsource(torch.export.ExportedProgram.__init__)


def test_type_hints_are_asked_once_per_schema_class(tmp_path, monkeypatch):
    """The deserializer asks ``typing.get_type_hints`` for every object it rebuilds; the
    loader answers each schema class once, and the program is the one torch loads."""
    import typing

    class Chain(torch.nn.Module):
        def forward(self, x):
            for _ in range(40):
                x = torch.sin(x) * 1.5
            return x

    path = tmp_path / "chain.pt2"
    torch.export.save(torch.export.export(Chain(), (torch.randn(2, 3),)), path)
    calls: list = []
    real = typing.get_type_hints

    def counting(obj, *args, **kwargs):
        calls.append(obj)
        return real(obj, *args, **kwargs)

    monkeypatch.setattr(typing, "get_type_hints", counting)
    ours = load_exported_program(path)
    asked = len(calls)
    calls.clear()
    theirs = torch.export.load(path)
    assert len(calls) > 4 * asked  # torch alone asks per object (80 nodes here)
    assert asked == len(set(calls)) and asked > 0  # ours: once per class
    calls.clear()
    trusted = load_exported_program(path, trust_pickles=True)
    assert len(calls) == asked and str(trusted.graph) == str(theirs.graph)
    assert str(ours.graph) == str(theirs.graph)
    assert ours.graph_signature == theirs.graph_signature
    x = torch.randn(2, 3)
    torch.testing.assert_close(ours.module()(x), theirs.module()(x))


def test_a_torch_log_line_with_bad_arguments_does_not_fail_the_load():
    """torch 2.13 logs its weights-only fallback with one argument for two %s: the filter
    that re-logs torch's lines at debug level must not raise (a filter's exception reaches
    the code that logged, and the trusted load of a .pt2 with a cache object failed)."""
    import logging

    from onnx_sbs_nb.align.source.untrusted_pt2 import _TORCH_LOGGERS, torch_logs_to_debug

    with torch_logs_to_debug():
        for name in _TORCH_LOGGERS:
            logging.getLogger(name).warning("loaded %s after initial failure: %s", tuple)
