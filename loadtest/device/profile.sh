#!/usr/bin/env bash
# On the GPU host, after setup.sh and `gateway_ab.sh build`: where the stack's time goes at its plateau.
#
#   bash loadtest/device/profile.sh stack   # bench7's scheduler series on the loads from one text to 256 texts per
#                                           # request (MPS as shipped): per step the cores of each process group and
#                                           # the GPU's busy share (rows and summary in $OUT/results), and py-spy
#                                           # profiles of a gateway worker and each stub ($OUT/profile-spy.tgz)
#   bash loadtest/device/profile.sh nsys    # the same stack under nsys (CUDA trace, every process; no MPS) at
#                                           # $LOAD (default "64 texts c=32"): 6 s captured while the GPU is busy,
#                                           # summarised by nsys_summary.py ($OUT/nsys-summary.txt)
#
# py-spy comes from a wheel in prof-tools/ (carried: the host has none); nsys is the host's.
set -euo pipefail
W=${GATEWAY_AB_WORK:-/tmp/i20g}
OUT=${OUT:-ab-out}
P=/tmp/prof
export LOADTEST_TABLE=${LOADTEST_TABLE:-$OUT/results.csv}
mkdir -p "$P" "$OUT"
if ! command -v py-spy >/dev/null && ls prof-tools/py_spy-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --target "$P/pyspy" prof-tools/py_spy-*.whl
  export PATH=$P/pyspy/bin:$PATH
fi
launch=(env TRITON_MPS=on TRITON_MPS_DIR="$W/mps" python3 "$PWD/docker/triton/mps.py")
mps_stop() { echo quit | env CUDA_MPS_PIPE_DIRECTORY="$W/mps/pipe" nvidia-cuda-mps-control || true; }
case "${1:-}" in
  stack)
    LOADTEST_PYSPY=$P/spy "${launch[@]}" python3 -m loadtest bench7 --name "${NAME:-h200}-profile" --parts scheduler \
      --steps "${STEPS:-single text c=256,32 texts c=16,64 texts c=32,128 texts c=16,256 texts c=8,32 texts c=64}" \
      --repository "$W/repository" --work "$W/bench" --out "$OUT/results" ${DURATION:+--duration "$DURATION"} \
      2>&1 | grep -E "^  stack|errors per step|cores per" || true
    mps_stop
    tar -czf "$OUT/profile-spy.tgz" -C "$P" spy
    ;;
  nsys)
    load=${LOAD:-64 texts c=32}
    nsys launch --session-new=plateau --trace=cuda --wait=primary python3 -m loadtest bench7 --name nsys \
      --parts scheduler --steps "$load" --duration 30 --repository "$W/repository" --work "$W/nsys" \
      --out "$P/runs" --table none > "$P/bench7.log" 2>&1 &
    bench=$!
    busy=0  # capture once the GPU has been busy for three samples in a row: the load is running
    while [ "$busy" -lt 3 ] && kill -0 "$bench" 2>/dev/null; do
      u=$(nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits | head -1)
      if [ "${u:-0}" -ge 20 ]; then busy=$((busy + 1)); else busy=0; fi
      sleep 1
    done
    nsys start --session=plateau --output="$P/stack" --force-overwrite=true
    sleep 6
    nsys stop --session=plateau
    wait "$bench" || true
    grep -E "^  stack" "$P/bench7.log" || tail -20 "$P/bench7.log"
    nsys export --type sqlite --force-overwrite true --output "$P/stack.sqlite" "$P/stack.nsys-rep" >/dev/null
    python3 loadtest/device/nsys_summary.py "$P/stack.sqlite" | tee "$OUT/nsys-summary.txt"
    ;;
  *)
    echo "usage: profile.sh stack|nsys" >&2; exit 2 ;;
esac
