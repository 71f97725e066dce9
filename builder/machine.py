"""What this machine can run: a build made for a GPU needs one here (an NVIDIA device node)."""

from __future__ import annotations

from pathlib import Path

DEVICES = Path("/dev")
# What to build with for a machine without a GPU and Docker: the CPU tritonserver of scripts/setup, which
# `python -m devstack` runs, has the python backend only.
LOCAL_BUILD = "--runtime python --device cpu"


def nvidia_gpus() -> int:
    """The NVIDIA GPUs this process sees (/dev/nvidia0, /dev/nvidia1, ...; a container gets those it was given)."""
    return sum(1 for node in DEVICES.glob("nvidia*") if node.name.removeprefix("nvidia").isdigit())
