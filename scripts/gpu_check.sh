#!/usr/bin/env bash
# The prepared GPU check of the CUDA paths, in one call, for a machine with an NVIDIA GPU:
#   bash scripts/gpu_check.sh            (logs in $OUT, or ./gpu-check)
# It uses the python3 already there (with a CUDA build of torch, onnx, onnxruntime,
# onnxscript, transformers, pytest) and this checkout on PYTHONPATH: nothing is installed.
# 1. every test marked `cuda` (engine, evaluator end-to-end models against eager CUDA,
#    placement of shapes on the host, replay bundles of CUDA values, widget session rerun);
# 2. the evaluator benchmark on CUDA, the issue's reference Llama (hidden 1024, 8 layers,
#    seq 256, batch 2) included, with ratios against eager torch on CUDA;
# 3. the engine on CUDA (run_aligned warm, with and without own errors) against eager.
# Its own timeouts (200 s + 200 s + 150 s) keep it under a device call's 10-minute limit.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
LOGS=${OUT:-gpu-check}
mkdir -p "$LOGS"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
$PY - <<'PY' 2>&1 | tee "$LOGS/env.log"
import onnx, onnxruntime, torch
assert torch.cuda.is_available(), "no CUDA device visible to torch: this check needs a GPU"
print("torch", torch.__version__, "onnx", onnx.__version__, "onnxruntime", onnxruntime.__version__)
print("device", torch.cuda.get_device_name(), "capability", torch.cuda.get_device_capability())
PY
[ "${PIPESTATUS[0]}" -eq 0 ] || exit 1
# the modules holding CUDA tests: none of them needs the widget's packages
timeout "${TEST_TIMEOUT:-200}" $PY -m pytest -q -rs -m cuda -p no:cacheprovider \
    tests/align/test_devices.py tests/align/test_prior_art_sbs.py tests/align/post/test_replay.py \
    tests/evaluator/test_evaluator_core.py tests/evaluator/test_evaluator_models.py \
    tests/evaluator/test_kernels_nn.py tests/notebook/test_session.py \
    2>&1 | tee "$LOGS/pytest.log"
rc=${PIPESTATUS[0]}
timeout "${BENCH_TIMEOUT:-200}" $PY benchmarks/bench_evaluator.py --device cuda --big \
    --repeat "${REPEAT:-30}" 2>&1 | grep -v "Skipping torchvision" | tee "$LOGS/bench.log"
timeout "${ENGINE_TIMEOUT:-150}" $PY benchmarks/bench_engine_device.py --device cuda \
    2>&1 | grep -v "Skipping torchvision" | tee "$LOGS/engine.log"
exit "$rc"
