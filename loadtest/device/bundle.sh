#!/usr/bin/env bash
# Here (not on the GPU host): make what the GPU host lacks, in parts that each fit one device call
# (a call carries at most 64 MiB with the working tree; see README.md). Idempotent.
#   .gpu/b  tritonserver (PyPI wheel binary) + gateway/builder/loadtest wheels  call 1 (setup only)
#           (pydantic too) + numpy 1.26.4 for the python-backend stub
#   .gpu/a  onnxruntime-gpu 1.31.1 (CUDA provider pruned to sm_90)              call 2: the model step
#           (a is 61 MB: beside it only the working tree fits)
#   .gpu/c  infinity-emb 0.0.78, the versions it pins, its server's packages    call 3: infinity-emb
#           and numpy 1.26.4 (a call of its own: it needs nothing of a or b)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${GPU_BUNDLE:-.gpu}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
download() {  # download DEST SPEC...: cp312 manylinux wheels, no dependencies
  local dest=$1; shift
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any -d "$dest" "$@"
}
mkdir -p "$out/a/whl" "$out/b/whl" "$out/c/whl"
if [ ! -f "$out/a/ort-sm90.tar.xz" ]; then
  download "$tmp" onnxruntime-gpu==1.31.1
  mkdir "$tmp/ort" && (cd "$tmp/ort" && unzip -q ../onnxruntime_gpu-*.whl)
  # The python module links ORT statically; the C-API library and the (TensorRT-less) TRT provider are unused.
  rm -f "$tmp"/ort/onnxruntime/capi/libonnxruntime.so.* "$tmp"/ort/onnxruntime/capi/libonnxruntime_providers_tensorrt.so
  python3 loadtest/device/prune_fatbin.py "$tmp/ort/onnxruntime/capi/libonnxruntime_providers_cuda.so" --keep 90
  tar -C "$tmp/ort" -c onnxruntime onnxruntime_gpu-1.31.1.dist-info | xz -9 -T0 > "$out/a/ort-sm90.tar.xz"
fi
download "$out/b/whl" pydantic==2.14.3 pydantic-core==2.50.4 annotated-types==0.7.0 typing-inspection==0.4.5
download "$out/b/whl" fastapi==0.165.0 starlette==1.10.0 uvicorn==0.54.0 httptools==0.9.0 pydantic-settings==2.16.3 \
  python-dotenv==1.2.4 orjson==3.13.0 tritonclient==2.73.0 python-rapidjson==1.25 opentelemetry-api==1.45.2 \
  numpy==1.26.4 swagger-ui-bundle==1.1.0 sniffio==1.3.1 cachetools==8.0.2 redis==8.1.0
if [ ! -f "$out/b/tritonserver.tar.xz" ]; then
  home=$(PYTHON=${PYTHON:-.venv/bin/python} scripts/fetch-tritonserver | tail -1)
  base=$(dirname "$(dirname "$home")")  # keep the wheel's layout: pytriton/tritonserver beside nvidia_pytriton.libs
  tar -C "$base" -c pytriton/tritonserver/bin pytriton/tritonserver/backends pytriton/tritonserver/caches \
    pytriton/tritonserver/python_backend_stubs/3.12 nvidia_pytriton.libs | xz -9 -T0 > "$out/b/tritonserver.tar.xz"
fi
# infinity-emb runs over the host's own torch, transformers 5 and sentence-transformers 6 (its pins on numpy<2 and
# transformers 4 would break the host's scipy): only its server's packages and pydantic travel (setup.sh patches it).
rm -rf "$out/c/whl" && mkdir -p "$out/c/whl"
download "$out/c/whl" infinity-emb==0.0.78 fastapi==0.118.3 starlette==0.48.0 uvicorn==0.32.1 httptools==0.7.1 \
  orjson==3.11.3 prometheus-fastapi-instrumentator==7.1.0 pydantic==2.14.3 pydantic-core==2.50.4 annotated-types==0.7.0 \
  typing-inspection==0.4.5
du -sh "$out"/a "$out"/b "$out"/c
