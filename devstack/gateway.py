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
from typing import Any, Self

from pydantic import ValidationError

from devstack.failures import CheckFailed, ChildFailed, ExitedChild, log_size
from devstack.tritonserver import LOOPBACK, REPO_ROOT, free_port, kill_group
from gateway.settings import GatewaySettings
from gateway.settings_errors import describe


@dataclass
class GatewayProcess:
    """`python -m gateway` talking to `triton_url` (gRPC) and `triton_http_url` (HTTP, host:port or a URL; None:
    `none`, every call over gRPC); `settings` are extra GATEWAY_* values (no prefix).

    GATEWAY_TRITON_HTTP_URL=none in this environment wins over `triton_http_url`: any benchmark's gateways then
    call Triton over gRPC only (the A/B of the two endpoints).

    GATEWAY_* variables of this environment pass through; `settings` override them.
    """

    triton_url: str
    triton_http_url: str | None = None
    port: int = field(default_factory=free_port)
    settings: dict[str, str] = field(default_factory=dict)
    log_path: Path | None = None
    startup_timeout_s: float = 60.0
    code_root: Path = REPO_ROOT  # another checkout (e.g. a git worktree of an older revision) to run instead
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)
    _cleaned_up: bool = field(default=False, init=False, repr=False)  # of this `process`
    log_start: int = field(default=0, init=False)  # where this run starts in `log_path`

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def own_settings(self) -> dict[str, str]:
        """The settings this process sets over the environment's: Triton's url and the listen address, then
        `settings` (each overrides the ones before)."""
        own = {"triton_url": self.triton_url, "host": LOOPBACK, "port": str(self.port),
               "triton_http_url": (self.triton_http_url or "none").removeprefix("http://")}
        if os.environ.get("GATEWAY_TRITON_HTTP_URL") == "none":
            own["triton_http_url"] = "none"
        return {**own, **{k: str(v) for k, v in self.settings.items()}}

    def environment(self) -> dict[str, str]:
        """This environment (GATEWAY_* included), then `own_settings` as GATEWAY_* variables."""
        env = dict(os.environ)
        env.pop("PROMETHEUS_MULTIPROC_DIR", None)
        env.update({f"GATEWAY_{k.upper()}": v for k, v in self.own_settings().items()})
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.code_root), env.get("PYTHONPATH", "")) if p)
        return env

    def check_settings(self) -> None:
        """The settings the gateway will read are valid; else CheckFailed naming each invalid GATEWAY_* variable."""
        own: dict[str, Any] = dict(self.own_settings())  # strings, as in the environment
        try:
            GatewaySettings(**own)
        except ValidationError as exc:
            raise CheckFailed(describe(exc, GatewaySettings)) from None

    def start(self) -> Self:
        """Start the process and wait until /healthz answers."""
        self.log_start = log_size(self.log_path)
        with open(self.log_path or os.devnull, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "gateway"],
                cwd=self.code_root,
                env=self.environment(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: uvicorn and its workers
            )
        self._cleaned_up = False
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if (code := self.process.poll()) is not None:
                self.stop()
                exited = ExitedChild("gateway", code, self.log_path, self.log_start)
                raise ChildFailed(f"the gateway {exited.how} while starting; log: {self.log_path}", self.log_path,
                                  self.log_start)
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=1) as resp:
                    if resp.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                time.sleep(0.05)
        self.stop()
        raise ChildFailed(f"the gateway did not answer /healthz within {self.startup_timeout_s:g} s; "
                          f"log: {self.log_path}", self.log_path, self.log_start)

    def stop(self) -> int | None:
        """Graceful stop (SIGTERM to the uvicorn parent, which stops its workers); returns the exit code.

        Workers left behind (the parent was SIGKILLed) are killed with the rest of its process group.
        """
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                kill_group(self.process.pid)
                self.process.wait(timeout=10)
        if not self._cleaned_up:
            kill_group(self.process.pid)
            self._cleaned_up = True  # once: the group's id may be reused from here on
        return self.process.returncode

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
