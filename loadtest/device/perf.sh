#!/usr/bin/env bash
# perf_analyzer recipes (Triton level) for an ensemble NAME_onnx_ensemble with a `text` input.
#   loadtest/device/perf.sh GRPC_URL MODEL OUT_DIR
# Works with the PyPI perf-analyzer wheel (glibc >= 2.38, the GPU host) and in the NGC SDK image
# (nvcr.io/nvidia/tritonserver:<yy.mm>-py3-sdk), which has perf_analyzer on PATH.
set -euo pipefail
url=${1:-127.0.0.1:8001}
model=${2:-bench_onnx_ensemble}
out=${3:-loadtest/results/perf_analyzer}
mkdir -p "$out"
python3 -m loadtest corpus --perf-analyzer --size 1000 -o "$out/corpus.json"
common=(-m "$model" -u "$url" -i grpc --input-data "$out/corpus.json" --shape text:1
        --measurement-mode count_windows --measurement-request-count 200 --stability-percentage 20 --max-trials 5)
# 1. single texts, closed loop concurrency sweep (plain gRPC tensors)
perf_analyzer "${common[@]}" --concurrency-range 1:64:16 -f "$out/concurrency_grpc.csv" | tee "$out/concurrency_grpc.txt"
# 2. the same through system shared memory (inputs and outputs)
perf_analyzer "${common[@]}" --concurrency-range 1:64:16 --shared-memory system --output-shared-memory-size 65536 \
  -f "$out/concurrency_shm.csv" | tee "$out/concurrency_shm.txt"
# 3. 32-text requests (-b 32) at concurrency 8
perf_analyzer "${common[@]}" -b 32 --concurrency-range 8 -f "$out/batch32.csv" | tee "$out/batch32.txt"
