"""The declared version ranges hold: each floor is one a check runs, and no lower than
what the code is known to need."""

from __future__ import annotations

import re
import subprocess
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# what the code needs, measured (issue 37): the preparation patches torch's
# backed_size_oblivious (missing before 2.9, silently); torch 2.11+ exports through
# onnxscript's torch_2_11 API (first in 0.6; with 0.5.7 every export fails); torch 2.9.1
# to 2.15.0 pass with onnxscript 0.7.2; the model zoo fails with transformers 4.57
NEEDED = {"torch": (2, 9, 1), "onnxscript": (0, 7, 2)}
NEEDED_TEST = {"transformers": (5, 0)}


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text.split("+")[0])[:3])


def _floors(specs: list[str]) -> dict[str, tuple[int, ...]]:
    out = {}
    for spec in specs:
        name = re.split(r"[<>=!~ \[;]", spec)[0].lower()
        m = re.search(r">=\s*([0-9][0-9a-zA-Z.+]*)", spec)
        if m:
            out[name] = _version(m.group(1))
    return out


def _project() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_floors_are_what_the_code_needs():
    project = _project()
    floors = _floors(project["dependencies"])
    for name, needed in NEEDED.items():
        assert floors[name] >= needed, f"{name}>={floors[name]}: the code needs {needed}"
    for extra in ("test", "bench"):
        extra_floors = _floors(project["optional-dependencies"][extra])
        for name, needed in {**NEEDED, **NEEDED_TEST}.items():
            if name in extra_floors:
                assert extra_floors[name] >= needed, (extra, name, extra_floors[name])


def test_this_environment_is_inside_the_ranges():
    """The suite itself runs on versions the ranges allow: what it proves is declared."""
    project = _project()
    specs = project["dependencies"] + project["optional-dependencies"]["test"]
    for name, floor in _floors(specs).items():
        try:
            have = _version(metadata.version(name))
        except metadata.PackageNotFoundError:
            continue
        assert have >= floor, f"{name} {have} is below the declared floor {floor}"


def test_the_range_check_installs_the_declared_floors():
    """scripts/torch_range_check.sh reads its versions from pyproject.toml: the floor it
    runs the engine's tests on is the floor users get."""
    script = (ROOT / "scripts" / "torch_range_check.sh").read_text()
    floor_fn = script.split("floor() {", 1)[1].split("PY\n}", 1)[0].split("<<'PY'\n", 1)[1]
    project_floors = _floors(_project()["dependencies"])
    for name in ("torch", "onnxscript"):
        out = subprocess.run(
            ["python3", "-", name], input=floor_fn, capture_output=True, text=True, cwd=ROOT
        )
        assert out.returncode == 0, out.stderr
        assert _version(out.stdout.strip()) == project_floors[name]
