#!/usr/bin/env bash
# TorchTPU on an NVIDIA GPU, in one command (under 8 minutes on the 16-core H200 image):
# builds the extension against this machine's torch (cmake + ninja), then runs
# bench/device.py: a device-independent test subset with TORCHTPU_PLATFORM=cuda,
# training parity (MLP, GPT), a GPT-2 124M bf16 step in Strict, Fused and
# torch.compile(backend="tpu") next to PyTorch CUDA eager and Inductor, and bf16
# matmul TFLOP/s. Writes device_bench.md/.json and build.log to $OUT (or --out DIR).
#
#   bench/device.sh                      # on the GPU machine
#   bench/device.sh --cpu-dry-run        # here: tiny sizes on the CPU plugin
#
# Environment: TORCHTPU_PYTHON (default /opt/torch/.venv/bin/python3 when present),
# TORCHTPU_BUILD_DIR (default build/device), TORCHTPU_DEVICE_SECONDS (the whole run's
# wall time, default 480). When the image lacks pybind11, pytest or
# pjrt_c_api.h, bench/device_prep.sh fills build/device_deps on the build machine;
# carry that folder along.
set -uo pipefail
cd "$(dirname "$0")/.."
START=$(date +%s)

PY=${TORCHTPU_PYTHON:-}
if [ -z "$PY" ]; then
  for c in /opt/torch/.venv/bin/python3 .venv/bin/python /work/main/.venv/bin/python python3; do
    if [ -x "$c" ]; then PY=$c; break; fi
  done
  [ -z "$PY" ] && PY=$(command -v python3)
fi
OUT_DIR=${OUT:-bench/out}
DRY=0
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT_DIR=$2; shift 2 ;;
    --cpu-dry-run) DRY=1; ARGS+=("$1"); shift ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
mkdir -p "$OUT_DIR"
BUILD=${TORCHTPU_BUILD_DIR:-build/device}
DEPS=build/device_deps

fail() {  # Writes the failure where the table would have been.
  { echo "# TorchTPU device benchmark: FAILED"; echo; echo "$1"; echo; echo '```';
    tail -n 40 "$OUT_DIR/build.log" 2>/dev/null; echo '```'; } > "$OUT_DIR/device_bench.md"
  cat "$OUT_DIR/device_bench.md"
  exit 1
}

# pybind11 / pytest from the carried folder only when the image has none.
if ! "$PY" -c "import pybind11, pytest" 2>/dev/null; then
  [ -d "$DEPS/site" ] || fail "pybind11 or pytest is missing for $PY and $DEPS/site is absent (run bench/device_prep.sh where they are installed, and carry $DEPS)"
  export PYTHONPATH="$PWD/$DEPS/site${PYTHONPATH:+:$PYTHONPATH}"
fi
CMAKE_ARGS=()
if ! "$PY" -c "import xla_plugins.xla_cpu_pjrt" 2>/dev/null; then
  [ -f "$DEPS/include/pjrt_c_api.h" ] || fail "pjrt_c_api.h: xla-cpu-pjrt is not installed for $PY and $DEPS/include is absent (run bench/device_prep.sh, carry $DEPS)"
  CMAKE_ARGS+=("-DPJRT_INCLUDE_DIR=$PWD/$DEPS/include")
fi

echo "[device.sh] python: $PY ($("$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__)' 2>&1))"
echo "[device.sh] building into $BUILD (log: $OUT_DIR/build.log)"
JOBS=${TORCHTPU_BUILD_JOBS:-$(nproc)}
{
  cmake -S . -B "$BUILD" -G Ninja -DPython3_EXECUTABLE="$PY" -DTORCHTPU_BUILD_TESTS=OFF \
    -DTORCHTPU_TORCH_WITHOUT_CMAKE=ON -DCMAKE_INTERPROCEDURAL_OPTIMIZATION=OFF \
    -DCMAKE_BUILD_TYPE=Release "${CMAKE_ARGS[@]}" &&
  cmake --build "$BUILD" -j "$JOBS"
} > "$OUT_DIR/build.log" 2>&1 || fail "the build failed (cmake/ninja, log below)"
BUILD_S=$(( $(date +%s) - START ))
echo "[device.sh] built in ${BUILD_S} s"

# What is left of the 8 minutes, or of TORCHTPU_DEVICE_SECONDS (a dry run on a small
# CPU machine gets longer).
TOTAL=${TORCHTPU_DEVICE_SECONDS:-480}
if [ "$DRY" = 1 ]; then BUDGET=900; else BUDGET=$(( TOTAL - 15 - BUILD_S )); fi
[ "$BUDGET" -lt 120 ] && BUDGET=120
"$PY" bench/device.py --out "$OUT_DIR" --budget "$BUDGET" "${ARGS[@]}"
