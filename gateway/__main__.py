"""`python -m gateway`: serve the gateway with uvicorn (settings from GATEWAY_* variables)."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

import uvicorn
from pydantic import ValidationError

from gateway.logs import configure_logging
from gateway.settings import GatewaySettings
from gateway.settings_errors import describe
from gateway.triton.shm_pool import ShmUnavailable, probe_cuda

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # must be set before prometheus_client is imported


def tokenizer_environment(settings: GatewaySettings) -> dict[str, str]:
    """The variables that size the Rust tokenizer's pool in every worker (GATEWAY_TOKENIZER_THREADS), read when a
    worker first tokenizes: 1 thread turns the pool off, n keeps n. They replace any already set (a process
    that imported the builder has TOKENIZERS_PARALLELISM=true), so that the one setting decides."""
    threads = settings.tokenizer_thread_count
    if threads == 1:
        return {"TOKENIZERS_PARALLELISM": "false"}
    return {"TOKENIZERS_PARALLELISM": "true", "RAYON_NUM_THREADS": str(threads)}


def prepare_metrics_dir(settings: GatewaySettings) -> Path | None:
    """With several workers, give prometheus-client an empty shared multiprocess directory.

    Returns the temporary directory made for it (none when GATEWAY_METRICS_DIR names one), which
    `main` removes once uvicorn has stopped its workers."""
    if settings.worker_count <= 1 or os.environ.get(MULTIPROC_ENV):
        return None
    made = None if settings.metrics_dir else Path(tempfile.mkdtemp(prefix="gateway-metrics-"))
    path = made or Path(settings.metrics_dir)
    if path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    os.environ[MULTIPROC_ENV] = str(path)
    return made


def check_transport(settings: GatewaySettings) -> None:
    """GATEWAY_SHM=cuda in a process that cannot use the GPU: one clear line and exit 2, before any worker
    starts (a silent fallback to system memory would hide a mis-deployment)."""
    if settings.shm != "cuda":
        return
    try:
        probe_cuda(settings.shm_cuda_device)
    except ShmUnavailable as exc:
        logging.getLogger("gateway").error(
            "GATEWAY_SHM=cuda, but %s. Give the gateway the GPU Triton runs on (compose.cuda-shm.yaml), or set "
            "GATEWAY_SHM=system.", exc)
        sys.exit(2)


def load_settings() -> GatewaySettings:
    """The settings, or one `error:` line naming each invalid GATEWAY_* variable and exit 2."""
    try:
        return GatewaySettings()
    except ValidationError as exc:
        print(f"error: {describe(exc, GatewaySettings)}", file=sys.stderr, flush=True)
        sys.exit(2)


def main() -> None:
    settings = load_settings()
    configure_logging(settings.log_level)
    check_transport(settings)
    os.environ.pop("RAYON_NUM_THREADS", None)
    os.environ.update(tokenizer_environment(settings))  # before any worker starts or tokenizes
    metrics_dir = prepare_metrics_dir(settings)
    try:
        uvicorn.run(
            "gateway.app:app_from_env",
            factory=True,
            host=settings.host,
            port=settings.port,
            workers=settings.worker_count,
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=10,
            loop=settings.loop,
            http="gateway.http_protocol:GatewayHttpProtocol",
        )
    finally:  # uvicorn returns once its workers have stopped (SIGTERM, SIGINT)
        if metrics_dir is not None:
            shutil.rmtree(metrics_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
