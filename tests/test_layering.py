"""One engine, many views: the engine never imports view code."""

from __future__ import annotations

import subprocess
import sys


def test_engine_imports_no_view_code():
    code = (
        "import sys\n"
        "import numpy, onnx, onnxruntime, torch\n"
        "before = set(sys.modules)\n"  # whatever torch itself pulls in is not ours
        "import onnx_sbs_nb.align.run, onnx_sbs_nb.align.devices, onnx_sbs_nb.summary\n"
        "import onnx_sbs_nb.evaluator.evaluator\n"
        "new = set(sys.modules) - before\n"
        "bad = sorted(m for m in new if m.split('.')[0] in ('tqdm', 'pandas', 'plotly',\n"
        "             'anywidget', 'ipywidgets', 'IPython') or m in ('onnx_sbs_nb.widget',\n"
        "             'onnx_sbs_nb.cli', 'onnx_sbs_nb.session', 'onnx_sbs_nb.report'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", out.stdout


# The floors of the package, bottom first: a module imports only from its floor or below.
FLOORS: list[tuple[str, ...]] = [
    (
        "errors",
        "dtypes",
        "records",
        "convert",
        "device",
        "completion",
        "files",
        "native",
        "external",
        "command_gc",
        "tolerances",
        "png",
        "measures",
    ),
    ("diff", "verdict_policy"),
    ("evaluator",),
    ("align",),
    ("summary", "model_explorer"),
    (
        "session",
        "report",
        "view_state",
        "report_html",
        "run_args",
        "demo",
        "notebook_export",
        "precision_report",
    ),
    ("widget", "magic", "cli", "cli_precision", "__main__", "__init__"),
]


def _floor(module: str) -> int:
    """The floor of ``onnx_sbs_nb.<module>`` (its first component decides)."""
    head = module.split(".")[0]
    for k, names in enumerate(FLOORS):
        if head in names:
            return k
    raise AssertionError(f"module onnx_sbs_nb.{module} has no floor in FLOORS: add it")


def _imports() -> dict[str, set[str]]:
    """Every module of the package and the package modules it imports (anywhere in it,
    function-level imports included; TYPE_CHECKING-only imports left out)."""
    import ast
    from pathlib import Path

    import onnx_sbs_nb

    root = Path(onnx_sbs_nb.__file__).parent
    graph: dict[str, set[str]] = {}
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).with_suffix("")
        parts = list(rel.parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        name = ".".join(parts) or "__init__"
        tree = ast.parse(path.read_text())
        type_only = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                type_only.update(id(n) for n in ast.walk(node))
        found: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in type_only:
                continue
            if isinstance(node, ast.ImportFrom) and node.level:
                base = parts if is_pkg else parts[:-1]
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                if node.module:
                    found.add(".".join([*base, *node.module.split(".")]) or "__init__")
                else:  # from . import a, b: the modules a and b
                    found.update(".".join([*base, a.name]) for a in node.names)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "onnx_sbs_nb."
            ):
                found.add(node.module.removeprefix("onnx_sbs_nb."))
        graph[name] = {f for f in found if f != name}
    return graph


def test_no_import_runs_back_up_a_floor():
    bad = [
        f"{m} (floor {_floor(m)}) imports {t} (floor {_floor(t)})"
        for m, targets in _imports().items()
        for t in targets
        if _floor(t) > _floor(m)
    ]
    assert not bad, "\n".join(sorted(bad))


def test_no_import_cycle():
    graph = _imports()
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(graph.get(m, ())):
            if t not in graph:
                continue
            if state.get(t) == 1:
                cycles.append(path[path.index(t) :] + [t] if t in path else [m, t])
            elif t not in state:
                visit(t, [*path, t])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert not cycles, "\n".join(" -> ".join(c) for c in cycles)
