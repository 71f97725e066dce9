"""Paths and tool lookup shared by the stack tests (compose binary, hadolint, promtool)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILES = {
    "gpu": ("compose.yaml",),
    "cpu": ("compose.yaml", "compose.cpu.yaml"),
    "local": ("compose.yaml", "compose.cpu.yaml", "compose.local.yaml"),
    "cuda-shm": ("compose.yaml", "compose.cuda-shm.yaml"),
    "gpu-ids": ("compose.yaml", "compose.gpu-ids.yaml"),
}


def ensure_tools() -> None:
    """Run scripts/install-tools (idempotent: compose into .cache/bin, hadolint into .venv, promtool)."""
    subprocess.run([str(REPO_ROOT / "scripts" / "install-tools")], check=True, cwd=REPO_ROOT)


def compose_binary() -> Path:
    """The Docker Compose v2 binary (standalone: `config` needs no Docker daemon)."""
    return REPO_ROOT / ".cache" / "bin" / "docker-compose"


def hadolint_binary() -> str:
    venv = REPO_ROOT / ".venv" / "bin" / "hadolint"
    return str(venv) if venv.exists() else (shutil.which("hadolint") or "hadolint")


def promtool_binary() -> str:
    return shutil.which("promtool") or "promtool"


def compose_command(variant: str, *args: str, env_file: Path | None = None) -> list[str]:
    """`docker-compose -f ... [--env-file] ARGS` for one variant of the stack."""
    cmd = [str(compose_binary()), "--project-directory", str(REPO_ROOT)]
    for name in COMPOSE_FILES[variant]:
        cmd += ["-f", str(REPO_ROOT / name)]
    if env_file is not None:
        cmd += ["--env-file", str(env_file)]
    return cmd + list(args)


def clean_environment() -> dict[str, str]:
    """This environment without the variables a Compose file interpolates (so .env files decide)."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("COMPOSE_", "GATEWAY_", "MODEL_", "TRITON_", "OTEL_"))}
