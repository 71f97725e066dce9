#!/usr/bin/env python3
"""Before tritonserver starts: refuse a host whose visible GPUs are of several architectures while the
repository holds TensorRT engines (a plan is built for one compute capability: a GPU of another one
cannot load it). One line says what to do; exit 1. Every other case starts Triton as it is.

    triton-gpu-check /model_repository/models && exec tritonserver ...
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path


def architectures() -> dict[str, list[str]]:
    """compute capability -> GPU names/indices visible to this container (empty without nvidia-smi)."""
    if shutil.which("nvidia-smi") is None:
        return {}
    out = subprocess.run(["nvidia-smi", "--query-gpu=index,name,compute_cap", "--format=csv,noheader"],
                         capture_output=True, text=True, check=False).stdout
    found: dict[str, list[str]] = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3:
            index, name, cap = parts
            found.setdefault(cap, []).append(f"{index} ({name})")
    return found


def tensorrt_engines(repository: Path) -> list[str]:
    """Model entries of the repository that hold a TensorRT plan."""
    return sorted({plan.parent.parent.name for plan in repository.glob("*/*/model.plan")})


def main(argv: list[str]) -> int:
    repository = Path(argv[1] if len(argv) > 1 else "/model_repository/models")
    found = architectures()
    engines = tensorrt_engines(repository)
    if len(found) > 1 and engines:
        listing = "; ".join(f"sm {cap}: GPU {', '.join(gpus)}" for cap, gpus in sorted(found.items()))
        print(f"triton: the GPUs this container sees are of {len(found)} architectures ({listing}), and the "
              f"TensorRT engines of {', '.join(engines)} are built for one. Give Triton GPUs of one architecture "
              "(compose.gpu-ids.yaml with GPU_DEVICE_ID, or TRITON_GPU_COUNT), or build the models with "
              "--formats onnx.", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
