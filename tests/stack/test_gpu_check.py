"""docker/triton/gpu_check.py (run before tritonserver in compose.yaml): a host whose GPUs are of several
architectures is refused when the repository holds TensorRT plans; nvidia-smi is a stand-in script here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from devstack.tritonserver import REPO_ROOT

CHECK = REPO_ROOT / "docker" / "triton" / "gpu_check.py"


def check(tmp_path: Path, gpus: list[str], plans: list[str]) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\n" + "".join(f"echo '{line}'\n" for line in gpus))
    smi.chmod(0o755)
    repository = tmp_path / "models"
    for name in plans:
        (repository / name / "1").mkdir(parents=True, exist_ok=True)
        (repository / name / "1" / "model.plan").write_bytes(b"plan")
    repository.mkdir(exist_ok=True)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run([sys.executable, str(CHECK), str(repository)], capture_output=True, text=True, env=env)


@pytest.mark.parametrize(("gpus", "plans", "refused"), [
    (["0, NVIDIA H100 80GB HBM3, 9.0", "1, NVIDIA H100 80GB HBM3, 9.0"], ["m_trt_fp16"], False),
    (["0, NVIDIA H100 80GB HBM3, 9.0", "1, NVIDIA L40S, 8.9"], [], False),  # ONNX steps load anywhere
    (["0, NVIDIA H100 80GB HBM3, 9.0", "1, NVIDIA L40S, 8.9"], ["m_trt_fp16"], True),
])
def test_mixed_architectures_are_refused_only_with_tensorrt_plans(
    tmp_path: Path, gpus: list[str], plans: list[str], refused: bool
) -> None:
    result = check(tmp_path, gpus, plans)
    assert result.returncode == (1 if refused else 0), result.stderr
    if refused:
        assert "2 architectures" in result.stderr and "m_trt_fp16" in result.stderr
        assert "compose.gpu-ids.yaml" in result.stderr and "GPU 1 (NVIDIA L40S)" in result.stderr
