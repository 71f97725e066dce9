#!/usr/bin/env bash
# On a host of several GPUs (issue 24), after `gateway_ab.sh build`: benchmark 7's stack rows with one GPU
# (CUDA_VISIBLE_DEVICES=0) and with every GPU, one after the other in one call, on the same repository (the
# builder's defaults for `--runtime python --formats onnx --device gpu`: KIND_GPU groups that name no GPU); then
# host_cpu (cores per process group, utilization per GPU) during single texts at c=256 on every GPU: what bounds it.
#
#   OUT=... bash loadtest/device/multi_gpu.sh     # results in $OUT/multi-gpu.tgz (the device tool brings few files)
set -euo pipefail
W=${GATEWAY_AB_WORK:-/tmp/i20g}
OUT=${OUT:-ab-out}
NAME=${NAME:-h200x2}
STEPS=${STEPS:-"32 texts c=16,32 texts c=32,single text c=256"}
R="$OUT/multi-gpu"
mkdir -p "$R"
nvidia-smi --query-gpu=index,name,uuid,compute_cap --format=csv,noheader | tee "$R/gpus.txt"

stack_rows() {  # NAME: bench7's scheduler and ensemble parts on the GPUs this process sees
  python3 -m loadtest bench7 --name "$1" --parts scheduler,ensemble --steps "$STEPS" --repository "$W/repository" \
    --work "$W/bench" --out "$R" > "$R/$1.log" 2>&1 || true
  grep -E "^[|] stack (scheduler|ensemble): [^|]*[|] closed|errors per step" "$R/$1.log" || tail -5 "$R/$1.log"
}
echo "== one GPU"; CUDA_VISIBLE_DEVICES=0 stack_rows "$NAME-one-gpu"
echo "== every GPU"; stack_rows "$NAME-all-gpus"

echo "== every GPU, single text c=256: cores and GPU utilization"
python3 -m loadtest.experiments.host_cpu --seconds 70 --out "$R/$NAME-host-cpu.json" > "$R/$NAME-host-cpu.txt" &
python3 -m loadtest bench7 --name "$NAME-cpu" --parts scheduler --steps "single text c=256" --duration 30 \
  --repository "$W/repository" --work "$W/bench" --out "$R" > "$R/$NAME-cpu.log" 2>&1 || true
wait
grep -E "^[|] stack scheduler: [^|]*[|] closed" "$R/$NAME-cpu.log" || true
cat "$R/$NAME-host-cpu.txt"
tar -czf "$OUT/multi-gpu.tgz" -C "$OUT" multi-gpu && rm -rf "$R"
