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
  numpy==1.26.4 swagger-ui-bundle==1.1.0 sniffio==1.3.1
if [ ! -f "$out/b/tritonserver.tar.xz" ]; then
  home=$(PYTHON=${PYTHON:-.venv/bin/python} scripts/fetch-tritonserver | tail -1)
  base=$(dirname "$(dirname "$home")")  # keep the wheel's layout: pytriton/tritonserver beside nvidia_pytriton.libs
  tar -C "$base" -c pytriton/tritonserver/bin pytriton/tritonserver/backends pytriton/tritonserver/caches \
    pytriton/tritonserver/python_backend_stubs/3.12 nvidia_pytriton.libs | xz -9 -T0 > "$out/b/tritonserver.tar.xz"
fi
# infinity-emb pins numpy<2, transformers<=5.0 (hence huggingface-hub<1 and tokenizers<=0.23.0),
# sentence-transformers<4, typer<0.13, rich<14, click<8.2, uvicorn<0.33: its own environment there.
download "$out/c/whl" infinity-emb==0.0.78 sentence-transformers==3.4.1 transformers==4.57.6 tokenizers==0.22.1 \
  huggingface-hub==0.36.0 typer==0.12.5 click==8.1.8 rich==13.9.4 posthog==7.91.1 backoff==2.2.1 distro==1.9.0 \
  prometheus-fastapi-instrumentator==8.1.0 uvicorn==0.32.1 numpy==1.26.4 fastapi==0.165.0 starlette==1.10.0 \
  pydantic==2.14.3 pydantic-core==2.50.4 annotated-types==0.7.0 typing-inspection==0.4.5 orjson==3.13.0 \
  opentelemetry-api==1.45.2 httptools==0.9.0
du -sh "$out"/a "$out"/b "$out"/c
