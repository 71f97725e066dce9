#!/usr/bin/env bash
# On the GPU host, after setup.sh and `gateway_ab.sh build`: where the stack's time goes at its plateau.
#
#   bash loadtest/device/profile.sh stack   # bench7's scheduler series on the loads from one text to 256 texts per
#                                           # request (MPS as shipped): per step the cores of each process group and
#                                           # the GPU's busy share (rows and summary in $OUT/results), and py-spy
#                                           # profiles of a gateway worker and each stub ($OUT/profile-spy.tgz)
#   bash loadtest/device/profile.sh kernels # the model step alone on one packed run of $ROWS (default 128) corpus
#                                           # texts under ncu: kernel time per kind against the run's wall time
#                                           # ($OUT/kernels.txt)
#
# py-spy comes from a wheel in prof-tools/ (carried: the host has none); ncu is the host's (its nsys cannot import
# a capture there: no QdstrmImporter).
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
case "${1:-}" in
  stack)  # gateway_ab.sh's final, scheduler series only, with py-spy on
    LOADTEST_PYSPY=$P/spy MPS=1 NAME="${NAME:-h200}-profile" PARTS=scheduler \
      STEPS="${STEPS:-single text c=256,32 texts c=16,64 texts c=32,128 texts c=16,256 texts c=8,32 texts c=64}" \
      bash loadtest/device/gateway_ab.sh final 1 2>&1 | grep -E "^\| stack|errors per step|cores per" || true
    tar -czf "$OUT/profile-spy.tgz" -C "$P" spy
    ;;
  kernels)
    rows=${ROWS:-128}; model=$W/repository/bench_onnx/1/model.onnx; tok=$W/model/tokenizer.json
    run=(python3 loadtest/device/step_kernels.py run "$model" "$tok" "$rows")
    wall=$(PYTHONPATH=$ORT_GPU_PATH:$PYTHONPATH "${run[@]}" 30 | tee "$OUT/kernels.txt" | sed -E 's/.*last run ([0-9.]+) ms.*/\1/')
    # kernels per run: the difference between 5 runs and 1 run, over 4; clocks as they run (not ncu's base clocks)
    ncu_run() { PYTHONPATH=$ORT_GPU_PATH:$PYTHONPATH ncu --clock-control none --metrics gpu__time_duration.sum --csv \
      "${run[@]}" "$1" > "$2" 2>/dev/null || true; grep -c '"gpu__time_duration.sum"' "$2"; }
    one=$(ncu_run 0 "$P/ncu1.csv"); five=$(ncu_run 4 "$P/ncu.csv"); per_run=$(( (five - one) / 4 ))
    python3 loadtest/device/step_kernels.py report "$P/ncu.csv" "$per_run" "$wall" | tee -a "$OUT/kernels.txt"
    ;;
  *)
    echo "usage: profile.sh stack|kernels" >&2; exit 2 ;;
esac
