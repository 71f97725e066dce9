# Sourced by the device scripts that profile under bench7 load (gateway_ab.sh spy, stub_profile.sh).
# spy_processes: py-spy several processes at once, then summarize and compress each profile.
#   spy_processes SPY DEST PREFIX SECONDS RATE TOP "FLAGS" PID...
# writes DEST/PREFIX-PID.raw.gz (collapsed stacks) and DEST/PREFIX-PID-frames.txt (loadtest.pyspy.summary, TOP frames).
spy_processes() {
  local spy=$1 dest=$2 prefix=$3 seconds=$4 rate=$5 top=$6 flags=$7; shift 7
  local spies=() pid
  for pid in "$@"; do
    # shellcheck disable=SC2086  # FLAGS is a list of py-spy options
    "$spy" record $flags -p "$pid" -d "$seconds" -r "$rate" -f raw -o "$dest/$prefix-$pid.raw" >/dev/null 2>&1 &
    spies+=($!)
  done
  [ ${#spies[@]} -gt 0 ] && wait "${spies[@]}" || { echo "no process to profile ($prefix)" >&2; return 0; }
  for pid in "$@"; do
    python3 -c "import sys; from pathlib import Path; from loadtest.pyspy import summary
print('\n'.join(summary(Path(sys.argv[1]), int(sys.argv[2]))))" "$dest/$prefix-$pid.raw" "$top" > "$dest/$prefix-$pid-frames.txt" || true
    gzip -f "$dest/$prefix-$pid.raw"
  done
}

# Prints the gateway's main pid once bench7 has started it (Triton's own warm-up busies the GPU before that, so
# GPU utilization cannot tell that the load runs); empty after 5 minutes without one.
wait_for_gateway() {
  local parent=
  for _ in $(seq 600); do
    parent=$(pgrep -f -- "-m gateway\$" | head -1 || true)
    [ -n "$parent" ] && break
    sleep 0.5
  done
  echo "$parent"
}

# CUDA MPS (the Multi-Process Service) around a run whose Triton the shipped launcher (docker/triton/mps.py,
# TRITON_MPS_DIR=DIR) made a client of a daemon under DIR:
#   mps_launch DIR  sets `launch`, the command prefix that starts a run so (run from the checkout's root)
#   mps_env DIR     prints the variables a client of that daemon has (VAR=VALUE, one per line)
#   mps_stop DIR    prints what the daemon says about its servers and clients, then stops it
mps_launch() { launch=(env TRITON_MPS=on TRITON_MPS_DIR="$1" python3 "$PWD/docker/triton/mps.py"); }
mps_env() { printf 'CUDA_MPS_PIPE_DIRECTORY=%s\nCUDA_MPS_LOG_DIRECTORY=%s\n' "$1/pipe" "$1/log"; }
mps_stop() {
  echo get_server_list | env $(mps_env "$1") nvidia-cuda-mps-control 2>&1 | sed 's/^/mps servers: /' || true
  grep -c -i 'new client' "$1/log/control.log" 2>/dev/null | sed 's/^/mps clients connected (this daemon): /' || true
  echo quit | env $(mps_env "$1") nvidia-cuda-mps-control || true
  rm -f "$1/log/control.log"
}
