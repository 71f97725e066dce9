"""FastAPI application factory and lifespan (start-up discovery, shm pools, clean shutdown)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from opentelemetry.trace import TracerProvider
from starlette.responses import HTMLResponse
from starlette.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

from gateway import tracing
from gateway.api.admin import admin
from gateway.api.asgi import EdgeLayer
from gateway.api.cohere import cohere
from gateway.api.edge import Edge
from gateway.api.errors import install_error_handlers
from gateway.api.probes import PROBE_PATHS
from gateway.api.responses import OrjsonResponse
from gateway.api.route_table import RouteTable
from gateway.api.routes import api, ops
from gateway.api.tei import tei
from gateway.api.vectors import vectors
from gateway.http_protocol import EDGE_KEY, LIMITS_KEY, ConnectionLimits
from gateway.logs import configure_logging
from gateway.metrics import mark_worker_dead
from gateway.service.admin import ModelAdmin
from gateway.service.runtime import Runtime
from gateway.service.services import Services
from gateway.settings import GatewaySettings, get_settings


def create_app(settings: GatewaySettings | None = None, *, tracer_provider: TracerProvider | None = None) -> FastAPI:
    """Build the gateway app; `settings` default to the environment's. Spans go to `tracer_provider`,
    else to what the OTEL_* variables ask for (gateway/tracing.py), else nowhere."""
    settings = settings or get_settings()
    tracer_provider = tracing.configure(tracer_provider)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, object]]:
        runtime = Runtime(settings)
        app.state.runtime = runtime
        app.state.services = Services.of(runtime)
        app.state.admin = ModelAdmin(runtime)
        await runtime.start()
        # The HTTP protocol (gateway/http_protocol.py) finds these in the lifespan state. While tracing, every
        # request takes the ASGI app: its server span is FastAPI's.
        direct = settings.direct_routes and not tracing.enabled()
        try:
            yield {EDGE_KEY: edge if direct else None, LIMITS_KEY: ConnectionLimits.of(settings)}
        finally:
            await runtime.close()
            tracing.shutdown()
            mark_worker_dead(os.getpid())

    app = FastAPI(
        title="BERT gateway",
        description="Friendly /classify and /embed JSON APIs over Triton.",
        default_response_class=OrjsonResponse,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url="/openapi.json" if settings.docs else None,
        telemetry=tracing.fastapi_telemetry(tracer_provider, untraced=PROBE_PATHS),
    )
    install_error_handlers(app)
    routers = (api, vectors, ops, admin, tei, cohere)  # tei: every model as a TEI server at /tei/{model}
    for router in routers:
        app.include_router(router)
    if settings.docs:
        _serve_docs(app)
    # every POST route is the edge's: one it cannot serve is refused here, at start
    edge = Edge(app, RouteTable([*app.routes, *(route for router in routers for route in router.routes)]), settings)
    app.state.edge = edge
    app.add_middleware(EdgeLayer, edge=edge)
    return app


def _serve_docs(app: FastAPI) -> None:
    """Swagger UI at /docs from the assets of the swagger-ui-bundle package: no CDN, works offline."""
    app.mount("/docs/assets", StaticFiles(directory=str(swagger_ui_path)), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    async def docs(request: Request) -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url="/openapi.json",
            title=f"{app.title} - docs",
            swagger_js_url="/docs/assets/swagger-ui-bundle.js",
            swagger_css_url="/docs/assets/swagger-ui.css",
            swagger_favicon_url="/docs/assets/favicon-32x32.png",
        )


def app_from_env() -> FastAPI:
    """Factory for `uvicorn --factory gateway.app:app_from_env` (used by the worker processes)."""
    settings = get_settings()
    configure_logging(settings.log_level)
    return create_app(settings)
