"""Launch the gateway (`python -m gateway`) as a child process, configured by GATEWAY_* variables."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from devstack.tritonserver import REPO_ROOT, free_port


@dataclass
class GatewayProcess:
    """`python -m gateway` talking to `triton_url`; `settings` are extra GATEWAY_* values (no prefix)."""

    triton_url: str
    port: int = field(default_factory=free_port)
    settings: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    startup_timeout_s: float = 60.0
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        env.update({"GATEWAY_TRITON_URL": self.triton_url, "GATEWAY_HOST": "127.0.0.1", "GATEWAY_PORT": str(self.port)})
        env.update({f"GATEWAY_{k.upper()}": str(v) for k, v in self.settings.items()})
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        return env

    def start(self) -> "GatewayProcess":
        """Start the process and wait until /healthz answers."""
        log = open(self.log_path, "ab") if self.log_path else subprocess.DEVNULL
        self.process = subprocess.Popen(
            [sys.executable, "-m", "gateway"],
            cwd=REPO_ROOT,
            env=self.environment(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.process.returncode}; log: {self.log_path}")
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=1) as resp:
                    if resp.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"gateway not up after {self.startup_timeout_s}s; log: {self.log_path}")

    def stop(self) -> int | None:
        """Graceful stop (SIGTERM to the uvicorn parent, which stops its workers); returns the exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        return self.process.returncode

    def __enter__(self) -> "GatewayProcess":
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
