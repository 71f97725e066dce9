#!/usr/bin/env python3
"""Start tritonserver as a client of a CUDA MPS daemon (the Multi-Process Service), then become it.

    triton-mps tritonserver --model-repository=...

The python backend runs each model instance as a process of its own, so the 4 instances of a GPU model
step are 4 CUDA contexts, and without MPS the GPU runs one context's kernels at a time, in time slices.
Under MPS their kernels share the GPU side by side, so a batch's compute does not wait for the other
instances' time slices (docs/benchmarks.md, "Performance decisions").

TRITON_MPS:
- `auto` (default): start the daemon when this container sees a GPU and has the driver's MPS binaries
  (nvidia-cuda-mps-control, mounted by the NVIDIA container toolkit); otherwise start Triton as it is,
  and say why on stderr.
- `on`: the same, but refuse to start (exit 1, one line saying why) when the daemon cannot be started.
- `off`: never.
A daemon the platform already runs for this container (CUDA_MPS_PIPE_DIRECTORY set, as Kubernetes'
NVIDIA device plugin sets it when it shares a GPU through MPS) is used as it is. The daemon's pipe and
log directories are under TRITON_MPS_DIR (default /tmp/nvidia-mps), so only this container's processes
are its clients. The GPU's compute mode is left as it is.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

CONTROL = "nvidia-cuda-mps-control"


def gpu_visible() -> bool:
    """Whether nvidia-smi lists a GPU in this container."""
    if shutil.which("nvidia-smi") is None:
        return False
    listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    return listing.returncode == 0 and "GPU " in listing.stdout


def client_env(directory: Path) -> dict[str, str]:
    """The variables that make a CUDA process a client of the daemon under `directory`."""
    return {"CUDA_MPS_PIPE_DIRECTORY": str(directory / "pipe"), "CUDA_MPS_LOG_DIRECTORY": str(directory / "log")}


def start_daemon(directory: Path) -> str | None:
    """Start the control daemon under `directory`; None when it runs, else why it does not."""
    if shutil.which(CONTROL) is None:
        return f"no {CONTROL} in this container (the NVIDIA container toolkit mounts it with the compute capability)"
    if not gpu_visible():
        return "this container sees no GPU"
    env = client_env(directory)
    for path in env.values():
        Path(path).mkdir(parents=True, exist_ok=True)
    started = subprocess.run([CONTROL, "-d"], env={**os.environ, **env}, capture_output=True, text=True, check=False)
    if started.returncode != 0:
        return f"{CONTROL} -d failed ({started.returncode}): {(started.stderr or started.stdout).strip()[:300]}"
    return None


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: triton-mps COMMAND [ARG...]", file=sys.stderr)
        return 2
    mode = os.environ.get("TRITON_MPS", "auto").strip().lower()
    if mode not in ("auto", "on", "off"):
        print(f"triton-mps: TRITON_MPS must be auto, on or off, not {mode!r}", file=sys.stderr)
        return 2
    env = dict(os.environ)
    if mode != "off" and "CUDA_MPS_PIPE_DIRECTORY" not in env:
        directory = Path(env.get("TRITON_MPS_DIR") or "/tmp/nvidia-mps")
        why_not = start_daemon(directory)
        if why_not is None:
            env.update(client_env(directory))
            print(f"triton-mps: CUDA MPS daemon started ({directory}); Triton's GPU processes share the GPU through it",
                  file=sys.stderr)
        elif mode == "on":
            print(f"triton-mps: TRITON_MPS=on, but {why_not}", file=sys.stderr)
            return 1
        else:
            print(f"triton-mps: without CUDA MPS: {why_not}", file=sys.stderr)
    os.execvpe(argv[1], argv[1:], env)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
