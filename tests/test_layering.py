"""One engine, many views: the engine never imports view code."""

from __future__ import annotations

import subprocess
import sys


def test_engine_imports_no_view_code():
    code = (
        "import sys\n"
        "import numpy, onnx, onnxruntime, torch\n"
        "before = set(sys.modules)\n"  # whatever torch itself pulls in is not ours
        "import onnx_sbs_nb.align.run, onnx_sbs_nb.align.devices, onnx_sbs_nb.align.blame.summary\n"
        "import onnx_sbs_nb.evaluator.evaluator\n"
        "new = set(sys.modules) - before\n"
        "bad = sorted(m for m in new if m.split('.')[0] in ('tqdm', 'pandas', 'plotly',\n"
        "             'anywidget', 'ipywidgets', 'IPython') or m in ('onnx_sbs_nb.notebook.widget',\n"
        "             'onnx_sbs_nb.cli.main', 'onnx_sbs_nb.notebook.session', 'onnx_sbs_nb.reports.report'))\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", out.stdout


# The floors of the package, bottom first, read from its folders: the modules directly in
# the package are the bottom floor (records, errors, dtypes, ...), each folder is a floor
# of its own, and the entry points (``__init__``, ``__main__``) are the top.  A module
# imports only from its floor or below.
FOLDER_FLOORS = ("native", "compare", "evaluator", "align", "reports", "notebook", "cli")
ENTRY_POINTS = ("__init__", "__main__")
MAX_ROOT_MODULES = 12


def _package_root():
    from pathlib import Path

    import onnx_sbs_nb

    return Path(onnx_sbs_nb.__file__).parent


def _floor(module: str) -> int:
    """The floor of ``onnx_sbs_nb.<module>``: 0 for a module at the root, the folder's
    place in FOLDER_FLOORS for one in a folder, the top for the entry points."""
    head = module.split(".")[0]
    if head in ENTRY_POINTS:
        return len(FOLDER_FLOORS) + 1
    if head in FOLDER_FLOORS:
        return FOLDER_FLOORS.index(head) + 1
    if (_package_root() / f"{head}.py").is_file():
        return 0
    raise AssertionError(
        f"onnx_sbs_nb.{module}: folder {head}/ has no floor: add it to FOLDER_FLOORS"
    )


def test_every_folder_is_a_floor_and_the_root_stays_small():
    root = _package_root()
    folders = {p.name for p in root.iterdir() if (p / "__init__.py").is_file()}
    assert folders == set(FOLDER_FLOORS), f"folders {sorted(folders)}: give each a floor"
    modules = sorted(p.stem for p in root.glob("*.py"))
    assert len(modules) <= MAX_ROOT_MODULES, (
        f"{len(modules)} modules at the package root ({', '.join(modules)}): the root is "
        "the bottom floor; put the rest in the folder of what they do"
    )


def _imports(type_checking: bool = False) -> dict[str, set[str]]:
    """Every module of the package and the package modules it imports (anywhere in it,
    function-level imports included; TYPE_CHECKING-only imports only with
    ``type_checking``)."""
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
            if (
                not type_checking
                and isinstance(node, ast.If)
                and "TYPE_CHECKING" in ast.unparse(node.test)
            ):
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


# The wings of the engine, bottom first (DESIGN.md, "The engine in wings"); the modules
# directly in align/ (the run kinds users call) are the top.
ALIGN_WINGS = ("source", "pairing", "judge", "engine", "post", "blame")

# Known imports that break a rule, each with the issue that removes it: the test fails
# when one is gone, so the list cannot go stale.
KNOWN: dict[tuple[str, str], str] = {}


def _wing(module: str) -> int | None:
    """The wing of an ``align`` module (len(ALIGN_WINGS) for the run kinds), None outside."""
    parts = module.split(".")
    if parts[0] != "align" or len(parts) == 1:
        return None
    return ALIGN_WINGS.index(parts[1]) if parts[1] in ALIGN_WINGS else len(ALIGN_WINGS)


def test_every_align_module_is_in_a_wing():
    from pathlib import Path

    import onnx_sbs_nb

    align = Path(onnx_sbs_nb.__file__).parent / "align"
    folders = {p.name for p in align.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == set(ALIGN_WINGS), f"align/ has folders {sorted(folders)}: add them"


def test_no_import_climbs_a_wing_of_the_engine():
    """A module in a wing of align imports only from its wing, the wings below and the
    floors below align (TYPE_CHECKING imports included: a type hint up is a climb too)."""
    bad, used = [], set()
    for m, targets in _imports(type_checking=True).items():
        if _wing(m) is None:
            continue
        for t in targets:
            if _wing(t) is None or _wing(t) <= _wing(m):
                continue
            if (m, t) in KNOWN:
                used.add((m, t))
            else:
                bad.append(f"{m} (wing {_wing(m)}) imports {t} (wing {_wing(t)})")
    assert not bad, "\n".join(sorted(bad))
    assert used == set(KNOWN), f"fixed, take them out of KNOWN: {sorted(set(KNOWN) - used)}"


def _cycles(graph: dict[str, set[str]]) -> list[str]:
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
    return [" -> ".join(c) for c in cycles]


def test_no_import_cycle():
    cycles = _cycles(_imports())
    assert not cycles, "\n".join(cycles)


def test_no_import_cycle_with_type_hints():
    """TYPE_CHECKING imports count too: a cycle through a type hint is still two modules
    that cannot be understood one without the other."""
    graph = _imports(type_checking=True)
    for m, t in KNOWN:
        graph[m].discard(t)
    cycles = _cycles(graph)
    assert not cycles, "\n".join(cycles)


def test_the_run_kinds_come_from_the_package_root():
    """Users import the run kinds and their options from ``onnx_sbs_nb``, wherever the
    engine keeps them."""
    code = (
        "import onnx_sbs_nb as s\n"
        "from onnx_sbs_nb.align import bisect, devices, run, two_models\n"
        "from onnx_sbs_nb.align.engine.options import RunOptions\n"
        "assert s.run_aligned is run.run_aligned and s.AlignedRun is run.AlignedRun\n"
        "assert s.run_aligned_onnx is two_models.run_aligned_onnx\n"
        "assert s.run_onnx_on_two_devices is devices.run_onnx_on_two_devices\n"
        "assert s.bisect_optimizers is bisect.bisect_optimizers and s.RunOptions is RunOptions\n"
        "assert all(hasattr(s, n) for n in s.__all__)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# The preparation of the program (align/source/prepare/), in the order its steps run: a
# step imports only the steps before it, and program.py, the last, runs them.
PREPARE_WALK = (
    "unsupported",
    "exporter_ops",
    "graphs",
    "input_writes",
    "aliasing",
    "written_views",
    "supported",
    "expansions",
    "promotions",
    "passes",
    "reproduce",
    "check",
    "model_names",
    "prepared",
    "exporter",
    "program",
)
_PREPARE = "align.source.prepare"


def _back_edges(graph: dict[str, set[str]], walk: tuple[str, ...]) -> list[str]:
    """Imports between the walk's modules that go to a step at or after the importer's."""
    step = {f"{_PREPARE}.{m}": k for k, m in enumerate(walk)}
    return sorted(
        f"{m} (step {step[m]}) imports {t} (step {step[t]})"
        for m, targets in graph.items()
        if m in step
        for t in targets
        if t in step and step[t] >= step[m]
    )


def test_the_preparation_is_walked_in_one_direction():
    """Every module of source/prepare/ is a step of PREPARE_WALK, imports only the steps
    before it (function-level and type-hint imports included), and is under 700 lines."""
    from pathlib import Path

    import onnx_sbs_nb

    folder = Path(onnx_sbs_nb.__file__).parent / "align" / "source" / "prepare"
    modules = {p.stem for p in folder.glob("*.py") if p.stem != "__init__"}
    assert modules == set(PREPARE_WALK), f"not in PREPARE_WALK: {modules ^ set(PREPARE_WALK)}"
    graph = _imports(type_checking=True)
    assert not graph[_PREPARE], "the package's __init__ imports no step: each loads on use"
    bad = _back_edges(graph, PREPARE_WALK)
    assert not bad, "\n".join(bad)
    # the check sees a back edge (graphs importing reproduce)
    planted = {**graph, f"{_PREPARE}.graphs": {f"{_PREPARE}.reproduce"}}
    assert _back_edges(planted, PREPARE_WALK) == [
        f"{_PREPARE}.graphs (step 2) imports {_PREPARE}.reproduce (step 10)"
    ]
    long = [p.name for p in folder.glob("*.py") if len(p.read_text().splitlines()) >= 700]
    assert not long, f"over 700 lines: {long}"
