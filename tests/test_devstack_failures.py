"""`python -m devstack`'s failures, each with real processes: one `error:` line naming the cause and the fix, a
non-zero exit, no traceback, and nothing started when a check before the start refuses.

Refused before anything starts (exit 2): a missing or empty repository, one this machine cannot run (built for
Triton's onnxruntime backend, or for a GPU), a port already taken (also by a server that would answer devstack's
health check), an invalid GATEWAY_* or port variable. A child that exits while starting: exit 1, with the last
error lines of its log."""

from __future__ import annotations

import http.server
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from builder.configs import read_config, write_config
from builder.machine import nvidia_gpus
from devstack.tritonserver import REPO_ROOT, TritonServer
from tests.fixtures.repository import TINY_LIMITS, build_repository

REFUSED, CHILD_FAILED = 2, 1


@dataclass
class Run:
    code: int
    stdout: str
    stderr: str

    def error(self) -> str:
        """The one `error:` line (other lines of stderr are the child log's lines, indented)."""
        own = [line for line in self.stderr.splitlines() if line.strip() and not line.startswith("  ")]
        assert len(own) == 1 and own[0].startswith("error: "), self.stderr
        assert "Traceback" not in self.stderr, self.stderr
        return own[0]


def devstack(*args: str | Path, env: dict[str, str] | None = None, timeout: float = 60) -> Run:
    """`python -m devstack ARGS` to its end (every case here ends by itself), with GATEWAY_*/TRITON_* of this
    environment left out unless `env` sets them."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "TRITON_"))}
    result = subprocess.run([sys.executable, "-m", "devstack", *map(str, args)], cwd=REPO_ROOT, capture_output=True,
                            text=True, timeout=timeout, env={**base, **(env or {})}, check=False)
    return Run(result.returncode, result.stdout, result.stderr)


def refused(run: Run) -> str:
    """The error line of a start refused before anything started (no banner, exit 2)."""
    assert run.code == REFUSED, run
    assert run.stdout == "", run.stdout
    return run.error()


def test_missing_and_empty_repository(tmp_path: Path) -> None:
    error = refused(devstack("--repository", tmp_path / "missing"))
    assert f"no model repository at {tmp_path / 'missing'}" in error
    assert "--runtime python --device cpu" in error  # the fix: how to build one
    (tmp_path / "empty").mkdir()
    error = refused(devstack("--repository", tmp_path / "empty"))
    assert "holds no model" in error and "python -m builder build" in error


@pytest.fixture(scope="module")
def native_gpu_repository(tiny_embedder_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What the builder's defaults make (runtime native, device gpu), as a newcomer's first build does."""
    repository = tmp_path_factory.mktemp("native_gpu") / "models"
    build_repository(repository, [{"model": str(tiny_embedder_dir), "task": "embed", "name": "e"}],
                     runtime="native", device="gpu", formats="onnx", **TINY_LIMITS)
    return repository


def test_repository_built_for_tritons_native_backends(native_gpu_repository: Path) -> None:
    error = refused(devstack("--repository", native_gpu_repository))
    assert "e_onnx needs Triton's onnxruntime backend" in error and "has only python" in error
    assert "rebuild with --runtime python --device cpu" in error


@pytest.mark.skipif(nvidia_gpus() > 0, reason="this machine has a GPU: a KIND_GPU model can run here")
def test_repository_built_for_a_gpu(python_repository: Path, tmp_path: Path) -> None:
    repository = tmp_path / "models"
    shutil.copytree(python_repository, repository)
    path = repository / "tinyemb_onnx" / "config.pbtxt"
    config = read_config(path)  # as the builder writes a --runtime python --device gpu step
    for group in config.instance_group:
        group.kind = mc.ModelInstanceGroup.KIND_GPU
    write_config(path.parent, config)
    error = refused(devstack("--repository", repository))
    assert "tinyemb_onnx runs on a GPU (KIND_GPU) and this machine has none" in error
    assert "rebuild with --runtime python --device cpu" in error


