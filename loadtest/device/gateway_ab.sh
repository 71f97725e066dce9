#!/usr/bin/env bash
# On the GPU host, after setup.sh has unpacked a and b: an older gateway against this checkout's, on one machine
# and one repository. BEFORE is a copy of the older checkout's tree inside this one (untracked, so that it travels
# with the working tree), e.g. `git worktree add --detach before-tree REV` here, then copied as plain files.
#
#   bash loadtest/device/gateway_ab.sh build    # bench7's model and a repository by this builder
#   bash loadtest/device/gateway_ab.sh check    # stack-check on that repository (the hops of a lone text; MPS=1:
#                                               # Triton as a CUDA MPS daemon's client)
#   bash loadtest/device/gateway_ab.sh ab N     # bench7's scheduler part with each gateway in turn (round N: the
#                                               # order of RUNS, reversed on even rounds)
#   bash loadtest/device/gateway_ab.sh cpu      # cores per process group, per kind of gateway thread, and GPU
#                                               # utilization during each of STEPS, for each of RUNS (old, new)
#   bash loadtest/device/gateway_ab.sh spy      # py-spy (Python frames, not blocking) of SPY_WORKERS of this
#                                               # gateway's workers during STEP, with host_cpu beside it
#   bash loadtest/device/gateway_ab.sh final N  # bench7 (peers, scheduler, ensemble), this gateway (MPS=1: Triton
#                                               # as a CUDA MPS daemon's client, the peers not; TUNED=workers=12:
#                                               # one more scheduler series with those settings, bench7's --tuned)
#
# RUNS (default "old new pool"): old = BEFORE's gateway, new = this one, pool = this one with
# GATEWAY_TOKENIZER_THREADS=$(nproc) (every worker's Rust tokenizer pool as large as the host, as before that
# setting), NAME:VAR=VALUE[,VAR=VALUE] = this one with those variables (e.g. uv:GATEWAY_LOOP=uvloop; MPS=1 runs
# Triton's step instances as clients of a CUDA MPS daemon: mps:MPS=1; PROCS=N in `ab`: bench7's load generator in N
# client processes instead of 5, for the same stack; CLIENT=raw in `ab`: its lean HTTP client; REPO=DIR in `ab` and
# `cpu`: that repository instead of the built one). DURATION=S in `ab`: bench7's --duration (each step's window).
# Shipped defaults otherwise (auto workers; bench7 records how many). Results go under $OUT (device
# tool) or ./ab-out.
set -euo pipefail
. "$(dirname "$0")/profiling.sh"
BEFORE=${BEFORE:-before-tree}
W=${GATEWAY_AB_WORK:-/tmp/i20g}
OUT=${OUT:-ab-out}
NAME=${NAME:-h100-20f}
STEPS=${STEPS:-"single text c=256,32 texts c=16,short text c=1"}
mkdir -p "$W" "$OUT"

# A run whose variables include MPS=1 starts bench7 through the shipped launcher (docker/triton/mps.py, as compose
# starts tritonserver) with TRITON_MPS=on: Triton and its stubs are the daemon's clients; bench7's peers and the step
# alone are not (they drop its variables). with_mps ARRAY takes MPS=1 out of the named array of VAR=VALUE and sets
# `launch`, the command prefix.
MPS_DIR=$W/mps
mps_on=0
launch=()
with_mps() {
  local -n mps_vars_=$1  # a name no caller uses: a nameref named like its target is circular
  local kept=() v
  mps_on=0
  launch=()
  for v in ${mps_vars_[@]+"${mps_vars_[@]}"}; do
    if [ "$v" = MPS=1 ]; then mps_on=1; else kept+=("$v"); fi
  done
  if [ "$mps_on" = 1 ]; then mps_launch "$MPS_DIR"; fi
  mps_vars_=(${kept[@]+"${kept[@]}"})
}
# PROCS=N in a run spec is bench7's --procs N (client processes, default 5), CLIENT=raw|aiohttp its --client (the load
# generator's HTTP client), ENDPOINT=embed|tei its --endpoint (the route); none is a variable of the stack
procs=()
with_procs() {
  local -n procs_vars_=$1
  local kept=() v
  procs=()
  for v in ${procs_vars_[@]+"${procs_vars_[@]}"}; do
    case "$v" in PROCS=*) procs+=(--procs "${v#PROCS=}") ;; CLIENT=*) procs+=(--client "${v#CLIENT=}") ;;
      ENDPOINT=*) procs+=(--endpoint "${v#ENDPOINT=}") ;; *) kept+=("$v") ;; esac
  done
  procs_vars_=(${kept[@]+"${kept[@]}"})
}
# REPO=DIR in a run spec is bench7's --repository for that run (a variant of the built one, e.g. a config edited)
repo_of() {
  local -n repo_vars_=$1
  local kept=() v
  repo=$W/repository
  for v in ${repo_vars_[@]+"${repo_vars_[@]}"}; do
    case "$v" in REPO=*) repo=${v#REPO=} ;; *) kept+=("$v") ;; esac
  done
  repo_vars_=(${kept[@]+"${kept[@]}"})
}
# An `old` run without the older tree would fail only after the runs before it, its output filtered away: stop first.
# BEFORE/ is untracked; where git ignores it (e.g. .git/info/exclude), the device tool carries it only when named.
need_before() {
  local spec
  for spec in "$@"; do
    if [ "${spec%%:*}" = old ] && [ ! -d "$BEFORE/gateway" ]; then
      echo "gateway_ab.sh: no older tree at $BEFORE (device tool: carry it)" >&2
      exit 2
    fi
  done
}
end_mps() { if [ "$mps_on" = 1 ]; then mps_stop "$MPS_DIR"; fi; mps_on=0; }
# check and final: MPS=1 in the environment asks for the same
mps_from_env() { local vars=(); [ "${MPS:-0}" = 1 ] && vars=(MPS=1); with_mps vars; }

