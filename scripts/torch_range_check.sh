#!/usr/bin/env bash
# The engine's test slice on the oldest torch the package declares, or on another one:
#   bash scripts/torch_range_check.sh            (the floors of pyproject.toml: torch and
#                                                 onnxscript at their lowest)
#   bash scripts/torch_range_check.sh 2.15.0     (a given torch, onnxscript's floor)
# Each torch gets its own venv, .venv-torch-<version>, made once (pip, from PyPI) with this
# checkout installed without its build hooks. The newest torch is checked on a GPU machine
# as a CUDA build by scripts/gpu_check.sh; here the slice is the engine's own tests (no
# browser, no model zoo), so a run fits in minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
floor() {  # the lowest version pyproject.toml allows for a dependency
  python3 - "$1" <<'PY'
import re, sys, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
name = sys.argv[1]
spec = next(d for d in deps if re.split(r"[<>=!~ \[;]", d)[0].lower() == name)
print(re.search(r">=\s*([0-9][0-9a-zA-Z.+]*)", spec).group(1))
PY
}
torch_version=${1:-$(floor torch)}
onnxscript_version=$(floor onnxscript)
venv=".venv-torch-${torch_version}"
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install -q --upgrade pip
  "$venv/bin/python" -m pip install -q "torch==${torch_version}" "onnxscript==${onnxscript_version}" \
    onnx onnxruntime numpy ml_dtypes pandas tqdm openpyxl pytest pytest-timeout
fi
"$venv/bin/python" -c 'import onnxscript, torch; print("torch", torch.__version__, "onnxscript", onnxscript.__version__)'
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} ONNX_SBS_SKIP_JS_BUILD=1
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider -x \
  tests/align/engine/test_engine_models.py tests/align/engine/test_engine_behaviour.py \
  tests/align/source/test_specialized.py tests/align/pairing/test_onnx_pairing.py \
  tests/align/blame/test_summary.py tests/compare/test_diff.py
