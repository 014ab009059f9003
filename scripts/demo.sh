#!/usr/bin/env bash
# Sets up .venv and runs the bundled example: a small model with a known discrepancy,
# exported, compared node by node, reports written to ./sbs-demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh widget,report
exec .venv/bin/onnx-sbs demo -o "${1:-sbs-demo}"
