"""The rough edges a new user meets (issue 48): each test is one of the rows."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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
    from onnx_sbs_nb import cli

    assert cli.runs_a_command(["demo", "-o", "x"])
    assert not cli.runs_a_command(["--help"])
    assert not cli.runs_a_command(["run", "--atol", "x"])
