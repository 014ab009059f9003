#!/usr/bin/env bash
# Creates .venv and installs the package with the extras named in $1 (default: widget,report).
# Safe to rerun: it only installs what is missing.  Each step says what it installs, and
# pip's own lines (what it downloads, with its progress bar) show that it is progressing.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-widget,report}"
TORCH=2.13.0
step() { echo "setup: $*"; }

step "virtual environment .venv"
python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
# torch pinned: 2.13.0 is the CPU build; an unpinned torch pulls a multi-GB CUDA build.
if .venv/bin/python -c "import sys, torch; sys.exit(torch.__version__.split('+')[0] != '$TORCH')" 2>/dev/null; then
    step "torch $TORCH already installed"
else
    step "torch $TORCH (the largest download: the longest step)"
    .venv/bin/python -m pip install "torch==$TORCH"
fi
# the JS bundle (onnx_sbs_nb/static/widget.js) is built by the package build from js/
step "onnx_sbs_nb and its dependencies (onnx, onnxruntime, extras: $extras)"
.venv/bin/python -m pip install -e ".[${extras}]" | { grep -v '^Requirement already satisfied' || true; }
step "done: .venv/bin/onnx-sbs is ready"
