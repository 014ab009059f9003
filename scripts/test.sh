#!/usr/bin/env bash
# Sets up everything the test suite needs on a fresh machine, then runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
# the old-exporter venv of tests/corpus/test_exporter_bugs.py (real bugs of onnxscript 0.7.0)
bash scripts/exporter_bug_venvs.sh
# Browser tests drive Debian's Chromium (Playwright's own browser downloads do not work here).
if ! command -v chromium >/dev/null 2>&1; then
  if [ "$(id -u)" = "0" ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  else
    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  fi
fi
.venv/bin/python -m ruff check onnx_sbs_nb tests benchmarks
# CI=true: a missing JS bundle or browser fails the tests instead of skipping them
export CI="${CI:-true}"
exec .venv/bin/python -m pytest -q -p no:cacheprovider --timeout=900 "$@"
