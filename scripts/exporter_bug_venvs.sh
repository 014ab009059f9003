#!/usr/bin/env bash
# Creates one venv per old onnxscript release that had a real exporter bug reproduced by
# tests/corpus/test_exporter_bugs.py: .venv-onnxscript-<ver> with torch 2.13.0 (the CPU
# build, pinned: an unpinned torch pulls a multi-GB CUDA build) and onnxscript==<ver>.
# Idempotent: a venv whose onnxscript already has the right version is left alone.
# Usage: bash scripts/exporter_bug_venvs.sh [VERSION ...]   (default: every version below)
set -euo pipefail
cd "$(dirname "$0")/.."
# keep in sync with OLD_RELEASES in tests/corpus/exporter_bugs.py
versions=("$@")
# 0.7.0: the first corpus's five bugs, gemm_beta_bn, linear_1d_weight; 0.6.0: the last
# release before the SDPA fully-masked-row regression (the correct export of that bug)
[ ${#versions[@]} -eq 0 ] && versions=(0.7.0 0.6.0)
for ver in "${versions[@]}"; do
  venv=".venv-onnxscript-${ver}"
  if [ -x "$venv/bin/python" ] &&
    "$venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('onnxscript') != '$ver')" 2>/dev/null; then
    echo "$venv: ready"
    continue
  fi
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q "torch==2.13.0" "onnxscript==${ver}"
  echo "$venv: created ($("$venv/bin/python" -c 'import onnxscript, torch; print(onnxscript.__version__, torch.__version__)'))"
done
