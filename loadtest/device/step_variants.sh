#!/usr/bin/env bash
# On the GPU host, after gateway_ab.sh build: copies of its repository that differ only in the model step's
# config, for stack-check or graph_ab.sh ab (GRAPH_AB_WORK=$W CODES='new nog'):
#   new  the repository as the builder made it
#   nog  the same with the step parameter cuda_graphs "false": no CUDA graphs for one-row runs
set -euo pipefail
W=${GATEWAY_AB_WORK:-/tmp/i20g}
for code in new nog; do
  rm -rf "$W/$code" && mkdir -p "$W/$code" && cp -r "$W/repository" "$W/$code/repository"
done
cat >> "$W/nog/repository/bench_onnx/config.pbtxt" <<'CFG'
parameters {
  key: "cuda_graphs"
  value {
    string_value: "false"
  }
}
CFG
grep -A3 cuda_graphs "$W/nog/repository/bench_onnx/config.pbtxt"
