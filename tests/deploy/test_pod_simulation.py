"""The rendered server pod, run as local processes: its init container, then Triton and the
gateway sidecar with the commands, environment and mounts the kubelet would give them, sharing
/dev/shm, serve /embed with GATEWAY_SHM=system, then stop gracefully as on pod deletion.

What comes from the rendered pod (overlays/pvc, the default install): each container's argv (its
`command`/`args` over the image's ENTRYPOINT/CMD from docker/*/Dockerfile*, `$(VAR)` expanded),
its environment (envFrom ConfigMaps, env, the optional Secret of API and admin keys), its volume
mounts, its probes (paths and ports) and its termination order.

What is mapped to this machine, explicitly and nothing else:
- paths: every volumeMount's mountPath is rewritten to a local folder wherever it appears in argv
  and env values: the claim (model-repository) to a folder whose `models` is the builder's
  repository of tests/conftest.py `python_repository` (the pod's /model_repository/models), each
  other emptyDir to a temporary folder, and the `medium: Memory` emptyDir at /dev/shm to this
  machine's /dev/shm, which both processes share as the pod's two containers share the emptyDir;
- ports: each containerPort to a free local port (Triton gets --http-port/--grpc-port/
  --metrics-port, the gateway's GATEWAY_PORT and GATEWAY_TRITON_URL follow), listening on
  127.0.0.1 instead of 0.0.0.0;
- executables: `tritonserver` is the PyPI wheel's binary (the local CPU image's Triton,
  docker/triton/Dockerfile.pytriton) with its --backend-directory, `triton-mps` the checkout's
  docker/triton/mps.py run by this interpreter, and `python` this
  interpreter with the checkout on PYTHONPATH (the gateway image's /app);
- the python backend's region prefix (--backend-config=python,shm-region-prefix-name=...) is
  made unique, since this machine's /dev/shm is shared with other tests, unlike the pod's.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from devstack.tritonserver import (
    REPO_ROOT,
    find_tritonserver_home,
    free_port,
    kill_group,
    server_environment,
    unique_shm_prefix,
)
from gateway.settings import GatewaySettings
from tests.deploy.manifests import (
    Obj,
    container,
    container_env,
    effective_command,
    overlay,
    pod_spec,
)

DOCKERFILES = {
    "wait-for-repository": REPO_ROOT / "docker/gateway/Dockerfile",
    "gateway": REPO_ROOT / "docker/gateway/Dockerfile",
    "triton": REPO_ROOT / "docker/triton/Dockerfile.pytriton",
}
SECRETS = {"bert-triton-api-keys": {"GATEWAY_API_KEYS": "sim-api-key", "GATEWAY_ADMIN_KEYS": "sim-admin-key"}}
STARTUP_TIMEOUT_S = 120.0


class Pod:
    """The pod's volumes and ports mapped to this machine (see the module docstring)."""

    def __init__(self, objects: list[Obj], repository: Path, root: Path) -> None:
        self.objects = objects
        self.spec = pod_spec(objects)
        self.volumes: dict[str, Path] = {}
        for volume in self.spec["volumes"]:
            name = volume["name"]
            if "persistentVolumeClaim" in volume:  # the claim: its models/ is the builder's repository
                (root / name).mkdir(parents=True)
                (root / name / "models").symlink_to(repository, target_is_directory=True)
                self.volumes[name] = root / name
            elif volume.get("emptyDir", {}).get("medium") == "Memory":
                self.volumes[name] = Path("/dev/shm")
            else:
                assert "emptyDir" in volume, volume
                self.volumes[name] = root / name
                self.volumes[name].mkdir(parents=True)
        self.ports = {p["containerPort"]: free_port() for c in self.spec["containers"] for p in c.get("ports", [])}

    def mounts(self, ctr: Obj) -> dict[str, Path]:
        return {m["mountPath"]: self.volumes[m["name"]] / m.get("subPath", "") for m in ctr.get("volumeMounts", [])}

    def localize(self, ctr: Obj, value: str) -> str:
        """Container paths to local ones (one pass, longest mount path first), then addresses."""
        mounts = self.mounts(ctr)
        if mounts:
            pattern = "|".join(re.escape(p) for p in sorted(mounts, key=len, reverse=True))
            value = re.sub(rf"(?<![\w/])({pattern})(?![\w])", lambda m: str(mounts[m.group(1)]), value)
        return re.sub(r"\b(127\.0\.0\.1|localhost):(\d+)\b",
                      lambda m: f"127.0.0.1:{self.ports.get(int(m.group(2)), int(m.group(2)))}", value)

    def port(self, ctr: Obj, name_or_number: str | int) -> int:
        """The local port of a probe's port (a containerPort name or number)."""
        number = next((p["containerPort"] for p in ctr["ports"] if p["name"] == name_or_number), name_or_number)
        return self.ports[int(number)]

    def process(self, name: str, base_env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
        """argv and environment of one container, mapped to this machine."""
        ctr = container(self.spec, name)
        env = container_env(ctr, self.objects, SECRETS)
        argv = [self.localize(ctr, a) for a in effective_command(ctr, DOCKERFILES[name], env)]
        local_env = {**base_env, **{k: self.localize(ctr, v) for k, v in env.items()}}
        if argv[0] == "python":
            argv[0] = sys.executable
        return argv, local_env


def get(url: str, headers: Mapping[str, str] | None = None) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=dict(headers or {})), timeout=3) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return 0


def wait_for(url: str, process: subprocess.Popen[bytes], log: Path, timeout_s: float = STARTUP_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while get(url) != 200:
        assert process.poll() is None, f"exited with {process.returncode}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"{url} not 200 after {timeout_s}s:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)


