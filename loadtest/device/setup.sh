#!/usr/bin/env bash
# On the GPU host: unpack what the device calls carried (see README.md) and write /tmp/lt-env.sh.
#   PARTS=/tmp/ltg  (ortpart.0..3, tritonserver.tar.xz, perf_analyzer*.whl)   WHEELS=.gpu/whl
set -euo pipefail
parts=${PARTS:-/tmp/ltg}
wheels=${WHEELS:-.gpu/whl}
if [ ! -d /tmp/ortgpu/onnxruntime ]; then
  cat "$parts"/ortpart.* > /tmp/ort.tar.xz
  [ -f "$parts/ort.sha256" ] && (cd /tmp && sed 's#/tmp/ort.tar.xz#ort.tar.xz#' "$parts/ort.sha256" | sha256sum -c -)
  mkdir -p /tmp/ortgpu && xz -T0 -dc /tmp/ort.tar.xz | tar -C /tmp/ortgpu -x && rm -f /tmp/ort.tar.xz
fi
if [ ! -x /tmp/ts/pytriton/tritonserver/bin/tritonserver ]; then
  mkdir -p /tmp/ts && xz -T0 -dc "$parts/tritonserver.tar.xz" | tar -C /tmp/ts -x
  cp /tmp/ts/pytriton/tritonserver/python_backend_stubs/3.12/triton_python_backend_stub /tmp/ts/pytriton/tritonserver/backends/python/
fi
site=$(python3 -c 'import site; print(site.getsitepackages()[0])')
# The python-backend stub ignores PYTHONPATH and imports from the site-packages of the python3 on
# PATH: numpy 1 and onnxruntime-gpu go INTO that environment (the machine is bare after the lease).
if [ -d "$wheels" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --force-reinstall "$wheels"/numpy-*.whl
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    $(ls "$wheels"/*.whl "$parts"/*.whl | grep -v -e /numpy- -e /perf_analyzer)
fi
if [ ! -f "$site/onnxruntime/capi/libonnxruntime_providers_cuda.so" ]; then
  python3 -m pip uninstall -y -q onnxruntime || true
  cp -r /tmp/ortgpu/. "$site/"
fi
if ls "$parts"/perf_analyzer-*.whl >/dev/null 2>&1 && [ ! -d /tmp/pa ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/pa "$parts"/perf_analyzer-*.whl
fi
nvlibs=$(find "$site/nvidia" -name 'lib*.so*' -printf '%h\n' 2>/dev/null | sort -u | paste -sd: || true)
cat > /tmp/lt-env.sh <<ENV
export TRITONSERVER_HOME_DIR=/tmp/ts/pytriton/tritonserver
export PYTHONPATH=$PWD:/tmp/site:/tmp/pa
export TRITON_PYTHONPATH=/tmp/site
export LD_LIBRARY_PATH=$nvlibs:\${LD_LIBRARY_PATH:-}
export PATH=/tmp/site/bin:/tmp/pa/bin:\$PATH
export PYTHONUNBUFFERED=1
ENV
echo "wrote /tmp/lt-env.sh"
