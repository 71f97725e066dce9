"""Triton's model-repository API in the Compose stack: only the gateway may load and unload models.

The CPU variant's triton command, as Compose resolves it (`sh -c SCRIPT tritonserver ARGS`), runs here with the
PyPI wheel's tritonserver (the local image's Triton), mapped to this machine and nothing else: the triton_key
volume (/run/triton-key) to a temporary folder, /model_repository/models to the fake repository, `tritonserver` to
the wheel's binary (first on PATH), and flags appended to ARGS for its backends, loopback ports of its own and a
python-backend region prefix of its own. Then:

- the key is made at the first start, and the same key is used at the next;
- without the key, Triton refuses a repository call over HTTP and over gRPC, and the model keeps serving;
- the gateway reading the volume's key (GATEWAY_TRITON_REPOSITORY_KEY_FILE, as compose sets it) discovers the
  models and its admin unload and load work; without the key it is not ready, and /readyz names the setting.
"""

from __future__ import annotations

import os
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from devstack.tritonserver import (
    LOOPBACK,
    find_tritonserver_home,
    free_port,
    kill_group,
    server_environment,
    unique_shm_prefix,
)
from gateway.triton.client import GRPC_RESTRICTED_PREFIX, REPOSITORY_KEY_HEADER
from tests.fixtures.waiting import wait_until
from tests.gateway.conftest import running_gateway
from tests.stack.test_static import ENV_EXAMPLE, compose_config
from tests.stack.tools import ensure_tools

KEY_DIR = "/run/triton-key"
ADMIN = {"Authorization": "Bearer admin-key"}


def triton_command(variant: str) -> list[str]:
    """The triton service's command as the container gets it (`config` writes a `$` as `$$`)."""
    ensure_tools()
    return [a.replace("$$", "$") for a in compose_config(variant, ENV_EXAMPLE)["services"]["triton"]["command"]]


def restricted_flags(script: str) -> list[str]:
    return [word.strip('"') for word in script.split() if "restricted" in word]


def test_every_variant_restricts_the_repository_api_with_the_volumes_key() -> None:
    """Both commands (GPU, CPU) restrict the API over gRPC and HTTP with the key of the volume that only Triton and
    the gateway mount, under the header the gateway sends."""
    for variant in ("gpu", "cpu"):
        command = triton_command(variant)
        assert command[:2] == ["sh", "-c"] and command[3] == "tritonserver", command[:4]
        assert restricted_flags(command[2]) == [
            f"--grpc-restricted-protocol=model-repository:{REPOSITORY_KEY_HEADER}=$key",
            f"--http-restricted-api=model-repository:{REPOSITORY_KEY_HEADER}=$key"], command[2]
        assert f"key=$(cat {KEY_DIR}/key)" in command[2]
    services = compose_config("gpu", ENV_EXAMPLE)["services"]
    mounts = {name: {v["target"]: v for v in s.get("volumes", [])} for name, s in services.items()}
    holders = {name for name, targets in mounts.items() if KEY_DIR in targets}
    assert holders == {"triton", "gateway"}, holders
    assert mounts["gateway"][KEY_DIR]["read_only"] and not mounts["triton"][KEY_DIR].get("read_only")
    assert services["gateway"]["environment"]["GATEWAY_TRITON_REPOSITORY_KEY_FILE"] == f"{KEY_DIR}/key"


