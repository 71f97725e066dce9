#!/usr/bin/env bash
# On the GPU host, after setup.sh (loadtest/device/README.md): bench7 on one repository, this checkout's stack and,
# for an A/B, an older tree's in turns.
#
#   bash loadtest/device/gateway_ab.sh build    # bench7's model and a repository by this builder (and one by the
#                                               # older tree's builder, when there is one)
#   bash loadtest/device/gateway_ab.sh check    # stack-check on that repository (answers against PyTorch fp32, hops)
#   bash loadtest/device/gateway_ab.sh ab N     # bench7's scheduler part for each of RUNS in turn (round N: RUNS'
#                                               # order, reversed on even rounds)
#   bash loadtest/device/gateway_ab.sh final N  # bench7 with its peers, both pipelines, this checkout
#
# RUNS (default "old new"): old = the older tree in $BEFORE (default before-tree/, untracked, so that it travels with
# the working tree; its commit in $BEFORE/COMMIT) on its own builder's repository, new = this checkout on this
# builder's; NAME:VAR=VALUE[,VAR=VALUE] = this checkout
# with those variables (REPO=DIR: that repository instead of the built one). MPS=1 (in the environment: every run; in
# a run spec: that run) starts tritonserver through the shipped launcher, docker/triton/mps.py with TRITON_MPS=on, as
# compose runs it on a GPU host; bench7's peers and its model step alone stay outside the daemon. STEPS: bench7's
# --steps for `ab` and `final`; DURATION: its --duration. This checkout's commit: $LOADTEST_GIT_COMMIT (the host's copy has no
# .git to ask). Every run's rows go to $LOADTEST_TABLE (default $OUT/results.csv: it comes back with $OUT); its
# folder under $OUT (the device tool's output folder, or ./ab-out).
set -euo pipefail
BEFORE=${BEFORE:-before-tree}
W=${GATEWAY_AB_WORK:-/tmp/i20g}
OUT=${OUT:-ab-out}
NAME=${NAME:-gpu}
STEPS=${STEPS:-}  # ab: by default its three loads; final: by default every load of bench7
export LOADTEST_TABLE=${LOADTEST_TABLE:-$OUT/results.csv}
mkdir -p "$W" "$OUT"

# MPS: a run whose variables include MPS=1 (or with MPS=1 in the environment) gets `launch`, the command prefix that
# starts bench7 (and so its tritonserver) as the MPS daemon's client; mps_stop ends that daemon after the run.
MPS_DIR=$W/mps
mps_on=0
launch=()
with_mps() {  # with_mps ARRAY: takes MPS=1 out of the named array of VAR=VALUE, sets mps_on and launch
  local -n mps_vars_=$1  # a name no caller uses: a nameref named like its target is circular
  local kept=() v
  mps_on=${MPS:-0}
  for v in ${mps_vars_[@]+"${mps_vars_[@]}"}; do
    if [ "$v" = MPS=1 ]; then mps_on=1; else kept+=("$v"); fi
  done
  launch=()
  [ "$mps_on" = 1 ] && launch=(env TRITON_MPS=on TRITON_MPS_DIR="$MPS_DIR" python3 "$PWD/docker/triton/mps.py")
  mps_vars_=(${kept[@]+"${kept[@]}"})
}
mps_stop() {
  [ "$mps_on" = 1 ] || return 0
  local vars=(CUDA_MPS_PIPE_DIRECTORY="$MPS_DIR/pipe" CUDA_MPS_LOG_DIRECTORY="$MPS_DIR/log")
  echo get_server_list | env "${vars[@]}" nvidia-cuda-mps-control 2>&1 | sed 's/^/mps servers: /' || true
  echo quit | env "${vars[@]}" nvidia-cuda-mps-control || true
  rm -f "$MPS_DIR/log/control.log"
  mps_on=0
}
repo_of() {  # repo_of ARRAY DEFAULT: takes REPO=DIR out of the named array, sets repo (else DEFAULT)
  local -n repo_vars_=$1
  local kept=() v
  repo=$2
  for v in ${repo_vars_[@]+"${repo_vars_[@]}"}; do
    case "$v" in REPO=*) repo=${v#REPO=} ;; *) kept+=("$v") ;; esac
  done
  repo_vars_=(${kept[@]+"${kept[@]}"})
}
this_commit() { echo "${LOADTEST_GIT_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}"; }
build_with() {  # build_with TREE REPOSITORY: the builder's defaults for the python runtime, ONNX, on the GPU
  (cd "$1" && python3 -m builder build --model "$W/model" --task embed --name bench --repository "$2" \
     --runtime python --formats onnx --device gpu 2>&1 | tail -3)
}