@contextmanager
def started(argv: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    with log.open("ab") as out:
        process = subprocess.Popen(argv, env=env, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=30)
        kill_group(process.pid)


def clean_environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "PROMETHEUS_MULTIPROC_DIR"))}


@pytest.mark.slow  # the rendered pod's processes started for real: scripts/test -m slow
def test_rendered_pod_serves_embed_over_shared_memory(python_repository: Path, tmp_path: Path) -> None:
    objects = overlay("pvc")
    pod = Pod(objects, python_repository, tmp_path / "volumes")
    spec = pod.spec
    triton_ctr, gateway_ctr = container(spec, "triton"), container(spec, "gateway")
    home = find_tritonserver_home()
    python_prefix = unique_shm_prefix()

    # Init containers first, in order, each to completion.
    for init in spec.get("initContainers", []):
        argv, env = pod.process(init["name"], clean_environment())
        done = subprocess.run(argv, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stdout + done.stderr

    triton_argv, triton_env = pod.process("triton", server_environment(home))
    assert triton_argv[:2] == ["triton-mps", "tritonserver"], triton_argv  # the launcher (no GPU here: no MPS) execs it
    assert f"--model-repository={pod.volumes['model-repository']}/models" in triton_argv
    assert not [a for a in triton_argv if a.startswith(("--http-port", "--grpc-port", "--metrics-port"))]  # the defaults
    triton_argv = [sys.executable, str(REPO_ROOT / "docker" / "triton" / "mps.py"), str(home / "bin" / "tritonserver"),
                   *triton_argv[2:],
                   f"--backend-directory={home / 'backends'}",
                   f"--http-port={pod.ports[8000]}", f"--grpc-port={pod.ports[8001]}", f"--metrics-port={pod.ports[8002]}",
                   f"--backend-config=python,shm-region-prefix-name={python_prefix}"]

    gateway_argv, gateway_env = pod.process("gateway", clean_environment())
    assert gateway_argv[1:] == ["-m", "gateway"]  # the image's CMD
    assert gateway_env["GATEWAY_SHM"] == "system"
    assert gateway_env["GATEWAY_REPOSITORY"] == f"{pod.volumes['model-repository']}/models"
    assert gateway_env["GATEWAY_PORT"] == str(gateway_ctr["ports"][0]["containerPort"])
    gateway_env.update({"GATEWAY_PORT": str(pod.ports[8080]), "GATEWAY_HOST": "127.0.0.1", "PYTHONPATH": str(REPO_ROOT)})
    assert gateway_env["GATEWAY_TRITON_URL"] == f"127.0.0.1:{pod.ports[8001]}"
    prefix = gateway_env.get("GATEWAY_SHM_PREFIX") or GatewaySettings.model_fields["shm_prefix"].default

    def probe(ctr: Obj, kind: str) -> str:
        http = ctr[kind]["httpGet"]
        return f"http://127.0.0.1:{pod.port(ctr, http['port'])}{http['path']}"

    logs = tmp_path / "logs"
    logs.mkdir()
    try:
        with started(triton_argv, triton_env, logs / "triton.log") as triton, \
             started(gateway_argv, gateway_env, logs / "gateway.log") as gateway:
            wait_for(probe(triton_ctr, "startupProbe"), triton, logs / "triton.log")
            wait_for(probe(gateway_ctr, "readinessProbe"), gateway, logs / "gateway.log")
            assert get(probe(gateway_ctr, "livenessProbe")) == 200
            assert get(probe(triton_ctr, "livenessProbe")) == 200

            url = f"http://127.0.0.1:{pod.ports[8080]}"
            body: dict[str, Any] = {"model": "tinyemb", "inputs": ["hello world", "a pod of two containers"], "normalize": True}
            with httpx.Client(base_url=url, timeout=60) as http:
                assert http.post("/embed", json=body).status_code == 401  # the Secret's API key is on
                auth = {"Authorization": "Bearer sim-api-key"}
                answer = http.post("/embed", json=body, headers=auth)
                assert answer.status_code == 200, answer.text
                vectors = np.asarray(answer.json()["embeddings"])
                assert vectors.shape[0] == 2 and np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
                families = http.get("/admin/models", headers={"Authorization": "Bearer sim-admin-key"})
                assert families.status_code == 200, families.text
                assert "tinyemb" in {f["name"] for f in families.json()["data"]}
                # The tensors went through the shared /dev/shm: regions of this gateway, used by Triton.
                regions = sorted(Path("/dev/shm").glob(f"{prefix}_{gateway.pid}_*"))
                assert regions, f"no {prefix}_{gateway.pid}_* regions in /dev/shm"
                metrics = http.get("/metrics").text
                shm_calls = [line for line in metrics.splitlines()
                             if line.startswith("gateway_triton_request_duration_seconds_count") and 'transport="shm"' in line]
                assert shm_calls and any(float(line.rsplit(" ", 1)[1]) > 0 for line in shm_calls), metrics[-2000:]

            # Pod deletion: (preStop) then SIGTERM; the gateway first drains and frees its regions,
            # Triton (with the longer preStop) after it; both within the grace period.
            grace = spec["terminationGracePeriodSeconds"]
            gateway.send_signal(signal.SIGTERM)
            # uvicorn finishes its requests and lifespan, then re-raises the signal (exit 143 in the pod).
            assert gateway.wait(timeout=grace) in (0, -signal.SIGTERM)
            assert "Application shutdown complete" in (logs / "gateway.log").read_text()
            assert not list(Path("/dev/shm").glob(f"{prefix}_{gateway.pid}_*"))
            triton.send_signal(signal.SIGTERM)
            triton.wait(timeout=grace)
    finally:
        for leftover in Path("/dev/shm").glob(f"{python_prefix}*"):
            leftover.unlink(missing_ok=True)
