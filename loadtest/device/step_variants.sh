#!/usr/bin/env bash
# On the GPU host, after gateway_ab.sh build: copies of its repository that differ only in the model step's
# config, for stack-check or graph_ab.sh ab (GRAPH_AB_WORK=$W CODES='new sync'):
#   new   the repository as the builder made it (a GPU build: 1 instance running 4 execution threads)
#   sync  the same step as the builder made it before execution threads: 4 instances, each execute() answering
#         its own requests
#   nog   new with the step parameter cuda_graphs "false": no CUDA graphs for one-row runs
#   t2x2  new with 2 instances of 2 execution threads each
set -euo pipefail
W=${GATEWAY_AB_WORK:-/tmp/i20g}
for code in new sync nog t2x2; do
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
python3 - "$W" <<'PY'
import sys
from pathlib import Path

from builder.configs import read_config, write_config

for code, instances, threads in (("sync", 4, None), ("t2x2", 2, "2")):
    folder = Path(sys.argv[1]) / code / "repository" / "bench_onnx"
    config = read_config(folder / "config.pbtxt")
    del config.parameters["execution_threads"]
    if threads:
        config.parameters["execution_threads"].string_value = threads
    config.instance_group[0].count = instances
    write_config(folder, config)
PY
grep -A3 cuda_graphs "$W/nog/repository/bench_onnx/config.pbtxt"
grep -A3 "count: [0-9]\|execution_threads" "$W"/{new,sync,t2x2}/repository/bench_onnx/config.pbtxt | grep "count\|string_value"