case "${1:-}" in
  build)
    python3 -c "from pathlib import Path; from loadtest.models import make_bert
make_bert(Path('$W/model'), 'embed', 'base')"
    build_with . "$W/repository"
    if [ -d "$BEFORE/builder" ]; then rm -rf "$W/before" && mkdir -p "$W/before"; build_with "$BEFORE" "$W/before/repository"; fi
    ;;
  check)
    vars=(); with_mps vars
    ${launch[@]+"${launch[@]}"} python3 -m loadtest stack-check --repository "$W/repository" --model "$W/model" \
      --served bench --name "$NAME" --out "$OUT/results"
    mps_stop ;;
  ab)
    round=${2:-1}
    order=${RUNS:-old new}
    [ $(( round % 2 )) = 0 ] && order=$(echo $order | tr ' ' '\n' | tac | tr '\n' ' ')
    for spec in $order; do
      run=${spec%%:*}; tree=.; env=(); table=(--table none); commit=$(this_commit); default_repo=$W/repository
      if [ "$run" = old ]; then
        # stop before the runs, not after them with the error filtered away
        [ -d "$BEFORE/gateway" ] || { echo "gateway_ab.sh: no older tree at $BEFORE (carry it)" >&2; exit 2; }
        tree=$BEFORE; table=(); commit=$(cat "$BEFORE/COMMIT" 2>/dev/null || echo before)
        [ -d "$W/before/repository" ] && default_repo=$W/before/repository
      fi
      [ "$spec" != "$run" ] && IFS=, read -ra env <<< "${spec#*:}"
      with_mps env
      repo_of env "$default_repo"
      # the older tree's bench7 knows no --table: both runs' rows come from their records (results --import)
      (cd "$tree" && env LOADTEST_GIT_COMMIT="$commit" ${env[@]+"${env[@]}"} ${launch[@]+"${launch[@]}"} \
         python3 -m loadtest bench7 --name "gw-$run$round" --parts scheduler --steps "${STEPS:-single text c=256,32 texts c=16,short text c=1}" --repository "$repo" \
         --work "$W/bench" --out "$OUT/ab" ${table[@]+"${table[@]}"} ${DURATION:+--duration "$DURATION"} 2>&1 \
         | grep -E "^[|] stack scheduler: (single|32|short)|errors per step") || true
      mps_stop
      python3 -m loadtest results --import "$OUT/ab/gw-$run$round-7-peers" --commit "$commit" || true
    done
    tar -czf "$OUT/ab-runs-$round.tgz" -C "$OUT" ab && rm -rf "$OUT/ab"  # the device tool brings back few files
    ;;
  final)
    vars=(); with_mps vars
    ${launch[@]+"${launch[@]}"} env LOADTEST_GIT_COMMIT="$(this_commit)" python3 -m loadtest bench7 \
      --name "$NAME-final${2:-1}" --parts "${PARTS:-peers,scheduler,ensemble,infinity}" --repository "$W/repository" \
      --work "$W/bench" --out "$OUT/results" ${TUNED:+--tuned "$TUNED"} ${STEPS:+--steps "$STEPS"} \
      ${DURATION:+--duration "$DURATION"}
    mps_stop ;;
  *)
    echo "usage: gateway_ab.sh build|check|ab N|final N" >&2; exit 2 ;;
esac
