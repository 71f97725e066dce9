"""End-to-end: the Compose stack built and started for real on this CPU machine (marker e2e;
run with scripts/test-e2e, not part of the default suite).

compose.yaml + compose.cpu.yaml + compose.local.yaml: every image built from the local Debian
base (scripts/build-local-base) with wheels from docker/wheelhouse (scripts/fill-wheelhouse);
Triton is the PyPI-wheel tritonserver, the builder builds two tiny random BERT models (written
here, mounted into the builder) with `--runtime python --device cpu --formats onnx`. Checks
/classify and /embed through the published port (tensors over system shared memory between the
gateway and Triton containers), both Prometheus targets up, the update workflow of docs/deployment.md under a
background load (`docker compose run --rm builder` builds version 2 of the embedder from other
weights, the admin reload switches to it: answers change, no request fails, every answer is the old
or the new vector), the second `up` reusing the built repository (the host folder
MODEL_REPOSITORY_DIR, here in the test's temp dir), and that `down -v` leaves no container or
volume. Timings go to E2E_TIMINGS (default .cache/e2e-timings.json).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from devstack.tritonserver import free_port
from tests.fixtures.tiny_models import HIDDEN_SIZE, LABELS, write_tiny_classifier, write_tiny_embedder
from tests.fixtures.waiting import wait_until
from tests.stack.tools import REPO_ROOT, clean_environment, compose_command, ensure_tools

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

TIMINGS = Path(os.environ.get("E2E_TIMINGS", REPO_ROOT / ".cache" / "e2e-timings.json"))
ADMIN_KEY = "e2e-admin-key"
EMBED_TEXTS = ["hello world", "文本测试", "a third text, a bit longer than the others"]


def docker_available() -> bool:
    docker = shutil.which("docker")
    return bool(docker) and subprocess.run([docker, "info"], capture_output=True).returncode == 0


@dataclass
class Stack:
    """One Compose project of the local CPU variant, with free host ports."""

    workdir: Path
    # One fixed project name: compose labels the images it builds with it, so a random name per run
    # would rebuild every image and leave the previous ones dangling (<none>).
    project: str = field(default_factory=lambda: os.environ.get("E2E_PROJECT", "bert-e2e"))
    ports: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("GATEWAY_PUBLISHED_PORT", "TRITON_HTTP_PORT", "TRITON_GRPC_PORT", "TRITON_METRICS_PORT", "PROMETHEUS_PORT"):
            self.ports[name] = free_port()

    def env(self) -> dict[str, str]:
        return {
            **clean_environment(),
            "COMPOSE_PROJECT_NAME": self.project,
            "MODELS_SPEC": str(self.workdir / "models.yaml"),
            "MODEL_REPOSITORY_DIR": str(self.workdir / "model_repository"),
            "GATEWAY_ADMIN_KEYS": ADMIN_KEY,
            "TRITON_START_PERIOD": "120s",
            **{k: str(v) for k, v in self.ports.items()},
        }

    def compose(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = compose_command("local", env_file=REPO_ROOT / ".env.example")
        at = cmd.index("--env-file")
        cmd[at:at] = ["-f", str(self.workdir / "compose.e2e.yaml")]
        out = subprocess.run(cmd + list(args), capture_output=True, text=True, env=self.env(), cwd=REPO_ROOT)
        if check and out.returncode != 0:
            logs = "" if args[0] == "logs" else self.compose("logs", "--no-color", "--tail", "80", check=False).stdout
            raise AssertionError(f"docker compose {' '.join(args)} failed:\n{out.stderr[-3000:]}\nlogs:\n{logs}")
        return out

    def url(self, port: str, path: str) -> str:
        return f"http://127.0.0.1:{self.ports[port]}{path}"


def http_json(url: str, body: dict[str, Any] | None = None, timeout: float = 30,
              headers: dict[str, str] | None = None, method: str | None = None) -> tuple[int, Any]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={**({"Content-Type": "application/json"} if data else {}), **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
            status = response.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode(errors="replace")


def wait_for_stack(what: str, probe: Any, timeout_s: float, stack: Stack) -> float:
    """Poll `probe()` until true; returns the seconds it took (fails with the service logs)."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        try:
            if probe():
                return time.monotonic() - start
        except OSError:
            pass
        time.sleep(1)
    logs = stack.compose("logs", "--no-color", "--tail", "60", check=False).stdout
    ps = stack.compose("ps", "-a", check=False).stdout
    raise AssertionError(f"{what} not reached in {timeout_s}s\n{ps}\n{logs}")


def gateway_ready(stack: Stack) -> bool:
    return http_json(stack.url("GATEWAY_PUBLISHED_PORT", "/readyz"), timeout=3)[0] == 200


