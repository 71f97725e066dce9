"""Launch a real `tritonserver` process (the CPU binary of the nvidia-pytriton wheel).

The wheel's binary needs three things set up (see ENVIRONMENT.md): the python backend
stub copied next to libtriton_python.so (done by scripts/fetch-tritonserver), this
interpreter's libpython first on LD_LIBRARY_PATH, and this interpreter's bin/ first on
PATH so that model.py imports come from the same environment.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_HOME = REPO_ROOT / ".cache" / "tritonserver" / "pytriton" / "tritonserver"


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def find_tritonserver_home() -> Path:
    """Locate the unpacked wheel's `pytriton/tritonserver` directory, fetching it if needed."""
    home = Path(os.environ.get("TRITONSERVER_HOME_DIR", DEFAULT_HOME))
    if (home / "bin" / "tritonserver").exists():
        return home
    out = subprocess.run(
        [str(REPO_ROOT / "scripts" / "fetch-tritonserver")],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
    )
    return Path(out.stdout.strip().splitlines()[-1])


STUB_PYTHON_ENV = "TRITON_STUB_PYTHON"


def _libdir(python: Path) -> str:
    if python == Path(sys.executable):
        return sysconfig.get_config_var("LIBDIR") or ""
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_config_var('LIBDIR') or '')"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def server_environment(home: Path, stub_python: Path | None = None) -> dict[str, str]:
    """Environment in which the wheel's tritonserver and python stub find the right libraries.

    The python-backend stub imports model.py's packages from the environment of the `python3`
    first on PATH: `stub_python` (default $TRITON_STUB_PYTHON, else this interpreter). A separate
    one keeps the stub's numpy 1 apart from an interpreter that needs numpy 2.
    """
    env = dict(os.environ)
    python = Path(stub_python or env.get(STUB_PYTHON_ENV) or sys.executable)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(
        p for p in (_libdir(python), env.get("LD_LIBRARY_PATH", "")) if p
    )
    env["PATH"] = os.pathsep.join((str(python.parent), env.get("PATH", "")))
    return env


@dataclass
class TritonServer:
    """A tritonserver child process serving `repository`; use as a context manager.

    Ports default to free ones. `model_control` is "none" (load everything) or
    "explicit" (load `load_models`). `stub_python`: see `server_environment`.
    """

    repository: Path
    http_port: int = field(default_factory=free_port)
    grpc_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    model_control: str = "none"
    load_models: tuple[str, ...] = ()
    log_path: Path | None = None
    extra_args: tuple[str, ...] = ()
    startup_timeout_s: float = 120.0
    stub_python: Path | None = None
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def command(self, home: Path) -> list[str]:
        cmd = [
            str(home / "bin" / "tritonserver"),
            f"--model-repository={self.repository}",
            f"--backend-directory={home / 'backends'}",
            f"--http-port={self.http_port}",
            f"--grpc-port={self.grpc_port}",
            f"--metrics-port={self.metrics_port}",
            "--allow-metrics=true",
            "--allow-gpu-metrics=false",
            "--exit-on-error=true",
            "--strict-readiness=true",
            f"--model-control-mode={self.model_control}",
            "--log-verbose=0",
        ]
        cmd += [f"--load-model={m}" for m in self.load_models]
        return cmd + list(self.extra_args)

    def start(self) -> "TritonServer":
        """Start the process and wait until /v2/health/ready answers 200."""
        home = find_tritonserver_home()
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.process = subprocess.Popen(
            self.command(home),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=server_environment(home, self.stub_python),
            start_new_session=True,
        )
        self.wait_ready()
        return self

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(
                    f"tritonserver exited with {self.process.returncode}; log: {self.log_path}"
                )
            if self.is_ready():
                return
            time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"tritonserver not ready after {self.startup_timeout_s}s; log: {self.log_path}")

    def is_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.http_url}/v2/health/ready", timeout=1) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def stop(self, kill: bool = False) -> None:
        """Stop the server (SIGTERM, or SIGKILL with `kill=True`) and wait for it."""
        if self.process is None or self.process.poll() is not None:
            return
        sig = signal.SIGKILL if kill else signal.SIGTERM
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            return
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)

    def __enter__(self) -> "TritonServer":
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
