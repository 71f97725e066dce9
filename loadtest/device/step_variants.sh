#!/usr/bin/env bash
# On the GPU host, after gateway_ab.sh build: copies of its repository that differ only in the model step's
# config, for graph_ab.sh ab (GRAPH_AB_WORK=$W CODES='new t1'):
#   new  the repository as the builder made it
#   t1   onnxruntime's intra-op thread pool at 1 thread per step instance (parameter intra_op_num_threads; the
#        builder's --onnx-threads 1), instead of onnxruntime's default (one per physical core, in each of 4 stubs)
set -euo pipefail
W=${GATEWAY_AB_WORK:-/tmp/i20g}
for code in new t1; do
  rm -rf "$W/$code" && mkdir -p "$W/$code" && cp -r "$W/repository" "$W/$code/repository"
done
cat >> "$W/t1/repository/bench_onnx/config.pbtxt" <<'CFG'
parameters {
  key: "intra_op_num_threads"
  value {
    string_value: "1"
  }
}
CFG
grep -A3 intra_op "$W/t1/repository/bench_onnx/config.pbtxt"