@pytest.fixture
def listener() -> Iterator[int]:
    """A port on 127.0.0.1 where another server answers 200 to every GET (as a stray gateway's /healthz would)."""

    class Ok(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Ok)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def test_taken_gateway_port_is_refused_before_anything_starts(fake_repository: Path, listener: int) -> None:
    """The other server would answer the health check: devstack must not take it for its gateway."""
    before = {p.pid for p in psutil.process_iter()}
    error = refused(devstack("--repository", fake_repository, env={"GATEWAY_PORT": str(listener)}))
    assert f"port {listener} (the gateway's) is not free" in error and "GATEWAY_PORT=N" in error
    flag = f"--model-repository={fake_repository}"  # a Triton of this repository, other than one already running
    started = [p for p in psutil.process_iter(["cmdline"]) if p.pid not in before and flag in (p.info["cmdline"] or [])]
    assert started == []


def test_taken_triton_port(fake_repository: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))  # any address: 127.0.0.1 is taken too
        taken.listen()
        port = taken.getsockname()[1]
        error = refused(devstack("--repository", fake_repository, env={"TRITON_HTTP_PORT": str(port)}))
    assert f"port {port} (Triton's http port) is not free" in error and "TRITON_HTTP_PORT=N" in error


@pytest.mark.parametrize(("variable", "value", "expected"), [
    ("GATEWAY_SHM", "shared", "error: GATEWAY_SHM: must be one of system, cuda, none (got 'shared')"),
    ("GATEWAY_WORKERS", "four", "error: GATEWAY_WORKERS: must be a whole number or auto (got 'four')"),
    pytest.param("GATEWAY_PORT", "http", "error: GATEWAY_PORT: must be a port number, 1 to 65535 (got 'http')",
                 marks=pytest.mark.slow),
    pytest.param("TRITON_GRPC_PORT", "99999",
                 "error: TRITON_GRPC_PORT: must be a port number, 1 to 65535 (got '99999')", marks=pytest.mark.slow),
])
def test_invalid_variable(variable: str, value: str, expected: str, fake_repository: Path) -> None:
    assert refused(devstack("--repository", fake_repository, env={variable: value})) == expected


@pytest.mark.slow  # a whole devstack start that fails: scripts/test -m slow
def test_a_child_that_exits_while_starting(fake_repository: Path, tmp_path: Path) -> None:
    """Triton cannot load a model (its model.py does not compile): its reason, from its log, under the error."""
    repository = tmp_path / "models"
    shutil.copytree(fake_repository, repository)
    (repository / "fakeemb_onnx" / "1" / "model.py").write_text("def broken(:\n")
    run = devstack("--repository", repository, "--log-dir", tmp_path / "logs", timeout=120)
    assert run.code == CHILD_FAILED, run
    assert run.error() == (f"error: tritonserver exited with code 1 while loading {repository}; log: "
                           f"{tmp_path / 'logs' / 'tritonserver.log'}; the last error lines of its log:")
    assert "fakeemb_onnx" in run.stderr and "SyntaxError" in run.stderr, run.stderr


def test_triton_listens_on_loopback_only(fake_triton: TritonServer) -> None:
    """What devstack prints (`grpc_url`, `http_url`, `metrics_url`) is where it listens, and only there."""
    assert fake_triton.process is not None
    listening = {(c.laddr.ip.removeprefix("::ffff:"), c.laddr.port)
                 for c in psutil.Process(fake_triton.process.pid).net_connections("tcp") if c.status == "LISTEN"}
    printed = {("127.0.0.1", port) for port in (fake_triton.grpc_port, fake_triton.http_port, fake_triton.metrics_port)}
    assert listening == printed
    assert fake_triton.grpc_url == f"127.0.0.1:{fake_triton.grpc_port}"
    assert fake_triton.http_url == f"http://127.0.0.1:{fake_triton.http_port}"
