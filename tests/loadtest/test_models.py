"""`python -m loadtest random-model` (the README's way to make a test model): usage, not a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from devstack.tritonserver import REPO_ROOT


@pytest.mark.parametrize(("argv", "code"), [([], 2), (["--help"], 0), (["/tmp/x", "generate"], 2)],
                         ids=["no arguments", "help", "wrong task"])
def test_models_cli_prints_usage(argv: list[str], code: int) -> None:
    result = subprocess.run([sys.executable, "-m", "loadtest", "random-model", *argv], capture_output=True, text=True,
                            cwd=REPO_ROOT, timeout=60, check=False)
    assert result.returncode == code, result.stderr
    out = result.stdout + result.stderr
    assert "usage: python -m loadtest random-model" in out and "Traceback" not in out, out
    assert "{classify,embed}" in out