def write_inputs(workdir: Path) -> None:
    """Tiny models, the spec naming them by their path in the builder, and the override mounting them."""
    write_tiny_classifier(workdir / "local-models" / "tinycls")
    write_tiny_embedder(workdir / "local-models" / "tinyemb")
    write_tiny_embedder(workdir / "local-models" / "tinyemb-v2", seed=2)  # the update: other weights
    (workdir / "model_repository").mkdir()
    spec = {
        "defaults": {"device": "cpu", "runtime": "python", "formats": "onnx", "max_batch_size": 8, "max_seq_len": 64},
        "models": [
            {"name": "tinycls", "model": "/local-models/tinycls", "task": "classify", "labels": ",".join(LABELS)},
            {"name": "tinyemb", "model": "/local-models/tinyemb", "task": "embed"},
        ],
    }
    (workdir / "models.yaml").write_text(yaml.safe_dump(spec))
    override = {"services": {"builder": {"volumes": [f"{workdir / 'local-models'}:/local-models:ro"]}}}
    (workdir / "compose.e2e.yaml").write_text(yaml.safe_dump(override))
    for path in workdir.rglob("*"):  # the containers run as other users
        path.chmod(0o755 if path.is_dir() else 0o644)


def dangling_images(project: str) -> list[str]:
    """Untagged (<none>) images that compose built for `project`."""
    label = f"label=com.docker.compose.project={project}"
    return subprocess.run(["docker", "images", "-q", "--filter", "dangling=true", "--filter", label],
                          capture_output=True, text=True, check=True).stdout.split()


def project_leftovers(project: str) -> list[str]:
    label = f"label=com.docker.compose.project={project}"
    containers = subprocess.run(["docker", "ps", "-aq", "--filter", label], capture_output=True, text=True).stdout.split()
    volumes = subprocess.run(["docker", "volume", "ls", "-q", "--filter", label], capture_output=True, text=True).stdout.split()
    networks = subprocess.run(["docker", "network", "ls", "-q", "--filter", label], capture_output=True, text=True).stdout.split()
    return containers + volumes + networks


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    if not docker_available():
        if os.environ.get("E2E_REQUIRE_DOCKER") == "1":  # scripts/test-e2e: a missing daemon is a failure
            pytest.fail("no Docker daemon reachable, and scripts/test-e2e could not start one")
        pytest.skip("no Docker daemon reachable (start dockerd; see docs/deployment.md)")
    ensure_tools()
    subprocess.run([str(REPO_ROOT / "scripts" / "build-local-base")], check=True, capture_output=True)
    subprocess.run([str(REPO_ROOT / "scripts" / "fill-wheelhouse")], check=True, env={**os.environ, "PYTHON": str(REPO_ROOT / ".venv/bin/python")})
    tmp_path.chmod(0o755)
    write_inputs(tmp_path)
    stack = Stack(tmp_path)
    stack.compose("down", "--volumes", "--remove-orphans", "--timeout", "10", check=False)  # an aborted run's
    try:
        yield stack
    finally:
        stack.compose("down", "--volumes", "--remove-orphans", "--timeout", "10", check=False)


def embed(stack: Stack) -> tuple[int, Any]:
    return http_json(stack.url("GATEWAY_PUBLISHED_PORT", "/embed"), {"model": "tinyemb", "inputs": EMBED_TEXTS})


def update_under_load(stack: Stack) -> float:
    """The update workflow of docs/deployment.md while a client calls /embed in a loop: build version 2 (the spec
    now names other weights), reload, check readiness. Returns the seconds the three commands took."""
    status, body = embed(stack)
    assert status == 200, body
    old = body["embeddings"]
    spec = yaml.safe_load((stack.workdir / "models.yaml").read_text())
    spec["models"][1]["model"] = "/local-models/tinyemb-v2"
    (stack.workdir / "models.yaml").write_text(yaml.safe_dump(spec))

    answers: list[tuple[int, Any]] = []
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            answers.append(embed(stack))

    client = threading.Thread(target=load)
    client.start()
    start = time.monotonic()
    try:
        built = stack.compose("run", "--rm", "builder")  # 1: docker compose run --rm builder
        assert "tinyemb: built" in built.stdout and "as version 2" in built.stdout, built.stdout
        assert "tinycls: up to date" in built.stdout, built.stdout
        status, body = http_json(stack.url("GATEWAY_PUBLISHED_PORT", "/admin/models/tinyemb/reload"), method="POST",
                                 headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=300)  # 2: reload
        assert status == 200 and body["state"] == "ready", body
        status, body = http_json(stack.url("GATEWAY_PUBLISHED_PORT", "/readyz"))  # 3: readiness
        assert status == 200 and body["families"] == {"tinycls": "ready", "tinyemb": "ready"}, body
        took = time.monotonic() - start
        ready_at = len(answers)
        wait_until(lambda: len(answers) >= ready_at + 5, "answers after the reload", within_s=120)  # the new model's
    finally:
        stop.set()
        client.join()
    status, body = embed(stack)
    assert status == 200, body
    new = body["embeddings"]
    assert new != old
    failed = [a for a in answers if a[0] != 200]
    assert answers and not failed, failed[:3]
    seen = {"old": 0, "new": 0}
    for _, body in answers:
        for row, was, now in zip(body["embeddings"], old, new):
            which = "old" if max(abs(a - b) for a, b in zip(row, was)) < 1e-4 else "new"
            assert which == "old" or max(abs(a - b) for a, b in zip(row, now)) < 1e-4, "neither old nor new"
            seen[which] += 1
    assert seen["old"] and seen["new"], seen
    print(f"update under load: {len(answers)} requests, none failed, {seen}, {took:.1f}s")
    return took