case "${1:-}" in
  build)
    python3 -c "from pathlib import Path; from loadtest.models import make_bert; make_bert(Path('$W/model'), 'embed', 'base')"
    python3 -m builder build --model "$W/model" --task embed --name bench --repository "$W/repository" \
      --runtime python --formats onnx --device gpu 2>&1 | tail -3
    ;;
  check)  # MPS=1: Triton as an MPS daemon's client, as compose runs it on a GPU host (answers and hops under MPS)
    mps_from_env
    ${launch[@]+"${launch[@]}"} python3 -m loadtest stack-check --repository "$W/repository" --model "$W/model" \
      --served bench --name "$NAME" --out "$OUT/results"
    end_mps ;;
  ab)
    order=${RUNS:-old new pool}
    need_before $order
    [ $(( ${2:-1} % 2 )) = 0 ] && order=$(echo $order | tr ' ' '\n' | tac | tr '\n' ' ')
    for spec in $order; do
      run=${spec%%:*}; tree=.; env=()
      [ "$run" = old ] && tree=$BEFORE
      [ "$run" = pool ] && env=(GATEWAY_TOKENIZER_THREADS=$(nproc))
      [ "$spec" != "$run" ] && IFS=, read -ra env <<< "${spec#*:}"
      with_mps env
      with_procs env
      repo_of env
      (cd "$tree" && env ${env[@]+"${env[@]}"} ${launch[@]+"${launch[@]}"} python3 -m loadtest bench7 --name "gw-$run${2:-1}" --parts scheduler \
         --steps "$STEPS" --repository "$repo" --work "$W/bench" --out "$OUT/ab" ${procs[@]+"${procs[@]}"} \
         ${DURATION:+--duration "$DURATION"} 2>&1 \
         | grep -E "^[|] stack scheduler: (single|32|short)|errors per step") || true
      end_mps
    done
    tar -czf "$OUT/ab-runs-${2:-1}.tgz" -C "$OUT" ab && rm -rf "$OUT/ab"  # the device tool brings back few files
    ;;
  cpu)  # cores per process group and per kind of gateway thread (this checkout's host_cpu) during each step, per run
    need_before ${RUNS:-old new}
    for spec in ${RUNS:-old new}; do
      run=${spec%%:*}; tree=.; env=()
      [ "$run" = old ] && tree=$BEFORE
      [ "$spec" != "$run" ] && IFS=, read -ra env <<< "${spec#*:}"
      with_mps env
      repo_of env
      IFS=, read -ra steps <<< "$STEPS"
      for step in "${steps[@]}"; do
        label=$run-$(echo "$step" | tr ' =' '--')
        python3 -m loadtest.experiments.host_cpu --seconds 60 --out "$OUT/host-cpu-$label.json" > "$OUT/host-cpu-$label.txt" &
        (cd "$tree" && env ${env[@]+"${env[@]}"} ${launch[@]+"${launch[@]}"} python3 -m loadtest bench7 --name "cpu-$label" --parts scheduler --steps "$step" \
           --repository "$repo" --work "$W/bench" --out "$W/cpu-runs") > "$OUT/bench7-$label.log" 2>&1 || true
        # the step's row, or the end of its log (a step that did not run leaves host_cpu no samples under load)
        grep -E "^[|] stack[^|]*[|] closed" "$OUT/bench7-$label.log" || tail -5 "$OUT/bench7-$label.log"
        wait
        echo "== $label"; cat "$OUT/host-cpu-$label.txt"
        # each step's launcher starts its own daemon: stop this one, or the next step's finds it running and fails
        if [ "$mps_on" = 1 ]; then mps_stop "$MPS_DIR"; fi
      done
      mps_on=0
    done ;;
  spy)
    step=${STEP:-single text c=256}
    dest="$OUT/gateway-spy-$(echo "$step" | tr ' =' '--')"
    mkdir -p "$dest"
    python3 -m loadtest.experiments.host_cpu --seconds 60 --out "$dest/host-cpu.json" > "$dest/host-cpu.txt" &
    cpu=$!
    python3 -m loadtest bench7 --name gateway-spy --parts scheduler --steps "$step" --duration 40 \
      --repository "$W/repository" --work "$W/bench" --out "$W/spy-runs" > "$dest/bench7.log" 2>&1 &
    bench=$!
    parent=$(wait_for_gateway)
    sleep "${SPY_DELAY:-15}"  # its workers discover the model, then bench7's warm-up; the window is 40 s
    workers=$([ -n "$parent" ] && pgrep -P "$parent" -f spawn_main | head -"${SPY_WORKERS:-2}" || true)
    # shellcheck disable=SC2086  # the worker pids, one argument each
    spy_processes py-spy "$dest" worker "${SPY_SECONDS:-15}" 250 80 --nonblocking $workers
    wait "$bench" || true
    wait "$cpu" || true
    grep -E "^[|] stack scheduler" "$dest/bench7.log" || tail -5 "$dest/bench7.log"
    cat "$dest/host-cpu.txt"
    ;;
  final)  # graph_ab.sh's, on this repository (MPS=1: Triton as an MPS daemon's client; the peers are not)
    mps_from_env
    env REPO="$W/repository" GRAPH_AB_WORK="$W" NAME="$NAME" OUT="$OUT" ${launch[@]+"${launch[@]}"} \
      bash "$(dirname "$0")/graph_ab.sh" "$@"
    end_mps ;;
  *)
    echo "usage: gateway_ab.sh build|check|ab N|cpu|spy|final N" >&2; exit 2 ;;
esac