@contextmanager
def compose_triton(repository: Path, keys: Path, tmp: Path) -> Iterator[dict[str, Any]]:
    """The CPU variant's triton command running here (see the module docstring); its ports and log."""
    home = find_tritonserver_home()
    bin_dir = tmp / "bin"
    bin_dir.mkdir(exist_ok=True)
    if not (bin_dir / "tritonserver").exists():
        (bin_dir / "tritonserver").symlink_to(home / "bin" / "tritonserver")
    ports = {"http": free_port(), "grpc": free_port(), "metrics": free_port()}
    prefix = unique_shm_prefix()
    argv = [a.replace(KEY_DIR, str(keys)).replace("/model_repository/models", str(repository))
            for a in triton_command("cpu")]
    argv += [f"--backend-directory={home / 'backends'}", f"--http-address={LOOPBACK}", f"--grpc-address={LOOPBACK}",
             f"--metrics-address={LOOPBACK}", f"--http-port={ports['http']}", f"--grpc-port={ports['grpc']}",
             f"--metrics-port={ports['metrics']}", f"--backend-config=python,shm-region-prefix-name={prefix}"]
    env = server_environment(home)
    env["PATH"] = os.pathsep.join((str(bin_dir), env["PATH"]))
    log = tmp / "triton.log"
    with log.open("ab") as out:
        process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_until(lambda: process.poll() is not None or status(f"http://{LOOPBACK}:{ports['http']}/v2/health/ready") == 200,
                   "triton ready", within_s=120)
        assert process.poll() is None, log.read_text()[-3000:]
        yield {**ports, "log": log}
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        kill_group(process.pid)
        for leftover in Path("/dev/shm").glob(f"{prefix}*"):
            leftover.unlink(missing_ok=True)


def status(url: str, method: str = "GET", headers: dict[str, str] | None = None) -> int:
    request = urllib.request.Request(url, method=method, data=b"{}" if method == "POST" else None,
                                     headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


@pytest.mark.slow  # a devstack with the key against one without: `scripts/test -m slow`
@pytest.mark.anyio
async def test_only_the_key_holder_may_unload(fake_repository: Path, tmp_path: Path) -> None:
    keys = tmp_path / "triton-key"
    keys.mkdir()
    with compose_triton(fake_repository, keys, tmp_path) as triton:
        key = (keys / "key").read_text().strip()
        assert len(key) == 64, key  # made at the first start: 32 random bytes
        http, grpc_url = f"http://{LOOPBACK}:{triton['http']}", f"{LOOPBACK}:{triton['grpc']}"
        unload = f"{http}/v2/repository/models/fakeemb_onnx_ensemble/unload"
        assert status(unload, "POST") == 403
        assert status(unload, "POST", {REPOSITORY_KEY_HEADER: "not-the-key"}) == 403
        grpc = grpcclient.InferenceServerClient(grpc_url)
        with pytest.raises(InferenceServerException) as refused:
            grpc.unload_model("fakeemb_onnx_ensemble")
        assert "restricted" in (refused.value.message() or "")
        assert grpc.is_model_ready("fakeemb_onnx_ensemble")  # nothing was unloaded
        index = grpc.get_model_repository_index(headers={GRPC_RESTRICTED_PREFIX + REPOSITORY_KEY_HEADER: key})
        assert {m.name for m in index.models} >= {"fakeemb_onnx_ensemble", "fakecls_onnx_ensemble"}
        grpc.close()

        settings = {"triton_http_url": f"{LOOPBACK}:{triton['http']}", "shm": "none", "admin_keys": "admin-key",
                    "triton_repository_key_file": str(keys / "key")}
        async with running_gateway(grpc_url, **settings) as (_, client):
            ready = await client.get("/readyz")
            assert ready.status_code == 200 and ready.json()["triton"]["repository"] == "ok", ready.text
            gone = await client.post("/admin/models/fakeemb/unload", headers=ADMIN)
            assert gone.status_code == 200 and gone.json()["state"] == "unloaded", gone.text
            back = await client.post("/admin/models/fakeemb/load", headers=ADMIN)
            assert back.status_code == 200 and back.json()["state"] == "ready", back.text
            embedded = await client.post("/embed", json={"model": "fakeemb", "inputs": ["a b"]})
            assert embedded.status_code == 200, embedded.text

        async with running_gateway(grpc_url, **{**settings, "triton_repository_key_file": ""}) as (_, client):
            ready = await client.get("/readyz")
            assert ready.status_code == 503, ready.text
            assert "GATEWAY_TRITON_REPOSITORY_KEY_FILE" in ready.json()["reason"], ready.json()
            assert "GATEWAY_TRITON_REPOSITORY_KEY_FILE" in ready.json()["triton"]["repository"]

    with compose_triton(fake_repository, keys, tmp_path):  # a restart keeps the key the gateway holds
        assert (keys / "key").read_text().strip() == key
