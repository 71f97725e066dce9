"""FastAPI application factory and lifespan (start-up discovery, shm pools, clean shutdown)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from opentelemetry.trace import TracerProvider
from starlette.middleware import Middleware
from starlette.responses import HTMLResponse
from starlette.staticfiles import StaticFiles
from swagger_ui_bundle import swagger_ui_path

from gateway import tracing
from gateway.api.direct import STATE_KEY as DIRECT_ROUTES
from gateway.api.direct import DirectRoutes
from gateway.api.errors import install_error_handlers
from gateway.api.hot import HotRoute, HotRoutes, hot_routes, model_routes
from gateway.api.middleware import (
    AccessLog,
    BodyLimit,
    CancelOnDisconnect,
    InFlight,
    LastResort,
    MaxInFlight,
    RequestId,
    RequireKey,
)
from gateway.api.probes import PROBE_PATHS
from gateway.api.responses import OrjsonResponse
from gateway.api.admin import admin
from gateway.api.cohere import cohere
from gateway.api.routes import api, ops
from gateway.api.shedding import SheddingGate
from gateway.api.tei import tei
from gateway.api.tei_errors import TeiErrorShape
from gateway.api.vectors import vectors
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
    in_flight = InFlight(settings.max_in_flight)  # counted by the ASGI layer and by the direct routes alike
    hot = hot_routes([api, vectors, cohere])
    tei_hot = model_routes(tei)  # served by the direct routes only: under TeiErrorShape in the ASGI stack

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[dict[str, DirectRoutes | None]]:
        runtime = Runtime(settings)
        app.state.runtime = runtime
        app.state.services = Services.of(runtime)
        app.state.admin = ModelAdmin(runtime)
        await runtime.start()
        # the lifespan state reaches the HTTP server's protocol (gateway/http_protocol.py), which serves the hot
        # routes itself with these; while tracing, every request goes through the ASGI stack (FastAPI's spans)
        direct = (DirectRoutes(app, hot, tei_hot, in_flight, settings, in_flight_pause_s(settings))
                  if settings.direct_routes and not tracing.enabled() else None)
        try:
            yield {DIRECT_ROUTES: direct}
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
        middleware=request_layers(settings, in_flight, hot),
    )
    install_error_handlers(app)
    app.include_router(api)
    app.include_router(vectors)
    app.include_router(ops)
    app.include_router(admin)
    app.include_router(tei)  # every model as a text-embeddings-inference server at /tei/{model}
    app.include_router(cohere)  # Cohere v2: /v2/embed, /v2/rerank
    if settings.docs:
        _serve_docs(app)
    return app


def in_flight_pause_s(settings: GatewaySettings) -> float:
    """How long a 429 over GATEWAY_MAX_IN_FLIGHT waits before it is answered."""
    return min(settings.shed_pause_s, 1.0)


def request_layers(settings: GatewaySettings, in_flight: InFlight, hot: dict[str, HotRoute]) -> list[Middleware]:
    """The gateway's ASGI layers around every request, outermost first (FastAPI's ServerErrorMiddleware and
    telemetry wrap them; its exception handlers and router come after). One job each: api/middleware.py.
    api/direct.py does the same for the hot routes it serves outside this stack."""
    return [
        Middleware(TeiErrorShape),  # errors under /tei/ in TEI's shape, the refusals below included
        Middleware(RequestId, header=settings.request_id_header),  # request.state.request_id, echoed on each answer
        Middleware(AccessLog),  # metrics on the route and the access-log line of every answer below
        Middleware(LastResort),  # an escaped exception: 413 (body grew past the limit) or a logged 500
        Middleware(RequireKey, api_keys=settings.api_keys, admin_keys=settings.admin_keys),  # 401/403/404, no body read
        Middleware(BodyLimit, max_bytes=settings.max_body_bytes),  # 413 by Content-Length, or while read
        Middleware(MaxInFlight, in_flight=in_flight, pause_s=in_flight_pause_s(settings)),  # paced 429; probes pass
        Middleware(CancelOnDisconnect),  # the client left: cancel its work, log 499
        Middleware(SheddingGate, request_timeout_s=settings.request_timeout_s,
                   pause_s=settings.shed_pause_s),  # paced refusal of a shedding model, before validation
        Middleware(HotRoutes, routes=hot),  # inference routes, without FastAPI's routing
    ]


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
