"""Pure-ASGI middleware: request id, in-flight limit (429), per-request metrics and one log line."""

from __future__ import annotations

import logging
import time
import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.api.errors import TooManyRequests, error_response
from gateway.metrics import IN_FLIGHT, INPUTS_PER_REQUEST, REQUEST_LATENCY, REQUESTS

log = logging.getLogger("gateway.access")
_UNTRACKED = {"/metrics", "/healthz", "/readyz"}


class RequestContextMiddleware:
    """Wraps every HTTP request; handlers put `model`/`inputs` into `request.state`."""

    def __init__(self, app: ASGIApp, *, request_id_header: str, max_in_flight: int) -> None:
        self.app = app
        self.header = request_id_header.lower().encode()
        self.header_name = request_id_header.encode()
        self.max_in_flight = max_in_flight
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = next((v.decode("latin-1") for k, v in scope["headers"] if k == self.header), "") or uuid.uuid4().hex
        rid_header = (self.header_name, rid.encode("latin-1"))
        status = 500

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), rid_header]
            await send(message)

        start = time.perf_counter()
        if self.in_flight >= self.max_in_flight and scope["path"] not in _UNTRACKED:
            rejection = error_response(TooManyRequests.status, TooManyRequests.type, "too many requests in flight")
            await rejection(scope, receive, send_with_id)
            self._record(scope, rid, status, time.perf_counter() - start)
            return
        self.in_flight += 1
        IN_FLIGHT.inc()
        try:
            await self.app(scope, receive, send_with_id)
        finally:
            self.in_flight -= 1
            IN_FLIGHT.dec()
            self._record(scope, rid, status, time.perf_counter() - start)

    @staticmethod
    def _record(scope: Scope, rid: str, status: int, elapsed: float) -> None:
        route = scope.get("route")
        path = getattr(route, "path", None) or "unmatched"
        state = scope.get("state") or {}
        model = str(state.get("model", ""))
        if path not in _UNTRACKED:
            REQUESTS.labels(path, model, str(status)).inc()
            REQUEST_LATENCY.labels(path, model).observe(elapsed)
            if "inputs" in state:
                INPUTS_PER_REQUEST.labels(path).observe(state["inputs"])
        log.info(
            "request",
            extra={
                "request_id": rid,
                "method": scope["method"],
                "path": scope["path"],
                "route": path,
                "model": model,
                "status": status,
                "duration_ms": round(elapsed * 1000, 3),
            },
        )