def test_compose_stack_end_to_end(stack: Stack) -> None:
    timings: dict[str, float] = {}
    start = time.monotonic()
    stack.compose("build")
    timings["build_s"] = time.monotonic() - start
    # The fixed tags now name the new images; a code change leaves the old ones untagged: remove them
    # (only this project's), so that runs do not pile up <none> images.
    subprocess.run(["docker", "image", "prune", "--force", "--filter",
                    f"label=com.docker.compose.project={stack.project}"], capture_output=True, check=True)
    assert dangling_images(stack.project) == []

    start = time.monotonic()
    stack.compose("up", "-d")
    wait_for_stack("gateway /readyz", lambda: gateway_ready(stack), 600, stack)
    timings["first_up_s"] = time.monotonic() - start
    builder_log = stack.compose("logs", "--no-color", "builder").stdout
    assert "tinycls: built" in builder_log and "tinyemb: built" in builder_log, builder_log

    status, body = http_json(stack.url("GATEWAY_PUBLISHED_PORT", "/classify"), {"inputs": ["good movie", "정말 좋아요", "bad film"]})
    assert status == 200, body
    assert body["model"] == "tinycls" and len(body["predictions"]) == 3
    for prediction in body["predictions"]:
        assert prediction["label"] in LABELS and set(prediction["scores"]) == set(LABELS)
        assert abs(sum(prediction["scores"].values()) - 1) < 1e-4
    # normalize asked for: tinyemb's modules.json has no Normalize module, so its default is raw vectors
    status, body = http_json(stack.url("GATEWAY_PUBLISHED_PORT", "/embed"),
                             {"inputs": ["hello world", "文本测试"], "normalize": True})
    assert status == 200, body
    assert body["model"] == "tinyemb" and body["dimensions"] == HIDDEN_SIZE and len(body["embeddings"]) == 2
    for vector in body["embeddings"]:
        assert len(vector) == HIDDEN_SIZE and abs(sum(v * v for v in vector) - 1) < 1e-4
    assert body["embeddings"][0] != body["embeddings"][1]

    # The gateway reads the repository volume (read-only): it tokenizes and batches itself.
    status, body = http_json(stack.url("GATEWAY_PUBLISHED_PORT", "/v1/models"))
    assert status == 200 and {m["id"]: m["pipeline"] for m in body["data"]} == {"tinycls": "scheduler",
                                                                               "tinyemb": "scheduler"}, body
    # The gateway and Triton containers share /dev/shm (ipc: service:triton): calls went over shm.
    metrics = urllib.request.urlopen(stack.url("GATEWAY_PUBLISHED_PORT", "/metrics"), timeout=10).read().decode()
    shm_calls = [l for l in metrics.splitlines() if l.startswith("gateway_triton_request_duration_seconds_count") and 'transport="shm"' in l]
    assert shm_calls and all(float(l.rsplit(" ", 1)[1]) > 0 for l in shm_calls), metrics
    # ... through Triton's HTTP endpoint (GATEWAY_TRITON_HTTP_URL=triton:8000): no worker found it refusing and
    # fell back to gRPC (gateway/triton/client.py logs each time it does)
    gateway_log = stack.compose("logs", "--no-color", "gateway").stdout
    assert "HTTP endpoint" not in gateway_log, gateway_log[-3000:]

    def both_targets_up() -> bool:
        status, body = http_json(stack.url("PROMETHEUS_PORT", "/api/v1/targets"), timeout=5)
        if status != 200:
            return False
        health = {t["labels"]["job"]: t["health"] for t in body["data"]["activeTargets"]}
        return health == {"gateway": "up", "triton": "up"}

    wait_for_stack("both Prometheus targets up", both_targets_up, 60, stack)
    status, body = http_json(stack.url("PROMETHEUS_PORT", "/api/v1/query?query=sum(nv_inference_request_success)"))
    assert status == 200 and body["data"]["result"], body

    timings["update_s"] = update_under_load(stack)

    # Second start: containers gone, volumes kept; the builder finds the manifests unchanged.
    stack.compose("down", "--timeout", "10")
    start = time.monotonic()
    stack.compose("up", "-d")
    wait_for_stack("gateway /readyz after restart", lambda: gateway_ready(stack), 300, stack)
    timings["second_up_s"] = time.monotonic() - start
    builder_log = stack.compose("logs", "--no-color", "builder").stdout
    assert "tinycls: up to date" in builder_log and "tinyemb: up to date" in builder_log, builder_log
    status, body = http_json(stack.url("GATEWAY_PUBLISHED_PORT", "/classify"), {"inputs": ["good movie"]})
    assert status == 200, body

    stack.compose("down", "--volumes", "--remove-orphans", "--timeout", "10")
    assert project_leftovers(stack.project) == []
    TIMINGS.parent.mkdir(parents=True, exist_ok=True)
    TIMINGS.write_text(json.dumps({k: round(v, 1) for k, v in timings.items()}, indent=2) + "\n")
    print("e2e timings:", timings)
