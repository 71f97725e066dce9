#!/usr/bin/env bash
# On the GPU host: unpack whatever parts of .gpu/ this and earlier calls carried (bundle.sh made them)
# and write /tmp/lt-env.sh to source. Idempotent: each call runs it again; what is there stays.
#   /tmp/ortgpu   onnxruntime-gpu (sm_90) on PYTHONPATH: the builder's optimizer and parity use it too (the
#                 host's onnxruntime 1.30 does not fuse Attention on transformers 5's export; 1.31 does)
#   /tmp/site     gateway, builder and loadtest wheels for the host's python3 (PYTHONPATH)
#   /tmp/stubenv  the python-backend stub's environment: numpy 1.26 + onnxruntime-gpu, then the host's packages
#                 (the 2.51 stub needs numpy 1; the host's transformers needs its numpy 2: kept apart)
#   /tmp/infenv   infinity-emb's environment: it and its server's packages, then the host's (transformers 5)
#   /tmp/ts       tritonserver (PyPI wheel binary) with the Python 3.12 stub
set -euo pipefail
root=${GPU_BUNDLE:-.gpu}
py=python3
pyver=$($py -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
install() {  # install TARGET WHEEL...
  local target=$1; shift
  [ "$#" -gt 0 ] && $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$target" "$@"
}
host_site=$($py -c 'import site; print(site.getsitepackages()[0])')
venv() {  # venv DIR: a venv whose own packages come first, then the host's; prints its site-packages
  # The host's python3 is itself a venv (/opt/torch/.venv): --system-site-packages would reach the
  # base interpreter's packages only, so a .pth file appends the host venv's site-packages instead.
  [ -x "$1/bin/python3" ] || $py -m venv --without-pip "$1"
  echo "$host_site" > "$1/lib/python$pyver/site-packages/zz-host.pth"
  echo "$1/lib/python$pyver/site-packages"
}
if [ -f "$root/a/ort-sm90.tar.xz" ] && [ ! -d /tmp/ortgpu/onnxruntime ]; then
  mkdir -p /tmp/ortgpu && xz -T0 -dc "$root/a/ort-sm90.tar.xz" | tar -C /tmp/ortgpu -x
fi
for part in a b; do
  if ls "$root/$part"/whl/*.whl >/dev/null 2>&1; then
    install /tmp/site $(ls "$root/$part"/whl/*.whl | grep -v -e /numpy-)
  fi
done
# numpy 1 travels in b; kept in /tmp so that a later call carrying only a can still make the stub's venv
mkdir -p /tmp/lt-keep && cp -n "$root"/*/whl/numpy-1.*.whl /tmp/lt-keep/ 2>/dev/null || true
numpy1=$(ls /tmp/lt-keep/numpy-1.*.whl 2>/dev/null | head -1 || true)
if [ -f "$root/b/tritonserver.tar.xz" ] && [ ! -x /tmp/ts/pytriton/tritonserver/bin/tritonserver ]; then
  mkdir -p /tmp/ts && xz -T0 -dc "$root/b/tritonserver.tar.xz" | tar -C /tmp/ts -x
  cp /tmp/ts/pytriton/tritonserver/python_backend_stubs/$pyver/triton_python_backend_stub \
     /tmp/ts/pytriton/tritonserver/backends/python/
fi
if [ -n "$numpy1" ] && [ -d /tmp/ortgpu/onnxruntime ] && [ ! -d /tmp/stubenv/lib ]; then
  stub_site=$(venv /tmp/stubenv)
  install "$stub_site" "$numpy1"
  cp -r /tmp/ortgpu/. "$stub_site/"  # shadows the host's CPU onnxruntime in this environment only
fi
if ls "$root"/c/whl/*.whl >/dev/null 2>&1 && [ ! -d /tmp/infenv/lib ]; then
  inf_site=$(venv /tmp/infenv)
  install "$inf_site" "$root"/c/whl/*.whl
  # transformers 5 has no batch_encode_plus, which infinity calls only to count tokens
  grep -rl '_infinity_tokenizer\.batch_encode_plus(' "$inf_site/infinity_emb" | xargs -r sed -i 's/_infinity_tokenizer\.batch_encode_plus(/_infinity_tokenizer(/'
fi
nvlibs=$(find "$host_site/nvidia" -name 'lib*.so*' -printf '%h\n' 2>/dev/null | sort -u | paste -sd: || true)
cat > /tmp/lt-env.sh <<ENV
export TRITONSERVER_HOME_DIR=/tmp/ts/pytriton/tritonserver
export TRITON_STUB_PYTHON=$([ -d /tmp/stubenv/lib ] && echo /tmp/stubenv/bin/python3)
export INFINITY_PYTHON=$([ -d /tmp/infenv/lib ] && echo /tmp/infenv/bin/python3)
export ORT_GPU_PATH=/tmp/ortgpu
export PYTHONPATH=$PWD:/tmp/site$([ -d /tmp/ortgpu/onnxruntime ] && echo :/tmp/ortgpu)
export LD_LIBRARY_PATH=$nvlibs:\${LD_LIBRARY_PATH:-}
export PATH=/tmp/site/bin:\$PATH
export PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1
ENV
echo "wrote /tmp/lt-env.sh ($(ls -d /tmp/ortgpu /tmp/site /tmp/stubenv /tmp/infenv /tmp/ts 2>/dev/null | tr '\n' ' '))"
