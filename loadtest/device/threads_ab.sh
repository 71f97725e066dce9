#!/usr/bin/env bash
# On the GPU host, after gateway_ab.sh build and step_variants.sh: bench7's scheduler part on the step variants in
# turns (round N: the order reversed on even rounds), each with this checkout's gateway; Triton's log of each run
# is kept. h100-20n-threaded-step ran it on d15b599's tree, whose step_variants.sh also made `sync` and `t2x2`
# (execution threads, since reverted).
#   RUNS='new nog new+if4' [PARTS=scheduler,ensemble] bash loadtest/device/threads_ab.sh 1
# A run named CODE+if4 serves CODE with GATEWAY_MAX_BATCHES_IN_FLIGHT=4 (2 per worker with 8 workers on 4 runs at once).
set -euo pipefail
W=${GATEWAY_AB_WORK:-/tmp/i20g}
OUT=${OUT:-ab-out}
STEPS=${STEPS:-"single text c=256,32 texts c=16,short text c=1"}
order=${RUNS:-new nog}
[ $(( ${1:-1} % 2 )) = 0 ] && order=$(echo $order | tr ' ' '\n' | tac | tr '\n' ' ')
mkdir -p "$OUT/ab" "$W/bench"
for run in $order; do
  code=${run%%+*}; env=()
  [ "$run" != "$code" ] && env=(GATEWAY_MAX_BATCHES_IN_FLIGHT=4)
  label=$(echo "$run" | tr '+' '-')${1:-1}
  env ${env[@]+"${env[@]}"} python3 -m loadtest bench7 --name "ab-$label" --parts "${PARTS:-scheduler}" --steps "$STEPS" \
    --repository "$W/$code/repository" --work "$W/bench" --out "$OUT/ab" 2>&1 \
    | grep -E "^[|] stack (scheduler|ensemble): (single|32|short)[^|]*[|] closed|errors per step" || true
  cp "$W/bench/triton.log" "$OUT/ab/triton-$label.log" 2>/dev/null || true
  grep -h "runs/s over" "$OUT/ab/triton-$label.log" | sed 's/.*\] "//' | cut -c1-260 || true
done
tar -czf "$OUT/ab-runs-${1:-1}.tgz" -C "$OUT" ab && rm -rf "$OUT/ab"  # the device tool brings back few files
