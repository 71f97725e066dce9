#!/usr/bin/env bash
# On the GPU host, after `gateway_ab.sh build`: what the host's idle CPUs cost a lone text. Benchmark 7's scheduler
# part (this checkout's stack, Triton under MPS) in three settings, in turns over two rounds (order reversed in the
# second):
#   base  as the host is;
#   qos   with a PM QoS request of 0 us held on /dev/cpu_dma_latency (what tuned's latency-performance profile
#         does; released when the file is closed);
#   spin  with a nice-19 busy loop on every CPU, so that no CPU idles (only the c=1 step: they take CPU from a
#         loaded stack).
# It prints the host's cpuidle driver and states first. Results: $OUT/ab-runs-<round><0 base|1 qos|2 spin>.tgz.
#   bash loadtest/device/idle_probe.sh
set -euo pipefail
. /tmp/lt-env.sh
export OUT=${OUT:-ab-out}/results
mkdir -p "$OUT"
cpuidle=/sys/devices/system/cpu/cpuidle
echo "cpuidle driver: $(cat $cpuidle/current_driver 2>/dev/null || echo -), governor: $(cat $cpuidle/current_governor_ro 2>/dev/null || echo -)"
for state in /sys/devices/system/cpu/cpu0/cpuidle/state*; do
  [ -d "$state" ] && echo "  $(cat "$state/name"): exit latency $(cat "$state/latency") us"
done
run() { STEPS="$2" RUNS="new:MPS=1" bash loadtest/device/gateway_ab.sh ab "$1" 2>&1 | grep -E "closed|p50 - model" || true; }
for round in 1 2; do
  order="base qos spin"; [ $round = 2 ] && order="spin qos base"
  for variant in $order; do
    echo "== $variant, round $round"
    case $variant in
      base) run "${round}0" 'single text c=256,short text c=1' ;;
      qos) exec 3>/dev/cpu_dma_latency && printf '\0\0\0\0' >&3
           run "${round}1" 'single text c=256,short text c=1'
           exec 3>&- ;;
      spin) spinners=()
            for _ in $(seq "$(nproc)"); do nice -n 19 python3 -c 'while True: pass' & spinners+=($!); done
            run "${round}2" 'short text c=1'
            kill "${spinners[@]}" ;;
    esac
  done
done
