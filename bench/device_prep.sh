#!/usr/bin/env bash
# Fills build/device_deps with what bench/device.sh needs when the GPU image lacks it:
# pjrt_c_api.h (from the xla-cpu-pjrt wheel) and pure-Python pybind11 and pytest.
# Run it on the build machine, then carry build/device_deps to the device run.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${TORCHTPU_PYTHON:-/work/main/.venv/bin/python}
DEPS=build/device_deps
rm -rf "$DEPS" && mkdir -p "$DEPS/site" "$DEPS/include"
INC=$("$PY" -c "import os, xla_plugins.xla_cpu_pjrt as m; print(os.path.join(os.path.dirname(m.__file__), 'include'))")
cp "$INC"/*.h "$DEPS/include/"
SITE=$("$PY" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
for m in pybind11 pytest _pytest pluggy iniconfig py.py pygments packaging; do
  cp -r "$SITE/$m" "$DEPS/site/"
done
find "$DEPS" -name __pycache__ -prune -exec rm -rf {} +
du -sh "$DEPS"
