"""docker/triton/mps.py (`triton-mps`, before tritonserver in compose.yaml and the Kubernetes pod): starts a CUDA MPS
daemon when it can and the setting asks for it, then becomes the command with the daemon's client variables.

This machine has no GPU and no MPS: nvidia-smi and nvidia-cuda-mps-control are stand-in scripts that say what they
were asked; the command is a shell printing what it was given. The launcher's own run on a GPU host is what
loadtest/device/gateway_ab.sh's MPS=1 runs. Without the stand-ins, the pod
simulation (tests/deploy/test_pod_simulation.py) runs it in front of a real tritonserver."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from devstack.tritonserver import REPO_ROOT

LAUNCHER = REPO_ROOT / "docker" / "triton" / "mps.py"
COMMAND = ["sh", "-c", 'echo "ran $0 pipe=${CUDA_MPS_PIPE_DIRECTORY:-none} log=${CUDA_MPS_LOG_DIRECTORY:-none}"', "tritonserver"]


def stand_in(bin_dir: Path, name: str, body: str) -> None:
    script = bin_dir / name
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)


def launch(tmp_path: Path, mode: str | None, *, gpu: bool = True, control: str | None = "exit 0",
           preset_pipe: str | None = None) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """Run the launcher in front of COMMAND; (its result, the control daemon's calls: argv and pipe directory)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / "calls"
    if gpu:
        stand_in(bin_dir, "nvidia-smi", 'echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)"\n')
    if control is not None:
        stand_in(bin_dir, "nvidia-cuda-mps-control", f'echo "$* $CUDA_MPS_PIPE_DIRECTORY" >> {calls}\n{control}\n')
    env = {"PATH": f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin", "TRITON_MPS_DIR": str(tmp_path / "mps")}
    if mode is not None:
        env["TRITON_MPS"] = mode
    if preset_pipe is not None:
        env["CUDA_MPS_PIPE_DIRECTORY"] = preset_pipe
    result = subprocess.run([sys.executable, str(LAUNCHER), *COMMAND], capture_output=True, text=True, env=env,
                            timeout=30, check=False)
    return result, calls.read_text().splitlines() if calls.exists() else []


@pytest.mark.parametrize("mode", [None, "auto", "on"])
def test_a_gpu_container_with_mps_starts_the_daemon_and_triton_as_its_client(tmp_path: Path, mode: str | None) -> None:
    result, calls = launch(tmp_path, mode)
    pipe, log = tmp_path / "mps" / "pipe", tmp_path / "mps" / "log"
    assert calls == [f"-d {pipe}"]
    assert result.returncode == 0 and result.stdout == f"ran tritonserver pipe={pipe} log={log}\n", result.stderr
    assert pipe.is_dir() and log.is_dir()
    assert "CUDA MPS daemon started" in result.stderr


@pytest.mark.parametrize(("gpu", "control", "why"), [
    (True, None, "no nvidia-cuda-mps-control in this container"),
    (False, "exit 0", "this container sees no GPU"),
    (True, "echo 'An instance of this daemon is already running' >&2; exit 1", "already running"),
])
def test_auto_starts_triton_without_mps_when_it_cannot_and_says_why(
    tmp_path: Path, gpu: bool, control: str | None, why: str
) -> None:
    result, _ = launch(tmp_path, "auto", gpu=gpu, control=control)
    assert result.returncode == 0 and result.stdout == "ran tritonserver pipe=none log=none\n", result.stderr
    assert "without CUDA MPS" in result.stderr and why in result.stderr


@pytest.mark.parametrize(("gpu", "control"), [(True, None), (True, "exit 3"), (False, "exit 0")])
def test_on_refuses_to_start_without_mps(tmp_path: Path, gpu: bool, control: str | None) -> None:
    result, _ = launch(tmp_path, "on", gpu=gpu, control=control)
    assert result.returncode == 1 and result.stdout == "", "Triton must not start"
    assert result.stderr.startswith("triton-mps: TRITON_MPS=on, but ") and len(result.stderr.splitlines()) == 1


def test_off_never_starts_the_daemon(tmp_path: Path) -> None:
    result, calls = launch(tmp_path, "off")
    assert calls == [] and result.stdout == "ran tritonserver pipe=none log=none\n"


def test_a_daemon_the_platform_runs_is_used_as_it_is(tmp_path: Path) -> None:
    result, calls = launch(tmp_path, "auto", preset_pipe="/run/nvidia/mps")
    assert calls == [] and result.stdout == "ran tritonserver pipe=/run/nvidia/mps log=none\n"


def test_an_unknown_setting_is_refused(tmp_path: Path) -> None:
    result, calls = launch(tmp_path, "yes")
    assert result.returncode == 2 and calls == [] and "TRITON_MPS must be auto, on or off" in result.stderr
