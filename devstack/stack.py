"""The local stack without Docker: CPU tritonserver on a repository plus the gateway in front."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from devstack.gateway import GatewayProcess
from devstack.tritonserver import TritonServer, free_port


@dataclass
class LocalStack:
    """Start Triton on `repository` (a `--runtime python` build), then the gateway against it."""

    repository: Path
    gateway_port: int = field(default_factory=free_port)
    gateway_settings: dict[str, str] = field(default_factory=dict)
    log_dir: Path | None = None
    triton: TritonServer | None = field(default=None, init=False)
    gateway: GatewayProcess | None = field(default=None, init=False)

    def start(self) -> "LocalStack":
        logs = self.log_dir
        if logs:
            logs.mkdir(parents=True, exist_ok=True)
        self.triton = TritonServer(
            repository=self.repository, log_path=logs / "tritonserver.log" if logs else None
        ).start()
        try:
            self.gateway = GatewayProcess(
                triton_url=self.triton.grpc_url,
                port=self.gateway_port,
                # the gateway reads tokenizer.json from the same repository (scheduler pipeline)
                settings={"repository": str(self.repository), **self.gateway_settings},
                log_path=logs / "gateway.log" if logs else None,
            ).start()
        except BaseException:
            self.triton.stop()
            raise
        return self

    def stop(self) -> None:
        """Gateway first (it unregisters its shm regions from Triton), then Triton."""
        if self.gateway:
            self.gateway.stop()
        if self.triton:
            self.triton.stop()

    def __enter__(self) -> "LocalStack":
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
