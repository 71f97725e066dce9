"""What a result was measured on: host, CPU, GPU, Python and package versions, git commit."""

from __future__ import annotations

import os
import platform
import subprocess
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

from pydantic import BaseModel

PACKAGES = ("tritonclient", "tokenizers", "onnxruntime", "onnxruntime-gpu", "torch", "transformers",
            "numpy", "fastapi", "uvicorn", "aiohttp", "orjson", "grpcio")


class Machine(BaseModel):
    """A snapshot of the measuring machine and software."""

    measured_at: str
    hostname: str
    platform: str
    cpu: str
    cpu_count: int
    memory_gib: float
    gpu: str | None
    python: str
    packages: dict[str, str]
    git_commit: str | None


def cpu_model() -> str:
    """The CPU's model name as the kernel shows it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float:
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        return round(kb / 2**20, 1)
    except (OSError, ValueError, IndexError):
        return 0.0


def _run(cmd: list[str]) -> str | None:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=True)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def describe_machine() -> Machine:
    """Describe this machine now."""
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    gpu = _run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])
    return Machine(
        measured_at=datetime.now(UTC).isoformat(timespec="seconds"),
        hostname=platform.node(),
        platform=platform.platform(),
        cpu=cpu_model(),
        cpu_count=os.cpu_count() or 0,
        memory_gib=_memory_gib(),
        gpu=gpu,
        python=platform.python_version(),
        packages=versions,
        # $LOADTEST_GIT_COMMIT first: the GPU host gets a copy of a tree without (or with a stale) .git, and an older
        # tree copied inside this checkout would otherwise report this checkout's commit
        git_commit=os.environ.get("LOADTEST_GIT_COMMIT")
        or _run(["git", "-C", str(Path(__file__).resolve().parent), "rev-parse", "--short", "HEAD"]),
    )
