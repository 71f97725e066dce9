#!/usr/bin/env bash
# On the GPU host, after gateway_ab.sh build: copies of its repository that differ only in the model step's
# config, for stack-check or graph_ab.sh ab (GRAPH_AB_WORK=$W CODES='new g1 g2'):
#   new  the repository as the builder made it (4 instances; CUDA graphs for lone short texts)
#   nog  step parameter cuda_graphs "false": no CUDA graphs
#   g1   cuda_graphs "all" (every run replays a graph of its shape) and 1 step instance
#   g2   cuda_graphs "all" and 2 step instances
set -euo pipefail
W=${GATEWAY_AB_WORK:-/tmp/i20g}
param() {  # param CODE VALUE: the step's cuda_graphs parameter
  cat >> "$W/$1/repository/bench_onnx/config.pbtxt" <<CFG
parameters {
  key: "cuda_graphs"
  value {
    string_value: "$2"
  }
}
CFG
}
for code in new nog g1 g2; do
  rm -rf "$W/$code" && mkdir -p "$W/$code" && cp -r "$W/repository" "$W/$code/repository"
done
param nog false
param g1 all
param g2 all
sed -i 's/count: 4/count: 1/' "$W/g1/repository/bench_onnx/config.pbtxt"
sed -i 's/count: 4/count: 2/' "$W/g2/repository/bench_onnx/config.pbtxt"
grep -H -e "count:" -e '"all"' -e '"false"' "$W"/*/repository/bench_onnx/config.pbtxt
