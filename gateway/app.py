"""FastAPI application factory and lifespan (start-up discovery, shm pools, clean shutdown)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from gateway.api.errors import install_error_handlers
from gateway.api.middleware import RequestContextMiddleware
from gateway.api.responses import OrjsonResponse
from gateway.api.routes import api, ops
from gateway.logs import configure_logging
from gateway.metrics import mark_worker_dead
from gateway.service.runtime import Runtime
from gateway.settings import GatewaySettings, get_settings


def create_app(settings: GatewaySettings | None = None) -> FastAPI:
    """Build the gateway app; `settings` default to the environment's."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime = Runtime(settings)
        app.state.runtime = runtime
        await runtime.start()
        try:
            yield
        finally:
            await runtime.close()
            mark_worker_dead(os.getpid())

    app = FastAPI(
        title="BERT gateway",
        description="Friendly /classify and /embed JSON APIs over Triton.",
        default_response_class=OrjsonResponse,
        lifespan=lifespan,
    )
    install_error_handlers(app)
    app.include_router(api)
    app.include_router(ops)
    app.add_middleware(
        RequestContextMiddleware,
        request_id_header=settings.request_id_header,
        max_in_flight=settings.max_in_flight,
    )
    return app


def app_from_env() -> FastAPI:
    """Factory for `uvicorn --factory gateway.app:app_from_env` (used by the worker processes)."""
    settings = get_settings()
    configure_logging(settings.log_level)
    return create_app(settings)
