"""README.md's no-Docker block, followed as a newcomer would on a fresh clone of this repository at HEAD: the setup
command, a random model, the build, devstack, then `/embed` answers.

The commands are read from README.md between `<!-- no-docker:begin -->` and `<!-- no-docker:end -->`, so that the
test follows what the README says. The block's commands run in order in the clone's root, as one bash script up
to the long-running devstack line; the gateway's port comes from GATEWAY_PORT (a free one: 8080 may be taken
here). Slow (a fresh .venv: minutes): `scripts/test -m slow tests/test_readme_no_docker.py`."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from contextlib import suppress
from pathlib import Path

import httpx
import psutil
import pytest

from devstack.tritonserver import REPO_ROOT, free_port
from tests.fixtures.waiting import wait_until

BEGIN, END = "<!-- no-docker:begin -->", "<!-- no-docker:end -->"
DEVSTACK = re.compile(r"-m devstack\b")
BANNER = re.compile(r"^gateway (http://\S+)", re.MULTILINE)
SETUP_TIMEOUT_S = 1200  # a fresh .venv from pip's cache, the build and devstack's start, on a loaded 2-core machine


def no_docker_commands(readme: str) -> list[str]:
    """The shell commands of the README's no-Docker block (comments and blank lines left out)."""
    assert readme.count(BEGIN) == 1 and readme.count(END) == 1, "README.md lost its no-docker markers"
    block = readme.split(BEGIN, 1)[1].split(END, 1)[0]
    fenced = re.search(r"```(?:bash|sh)?\n(.*?)```", block, re.DOTALL)
    assert fenced, "no fenced code block between the no-docker markers"
    text = fenced.group(1).replace("\\\n", " ")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def test_the_block_reads_as_setup_random_model_build_devstack() -> None:
    commands = no_docker_commands((REPO_ROOT / "README.md").read_text())
    assert commands[0].startswith("scripts/setup"), commands
    assert sum(bool(DEVSTACK.search(c)) for c in commands) == 1, commands


@pytest.mark.slow
@pytest.mark.timeout(SETUP_TIMEOUT_S + 120)
def test_readme_no_docker_block_on_a_fresh_clone(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(REPO_ROOT), str(clone)], check=True, timeout=120)
    commands = no_docker_commands((clone / "README.md").read_text())
    at = next(i for i, c in enumerate(commands) if DEVSTACK.search(c))
    port = free_port()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GATEWAY_", "TRITON_", "VIRTUAL_ENV", "PYTHON"))}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if ".venv" not in p)
    env["GATEWAY_PORT"] = str(port)
    script = "set -euo pipefail\n" + "\n".join(commands[: at + 1]) + "\n"
    output = tmp_path / "output.txt"
    with open(output, "wb") as out:
        process = subprocess.Popen(["bash", "-c", script], cwd=clone, env=env, stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        wait_until(lambda: bool(BANNER.search(output.read_text(errors="replace"))) or process.poll() is not None,
                   "devstack's banner", within_s=SETUP_TIMEOUT_S, poll_s=1.0)
        banner = BANNER.search(output.read_text(errors="replace"))
        assert banner is not None, f"the block stopped (exit {process.returncode}):\n{output.read_text()}"
        assert banner.group(1) == f"http://127.0.0.1:{port}"
        for command in commands[at + 1:]:
            subprocess.run(["bash", "-c", command], cwd=clone, env=env, check=True, timeout=120)
        texts = ["hello", "정말 재미있어요"]
        answer = httpx.post(f"{banner.group(1)}/embed", json={"inputs": texts}, timeout=60)
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert len(body["embeddings"]) == 2 and len(body["embeddings"][0]) > 0, body
    finally:
        started_processes = psutil.Process(process.pid).children(recursive=True) if process.poll() is None else []
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)  # devstack's Ctrl-C: stops Triton and the gateway
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        for child in started_processes:  # Triton and the gateway run in sessions of their own
            with suppress(psutil.Error):
                child.kill()
    assert process.returncode in (0, -signal.SIGINT), output.read_text()
