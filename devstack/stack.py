"""The local stack without Docker: CPU tritonserver on a repository plus the gateway in front."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

from devstack.checks import check_repository
from devstack.failures import ExitedChild
from devstack.gateway import GatewayProcess
from devstack.tritonserver import TritonServer, find_tritonserver_home, free_port, installed_backends


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
        """Check the repository and the gateway's settings (CheckFailed: nothing started), then start Triton and
        the gateway (ChildFailed: one of them exited or did not get ready; both are stopped)."""
        logs = self.log_dir
        ports = self.triton_ports
        triton = TritonServer(
            repository=self.repository, log_path=logs / "tritonserver.log" if logs else None,
            http_port=ports.get("http_port") or free_port(), grpc_port=ports.get("grpc_port") or free_port(),
            metrics_port=ports.get("metrics_port") or free_port(),
        )
        gateway = GatewayProcess(
            triton_url=triton.grpc_url, triton_http_url=triton.http_address, port=self.gateway_port,
            # the gateway reads tokenizer.json from the same repository (scheduler pipeline)
            settings={"repository": str(self.repository), **self.gateway_settings},
            log_path=logs / "gateway.log" if logs else None,
        )
        gateway.check_settings()
        check_repository(self.repository, installed_backends(find_tritonserver_home()))
        if logs:
            logs.mkdir(parents=True, exist_ok=True)
        self.triton = triton.start()
        try:
            self.gateway = gateway.start()
        except BaseException:
            self.triton.stop()
            raise
        return self

    def exited(self) -> ExitedChild | None:
        """The first child process (tritonserver, then the gateway) that is no longer running."""
        children = (("tritonserver", self.triton), ("gateway", self.gateway))
        for name, child in children:
            if child and child.process and (code := child.process.poll()) is not None:
                return ExitedChild(name, code, child.log_path, child.log_start)
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
