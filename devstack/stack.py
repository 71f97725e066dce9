"""The local stack without Docker: CPU tritonserver on a repository plus the gateway in front."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

from devstack.gateway import GatewayProcess
from devstack.tritonserver import TritonServer, free_port


@dataclass(frozen=True)
class ExitedChild:
    """A child process of the stack that exited: which one, its exit code, its log file."""

    name: str
    code: int
    log_path: Path | None

    def __str__(self) -> str:
        how = f"exited with code {self.code}"
        if self.code < 0:
            how = f"was killed by {signal.Signals(-self.code).name} (exit code {self.code})"
        return f"{self.name} {how}; log: {self.log_path or 'none'}"


@dataclass
class LocalStack:
    """Start Triton on `repository` (a `--runtime python` build), then the gateway against it.

    `triton_ports`: TritonServer's `http_port`, `grpc_port`, `metrics_port` (free ports where absent)."""

    repository: Path
    gateway_port: int = field(default_factory=free_port)
    gateway_settings: dict[str, str] = field(default_factory=dict)
    log_dir: Path | None = None
    triton_ports: dict[str, int] = field(default_factory=dict)
    triton: TritonServer | None = field(default=None, init=False)
    gateway: GatewayProcess | None = field(default=None, init=False)

    def start(self) -> Self:
        logs = self.log_dir
        if logs:
            logs.mkdir(parents=True, exist_ok=True)
        ports = self.triton_ports
        self.triton = TritonServer(
            repository=self.repository, log_path=logs / "tritonserver.log" if logs else None,
            http_port=ports.get("http_port") or free_port(), grpc_port=ports.get("grpc_port") or free_port(),
            metrics_port=ports.get("metrics_port") or free_port(),
        ).start()
        try:
            self.gateway = GatewayProcess(
                triton_url=self.triton.grpc_url, triton_http_url=self.triton.http_address,
                port=self.gateway_port,
                # the gateway reads tokenizer.json from the same repository (scheduler pipeline)
                settings={"repository": str(self.repository), **self.gateway_settings},
                log_path=logs / "gateway.log" if logs else None,
            ).start()
        except BaseException:
            self.triton.stop()
            raise
        return self

    def exited(self) -> ExitedChild | None:
        """The first child process (tritonserver, then the gateway) that is no longer running."""
        children = (("tritonserver", self.triton), ("gateway", self.gateway))
        for name, child in children:
            if child and child.process and (code := child.process.poll()) is not None:
                return ExitedChild(name, code, child.log_path)
        return None

    def stop(self) -> None:
        """Gateway first (it unregisters its shm regions from Triton), then Triton."""
        if self.gateway:
            self.gateway.stop()
        if self.triton:
            self.triton.stop()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
