#!/usr/bin/env bash
# On the GPU host, after gateway_ab.sh build (its repository): py-spy --native of the packed step's python-backend
# stubs while bench7's scheduler part runs STEP through this checkout's gateway (h100-20g-stub-profile's way, as a
# script). The py-spy wheel travels in .gpu/d. Sampling in blocking mode (--native needs it) slows the stubs:
# read shares, not times.
#   STEP='single text c=256' STUBS=2 PROFILE_SECONDS=20 PROFILE_DELAY=15 bash loadtest/device/stub_profile.sh
# MPS=1: Triton and its stubs as clients of a CUDA MPS daemon, as compose runs them (docker/triton/mps.py).
# IDLE=1: idle samples too (py-spy --idle), so that the waits inside execute() show beside its CPU.
set -euo pipefail
. "$(dirname "$0")/profiling.sh"
W=${GATEWAY_AB_WORK:-/tmp/i20g}
OUT=${OUT:-ab-out}
STEP=${STEP:-single text c=256}
dest="$OUT/stub-profile-$(echo "$STEP" | tr ' =' '--')"
spy=/tmp/pyspyx/py_spy-0.4.3.data/scripts/py-spy
if [ ! -x "$spy" ]; then
  python3 -m zipfile -e "$(ls .gpu/d/whl/py_spy-*.whl | head -1)" /tmp/pyspyx && chmod +x "$spy"
fi
mkdir -p "$dest"
launch=()
if [ "${MPS:-0}" = 1 ]; then mps_launch "$W/mps"; fi
${launch[@]+"${launch[@]}"} python3 -m loadtest bench7 --name stub-profile --parts scheduler --steps "$STEP" --duration 60 \
  --repository "$W/repository" --work "$W/bench" --out "$W/profile-runs" > "$dest/bench7.log" 2>&1 &
bench=$!
wait_for_gateway >/dev/null
sleep "${PROFILE_DELAY:-15}"  # the gateway's workers discover the model, then bench7's warm-up; the window is 60 s
pids=$(pgrep -f "triton_python_backend_stub.*bench_onnx/" | head -"${STUBS:-2}" || true)
# shellcheck disable=SC2086  # the stub pids, one argument each
flags=--native
if [ "${IDLE:-0}" = 1 ]; then flags="--native --idle"; fi
spy_processes "$spy" "$dest" stub "${PROFILE_SECONDS:-20}" 200 60 "$flags" $pids
wait "$bench" || true
if [ "${MPS:-0}" = 1 ]; then mps_stop "$W/mps"; fi
grep -E "^[|] stack scheduler" "$dest/bench7.log" || tail -5 "$dest/bench7.log"
