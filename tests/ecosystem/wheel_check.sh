#!/usr/bin/env bash
# `make wheel-check`: what a user types to install torchtpu, in a new venv, then
# tests/ecosystem/wheel_smoke.py from outside the source tree. A report, not part of
# `make test`: the build (in pip's isolated build env, so ccache rarely hits) takes a while.
#   tests/ecosystem/wheel_check.sh [VENV]        (default build/wheel-venv; removed first)
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
VENV=${1:-$REPO/build/wheel-venv}
PYTHON=${PYTHON:-python3.11}
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
t0=$(date +%s)
# The CPU torch first: its wheel index differs from PyPI's, which serves a CUDA build.
"$VENV/bin/pip" install -q torch==2.13.0
t1=$(date +%s)
# as a user types it: no GoogleTest suite (`make` exports TORCHTPU_BUILD_TESTS=ON)
env -u TORCHTPU_BUILD_TESTS "$VENV/bin/pip" install -q "$REPO"
t2=$(date +%s)
cd "$(mktemp -d)"
"$VENV/bin/python" "$REPO/tests/ecosystem/wheel_smoke.py"
t3=$(date +%s)
echo "wheel-check: torch $((t1 - t0)) s, pip install . $((t2 - t1)) s, smoke $((t3 - t2)) s"
