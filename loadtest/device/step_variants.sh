#!/usr/bin/env bash
# On the GPU host, after gateway_ab.sh build: copies of its repository that differ only in the model step's
# config, for stack-check or graph_ab.sh ab (GRAPH_AB_WORK=$W CODES='new sync'):
#   new   the repository as the builder made it (a GPU build: 1 instance running 4 execution threads)
#   sync  the same step as the builder made it before execution threads: 4 instances, each execute() answering
#         its own requests
#   nog   new with the step parameter cuda_graphs "false": no CUDA graphs for one-row runs
set -euo pipefail
W=${GATEWAY_AB_WORK:-/tmp/i20g}
for code in new sync nog; do
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
python3 - "$W/sync/repository/bench_onnx" <<'PY'
import sys
from pathlib import Path

from builder.configs import read_config, write_config

folder = Path(sys.argv[1])
config = read_config(folder / "config.pbtxt")
del config.parameters["execution_threads"]
config.instance_group[0].count = 4
write_config(folder, config)
PY
grep -A3 cuda_graphs "$W/nog/repository/bench_onnx/config.pbtxt"
grep -B1 -A4 "count\|execution_threads" "$W/new/repository/bench_onnx/config.pbtxt" "$W/sync/repository/bench_onnx/config.pbtxt"
