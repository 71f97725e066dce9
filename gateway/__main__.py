"""`python -m gateway`: serve the gateway with uvicorn (settings from GATEWAY_* variables)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import uvicorn

from gateway.logs import configure_logging
from gateway.settings import GatewaySettings

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # must be set before prometheus_client is imported


def prepare_metrics_dir(settings: GatewaySettings) -> None:
    """With several workers, give prometheus-client an empty shared multiprocess directory."""
    if settings.workers <= 1 or os.environ.get(MULTIPROC_ENV):
        return
    path = Path(settings.metrics_dir or tempfile.mkdtemp(prefix="gateway-metrics-"))
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    os.environ[MULTIPROC_ENV] = str(path)


def main() -> None:
    settings = GatewaySettings()
    configure_logging(settings.log_level)
    prepare_metrics_dir(settings)
    uvicorn.run(
        "gateway.app:app_from_env",
        factory=True,
        host=settings.host,
        port=settings.port,
        workers=settings.workers,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=10,
        loop=settings.loop,
        http="gateway.http_protocol:NoDelayHttpToolsProtocol",
    )


if __name__ == "__main__":
    main()
