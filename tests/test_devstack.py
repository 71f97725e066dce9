"""devstack (`python -m devstack`, LocalStack, TritonServer) with real processes, and the gateway's
environment in the Compose files: settings pass through, signals and dead children stop everything,
nothing is left in /dev/shm, no secret of .env reaches the gateway."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from devstack.gateway import GatewayProcess
from devstack.stack import LocalStack
from devstack.tritonserver import REPO_ROOT, TritonServer, free_port, group_members
from gateway.settings import GatewaySettings
from tests.stack.tools import (
    COMPOSE_FILES,
    clean_environment,
    compose_command,
    ensure_tools,
)

PREFIX_FLAG = "--backend-config=python,shm-region-prefix-name="


def shm_files(prefix: str) -> list[str]:
    return sorted(f for f in os.listdir("/dev/shm") if f.startswith(prefix))


# --- GATEWAY_* variables reach the gateway ---


def test_environment_passes_gateway_variables_and_settings_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_API_KEYS", "from-env")
    monkeypatch.setenv("GATEWAY_LOG_LEVEL", "warning")
    monkeypatch.setenv("GATEWAY_TRITON_URL", "elsewhere:1")
    monkeypatch.setenv("GATEWAY_PORT", "1")
    env = GatewayProcess("127.0.0.1:9", port=1234, settings={"log_level": "debug"}).environment()
    assert env["GATEWAY_API_KEYS"] == "from-env"
    assert env["GATEWAY_LOG_LEVEL"] == "debug"  # explicit settings win
    assert (env["GATEWAY_TRITON_URL"], env["GATEWAY_HOST"], env["GATEWAY_PORT"]) == ("127.0.0.1:9", "127.0.0.1", "1234")


def test_environment_names_tritons_http_endpoint_unless_this_one_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_TRITON_HTTP_URL", "elsewhere:1")
    assert GatewayProcess("127.0.0.1:9", "http://127.0.0.1:8").environment()["GATEWAY_TRITON_HTTP_URL"] == "127.0.0.1:8"
    assert GatewayProcess("127.0.0.1:9").environment()["GATEWAY_TRITON_HTTP_URL"] == "none"  # not given: gRPC only
    monkeypatch.setenv("GATEWAY_TRITON_HTTP_URL", "none")  # a benchmark's gRPC-only runs
    assert GatewayProcess("127.0.0.1:9", "127.0.0.1:8").environment()["GATEWAY_TRITON_HTTP_URL"] == "none"


@pytest.mark.slow  # ~5 s of the default run for the dev harness' own stack: `scripts/test -m slow`
def test_local_stack_gateway_honours_api_keys_of_the_environment(
    fake_repository: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATEWAY_API_KEYS", "sesame")
    monkeypatch.setenv("GATEWAY_TRITON_URL", "127.0.0.1:9")  # devstack's own Triton url wins
    with LocalStack(fake_repository, log_dir=tmp_path) as stack:
        assert stack.gateway is not None
        with httpx.Client(base_url=stack.gateway.url, timeout=60) as http:
            body = {"model": "fakeemb", "inputs": ["hello"]}
            denied = http.post("/embed", json=body)
            assert denied.status_code == 401, denied.text
            assert denied.json()["error"]["type"]
            allowed = http.post("/embed", json=body, headers={"Authorization": "Bearer sesame"})
            assert allowed.status_code == 200, allowed.text  # and the gateway reached devstack's Triton
        assert stack.triton is not None  # (LocalStack's graceful stop is test_sighup's subject: kill it here)
        stack.gateway.stop()
        stack.triton.stop(kill=True)


# --- python -m devstack: ports, SIGHUP stops everything, a dead child is reported ---


def test_devstack_ports_flag_then_variable_then_default() -> None:
    from devstack.__main__ import parse_args, ports

    env = {"GATEWAY_PORT": "9080", "TRITON_GRPC_PORT": "9001", "TRITON_METRICS_PORT": ""}
    assert ports(parse_args([]), {}) == (8080, {})  # Triton: free ports
    assert ports(parse_args([]), env) == (9080, {"grpc_port": 9001})
    flags = parse_args(["--port", "7080", "--triton-grpc-port", "7001", "--triton-http-port", "7000",
                        "--triton-metrics-port", "7002"])
    assert ports(flags, env) == (7080, {"http_port": 7000, "grpc_port": 7001, "metrics_port": 7002})


@dataclass
class Devstack:
    """A `python -m devstack` process and its children as they were once it served."""

    process: subprocess.Popen[bytes]
    url: str
    log_dir: Path
    triton: psutil.Process
    gateway: psutil.Process
    descendants: list[psutil.Process]
    shm_prefix: str  # of Triton's python-backend regions

    def stderr(self) -> str:
        return (self.log_dir / "devstack.err").read_text()


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=1) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


@contextmanager
def running_devstack(repository: Path, tmp_path: Path) -> Iterator[Devstack]:
    """`python -m devstack` in a session of its own, up and answering /healthz; killed at the end,
    with whatever it started (a failing test leaves no orphans behind). Its ports come the ways a user
    sets them: the gateway's from GATEWAY_PORT, Triton's gRPC port from TRITON_GRPC_PORT, its HTTP
    port from a flag (checked on tritonserver's command line)."""
    port, grpc_port, http_port, log_dir = free_port(), free_port(), free_port(), tmp_path / "logs"
    log_dir.mkdir()
    cmd = [sys.executable, "-m", "devstack", "--repository", str(repository), "--log-dir", str(log_dir),
           "--triton-http-port", str(http_port)]
    env = {**os.environ, "GATEWAY_PORT": str(port), "TRITON_GRPC_PORT": str(grpc_port)}
    with open(log_dir / "devstack.out", "wb") as out, open(log_dir / "devstack.err", "wb") as err:
        process = subprocess.Popen(cmd, cwd=REPO_ROOT, stdout=out, stderr=err, start_new_session=True, env=env)
    started: list[psutil.Process] = []
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while not healthy(url):
            assert process.poll() is None, (log_dir / "devstack.err").read_text()
            assert time.monotonic() < deadline, "devstack not up after 120 s"
            time.sleep(0.2)
        started = descendants(process.pid)
        children = {p.name(): p for p in psutil.Process(process.pid).children()}
        assert set(children) >= {"tritonserver"} and len(children) == 2, children
        triton = children.pop("tritonserver")
        (gateway,) = children.values()
        assert {f"--grpc-port={grpc_port}", f"--http-port={http_port}"} <= set(triton.cmdline()), triton.cmdline()
        prefix = next(a.removeprefix(PREFIX_FLAG) for a in triton.cmdline() if a.startswith(PREFIX_FLAG))
        yield Devstack(process, url, log_dir, triton, gateway, started, prefix)
    finally:
        leftovers = started + descendants(process.pid)
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        for child in leftovers:
            with suppress(psutil.Error):
                child.kill()


def assert_all_gone(stack: Devstack) -> None:
    """No process devstack started is left, and nothing of Triton's in /dev/shm."""
    _, alive = psutil.wait_procs(stack.descendants, timeout=10)
    assert alive == [], f"left running: {alive}"
    assert group_members(stack.triton.pid) == [] and group_members(stack.gateway.pid) == []
    assert shm_files(stack.shm_prefix) == []


# The fake-contract repository: devstack's process handling does not depend on the models, and its two
# light python-backend models start faster than the builder's four.


@pytest.mark.slow  # ~6 s of the default run for the dev harness' own signal handling: `scripts/test -m slow`
def test_sighup_stops_triton_and_the_gateway(fake_repository: Path, tmp_path: Path) -> None:
    with running_devstack(fake_repository, tmp_path) as stack:
        assert shm_files(stack.shm_prefix)  # the python backend uses the prefix devstack gave it
        stack.process.send_signal(signal.SIGHUP)
        assert stack.process.wait(timeout=60) == 0, stack.stderr()
        assert_all_gone(stack)


@pytest.mark.slow  # ~5 s of the default run for the dev harness' own failure report: `scripts/test -m slow`
def test_dead_triton_is_reported_and_stops_the_gateway(fake_repository: Path, tmp_path: Path) -> None:
    with running_devstack(fake_repository, tmp_path) as stack:
        stack.triton.send_signal(signal.SIGKILL)  # its stubs stay behind, its regions too
        assert stack.process.wait(timeout=60) == 1
        assert_all_gone(stack)
        stderr = stack.stderr()
        assert "tritonserver was killed by SIGKILL (exit code -9)" in stderr, stderr
        assert str(stack.log_dir / "tritonserver.log") in stderr, stderr


# --- TritonServer leaves no python-backend regions in /dev/shm ---


@pytest.mark.slow  # ~7 s of the default run for the dev harness' own hygiene: `scripts/test -m slow`
def test_triton_server_unlinks_its_shm_regions(fake_repository: Path, tmp_path: Path) -> None:
    server = TritonServer(repository=fake_repository, log_path=tmp_path / "triton.log")
    other = TritonServer(repository=fake_repository)
    assert server.shm_prefix != other.shm_prefix and server.shm_prefix.startswith("triton_python_backend_shm_region_")
    for kill in (True, False):
        server.start()
        try:
            assert server.shm_files(), "no region with the server's own prefix"
            assert server.process is not None
            pgid = server.process.pid
        finally:
            server.stop(kill=kill)
        assert server.shm_files() == [], f"kill={kill}"
        assert group_members(pgid) == [], f"kill={kill}: python stubs left running"


# --- Compose: the gateway gets every gateway setting and nothing else of .env ---


def gateway_environments(env_file: Path) -> dict[str, dict[str, str]]:
    """The gateway's rendered environment in each variant of the stack."""
    ensure_tools()
    environments = {}
    for variant in COMPOSE_FILES:
        out = subprocess.run(
            compose_command(variant, "config", "--format", "json", env_file=env_file),
            check=False, capture_output=True, text=True, env=clean_environment(), cwd=REPO_ROOT,
        )
        assert out.returncode == 0, out.stderr
        services = json.loads(out.stdout)["services"]
        assert not [name for name, s in services.items() if "env_file" in s], f"{variant}: a service takes a whole env file"
        environments[variant] = services["gateway"]["environment"]
    return environments


def test_compose_gateway_gets_exactly_the_gateway_settings(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text("HF_TOKEN=secret\nGRAFANA_ADMIN_PASSWORD=pw\nGATEWAY_API_KEYS=k1,k2\nUNRELATED=x\n"
                        "OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318\n")
    # ... and the OpenTelemetry variables .env.example documents (gateway/tracing.py)
    tracing = {line.split("=", 1)[0] for line in (REPO_ROOT / ".env.example").read_text().splitlines()
               if line.startswith("OTEL_")}
    assert {"OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_SERVICE_NAME"} <= tracing
    expected = {f"GATEWAY_{name.upper()}" for name in GatewaySettings.model_fields} | tracing
    for variant, env in gateway_environments(env_file).items():
        missing, extra = sorted(expected - set(env)), sorted(set(env) - expected)
        assert not missing, f"{variant}: settings without a line in the gateway's compose environment: {missing}"
        assert not extra, f"{variant}: gateway variables that are no setting: {extra}"
        assert not {"secret", "pw", "x"} & set(env.values()), f"{variant}: a secret of .env reached the gateway"
        assert env["GATEWAY_API_KEYS"] == "k1,k2"  # .env's GATEWAY_* lines still configure it
        assert env["GATEWAY_TRITON_URL"] == "triton:8001" and env["GATEWAY_REPOSITORY"] == "/model_repository/models"
        assert env["GATEWAY_SHM"] == ("cuda" if variant == "cuda-shm" else "system") and env["GATEWAY_MAX_INPUTS"] == ""  # empty = the setting's default
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://collector:4318" and env["OTEL_TRACES_EXPORTER"] == ""
