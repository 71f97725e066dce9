"""The bare-front experiment's sitecustomize (loadtest/experiments/bare_front): with BARE_FRONT, the gateway's protocol
class is replaced by one that serves POST /embed itself; without it, nothing is patched."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from devstack.tritonserver import REPO_ROOT

PROBE = "import gateway.http_protocol as p; print(p.NoDelayHttpToolsProtocol.__name__)"


def protocol_class(mode: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "BARE_FRONT"}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT / "loadtest/experiments/bare_front"), str(REPO_ROOT)])
    if mode is not None:
        env["BARE_FRONT"] = mode
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=REPO_ROOT, capture_output=True, text=True,
                         check=True)
    return out.stdout.strip()


@pytest.mark.slow  # a GPU experiment's CPU smoke run (~2 s): `scripts/test -m slow`
def test_the_protocol_is_replaced_only_when_asked() -> None:
    assert protocol_class("logged") == "BareEmbedProtocol"
    assert protocol_class(None) == "NoDelayHttpToolsProtocol"
