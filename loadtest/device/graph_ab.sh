#!/usr/bin/env bash
# On the GPU host, after setup.sh has unpacked a and b: a packed model step built by an older builder against
# this checkout's, on one machine. BEFORE is a copy of the older checkout's tree inside this one (untracked, so
# that it travels with the working tree), e.g. `git -C . worktree add --detach before-tree REV` here, or a copy.
#
#   bash loadtest/device/graph_ab.sh build   # the bench model, a repository from each builder, stack-check (new)
#   bash loadtest/device/graph_ab.sh step    # packed-step: the older packed graph beside this builder's graphs
#   bash loadtest/device/graph_ab.sh ab      # bench7's scheduler part on each repository in turns, 2 rounds
#                                            # (CODES='old new' by default; new2 = new with 2 step instances;
#                                            # PARTS=scheduler,ensemble for both pipelines; Triton's log is kept;
#                                            # step_variants.sh's copies: GRAPH_AB_WORK=/tmp/i20g CODES='new nog')
#   bash loadtest/device/graph_ab.sh final N # bench7 (peers, scheduler, ensemble) on this builder's repository
#                                            # (TUNED=k=v,...: bench7's --tuned, one more scheduler series with
#                                            # those GATEWAY_* settings beside the shipped defaults, e.g.
#                                            # TUNED=workers=12)
#   bash loadtest/device/graph_ab.sh cpu     # cores per process group and GPU utilization during two bench7 steps
#
# Both repositories are served by this checkout's gateway; the runner and the graph travel in the repository,
# so the A/B is the model step's alone. Results go under $OUT (device tool) or ./ab-out.
set -euo pipefail
BEFORE=${BEFORE:-before-tree}
W=${GRAPH_AB_WORK:-/tmp/i20}
OUT=${OUT:-ab-out}
NAME=${NAME:-h100-20b}
REPO=${REPO:-$W/new/repository}  # what cpu and final serve (gateway_ab.sh points it at its own)
STEPS="single text c=256,32 texts c=16,short text c=1"
mkdir -p "$W" "$OUT"

build_with() {  # build_with TREE REPOSITORY: bench7's build (the builder's defaults for the python runtime, ONNX)
  mkdir -p "$(dirname "$2")"
  (cd "$1" && python3 -m builder build --model "$W/model" --task embed --name bench --repository "$2" \
     --runtime python --formats onnx --device gpu)
}

case "${1:-}" in
  build)
    python3 -c "from pathlib import Path; from loadtest.models import make_bert; make_bert(Path('$W/model'), 'embed', 'base')"
    build_with "$BEFORE" "$W/old/repository" 2>&1 | tail -4
    build_with . "$W/new/repository" 2>&1 | tail -4
    # new2: the same repository with 2 step instances instead of the builder's 4 (h100-20-tuning's question)
    rm -rf "$W/new2" && cp -r "$W/new" "$W/new2"
    sed -i 's/count: 4/count: 2/' "$W/new2/repository/bench_onnx/config.pbtxt"
    grep -n "count" "$W/new2/repository/bench_onnx/config.pbtxt"
    python3 - "$W" <<'PY'
import sys
from collections import Counter
import onnx
for code in ("old", "new"):
    graph = onnx.load(f"{sys.argv[1]}/{code}/repository/bench_onnx/1/model.onnx").graph
    print(code, len(graph.node), "nodes", [i.name for i in graph.input], dict(Counter(n.op_type for n in graph.node)))
PY
    python3 -m loadtest stack-check --repository "$W/new/repository" --model "$W/model" --served bench \
      --name "$NAME" --out "$OUT/results"
    ;;
  step)
    PYTHONPATH=$ORT_GPU_PATH:$PYTHONPATH python3 -m loadtest packed-step --name "$NAME" \
      --before-graph "$W/old/repository/bench_onnx/1/model.onnx" --out "$OUT/results"
    ;;
  ab)
    codes=${CODES:-old new}
    for round in 1 2; do
      order=$codes; [ "$round" = 2 ] && order=$(echo $codes | tr ' ' '\n' | tac | tr '\n' ' ')
      for code in $order; do
        python3 -m loadtest bench7 --name "ab-$code$round" --parts "${PARTS:-scheduler}" --steps "$STEPS" \
          --repository "$W/$code/repository" --work "$W/bench" --out "$OUT/ab" 2>&1 \
          | grep -E "^[|] stack (scheduler|ensemble): (single|32|short)|errors per step" || true
        cp "$W/bench/triton.log" "$OUT/ab/triton-$code$round.log" 2>/dev/null || true
      done
    done
    # the device tool brings back few files: one archive of every run's record
    tar -czf "$OUT/ab-runs.tgz" -C "$OUT" ab && rm -rf "$OUT/ab"
    ;;
  cpu)  # where the host's CPU goes while bench7 runs one step on the after repository (build first)
    for step in "single text c=256" "32 texts c=16"; do
      label=$(echo "$step" | tr ' =' '--')
      python3 -m loadtest.experiments.host_cpu --seconds 75 --out "$OUT/host-cpu-$label.json" > "$OUT/host-cpu-$label.txt" &
      python3 -m loadtest bench7 --name "cpu-$label" --parts scheduler --steps "$step" \
        --repository "$REPO" --work "$W/bench" --out "$W/cpu-runs" 2>&1 | grep -E "^[|] stack[^|]*[|] closed" || true
      wait
      cat "$OUT/host-cpu-$label.txt"
    done
    ;;
  final)
    python3 -m loadtest bench7 --name "$NAME-final${2:-1}" --parts peers,scheduler,ensemble \
      --repository "$REPO" --work "$W/bench" --out "$OUT/results" ${TUNED:+--tuned "$TUNED"}
    ;;
  *)
    echo "usage: graph_ab.sh build|step|ab|cpu|final [N]" >&2; exit 2 ;;
esac
