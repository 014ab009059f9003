#!/usr/bin/env bash
# Creates .venv and installs the package with the extras named in $1 (default: widget,report).
# Safe to rerun: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-widget,report}"
python3 -m venv .venv
# torch pinned: 2.13.0 is the CPU build; an unpinned torch pulls a multi-GB CUDA build.
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q "torch==2.13.0"
# the JS bundle (onnx_sbs_nb/static/widget.js) is built by the package build from js/
.venv/bin/python -m pip install -q -e ".[${extras}]"
