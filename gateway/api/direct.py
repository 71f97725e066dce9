"""The hot routes (api/hot.py) served straight from the HTTP server's protocol (gateway/http_protocol.py): no ASGI
cycle, no ASGI layers. What those layers do for such a request is done here in their order, by the same functions
(api/middleware.py, api/shedding.py, api/hot.py):

request id -> (once answered) the access log and request metrics -> last resort (a logged 500) -> key check ->
body limit (the protocol hands over only a body whose Content-Length is within the limit) -> in-flight bound ->
shedding gate -> the hot route (JSON check, parse, validation, handler). A client that leaves before its answer has
its request cancelled by the protocol and logged 499, as CancelOnDisconnect does.

Why: on the H100 host the ASGI cycle and the layers above the hot route cost a quarter of a worker's CPU per
single-text request, and serving single texts from the protocol served 1.26-1.32x the texts/s at 256 clients
(loadtest/results/h100-20aa-bare-front). Off with GATEWAY_DIRECT_ROUTES=false, and while tracing is on (the server
span of a request is FastAPI's): every request then goes through the ASGI stack. Either way the answers are the same.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from starlette.responses import Response

from gateway.api.errors import gateway_error_response
from gateway.api.hot import HotRoute, respond
from gateway.api.middleware import (
    CLIENT_CLOSED_REQUEST,
    InFlight,
    key_error,
    record,
    request_id,
    too_many_in_flight,
    unhandled_error,
)
from gateway.api.shedding import inference_route, shedding_refusal
from gateway.settings import GatewaySettings

STATE_KEY = "direct_routes"  # where the app's lifespan state hands the protocol its DirectRoutes (None: off)

Headers = list[tuple[bytes, bytes]]
Write = Callable[[int, Headers, bytes], None]  # (status, headers, body): the protocol writes the answer


class DirectRoutes:
    """The hot routes of one worker's app, for its HTTP protocol."""

    def __init__(self, app: Any, routes: dict[str, HotRoute], in_flight: InFlight, settings: GatewaySettings,
                 in_flight_pause_s: float) -> None:
        self.app = app  # the FastAPI app: handlers reach its state (services) through their Request
        self.routes = {path.encode(): entry for path, entry in routes.items()}
        self.shed_routes = {path: inference_route(path) for path in routes}
        self.in_flight = in_flight
        self.in_flight_pause_s = in_flight_pause_s
        self.api_keys, self.admin_keys = settings.api_keys, settings.admin_keys
        self.max_body_bytes = settings.max_body_bytes
        self.request_timeout_s, self.shed_pause_s = settings.request_timeout_s, settings.shed_pause_s
        self.id_lookup = settings.request_id_header.lower().encode()
        self.id_name = settings.request_id_header.encode()

    def route(self, target: bytes, headers: Headers) -> HotRoute | None:
        """The hot route of a POST to `target` (the raw request target) whose body can be read whole before it is
        served: one declared Content-Length within GATEWAY_MAX_BODY_BYTES, no Transfer-Encoding. None: the ASGI
        stack serves it (an unknown path, a query string, a body of unknown or too large a size)."""
        entry = self.routes.get(target)
        if entry is None:
            return None
        length = None
        for name, value in headers:
            if name == b"content-length":
                if length is not None:
                    return None
                length = value
            elif name == b"transfer-encoding":
                return None
        if length is None or not length.isdigit() or int(length) > self.max_body_bytes:
            return None
        return entry

    async def serve(self, entry: HotRoute, headers: Headers, body: bytes, write: Write, gone: Callable[[], bool]) -> None:
        """Answer one request through `write`, then count and log it. `gone()`: whether the client left (the
        protocol then cancels this call, and the request is logged 499 with no answer)."""
        start = time.perf_counter()
        route = entry[0]
        state: dict[str, object] = {}
        scope = {"type": "http", "method": "POST", "path": route.path, "headers": headers, "app": self.app,
                 "state": state, "route": route}
        rid = state["request_id"] = request_id(scope, self.id_lookup)
        try:
            response = await self._respond(entry, scope, body)
        except asyncio.CancelledError:
            if not gone():
                raise  # the server is shutting down: neither counted nor logged, as in the ASGI stack
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            record(scope, state, CLIENT_CLOSED_REQUEST, time.perf_counter() - start)
            return
        except Exception:  # noqa: BLE001 - LastResort's answer
            response = unhandled_error(rid)
        write(response.status_code, [*response.raw_headers, (self.id_name, rid.encode("ascii"))], bytes(response.body))
        record(scope, state, response.status_code, time.perf_counter() - start)

    async def _respond(self, entry: HotRoute, scope: dict[str, Any], body: bytes) -> Response:
        denied = key_error(scope, self.api_keys, self.admin_keys)
        if denied is not None:
            return gateway_error_response(denied)
        if self.in_flight.full:
            return await too_many_in_flight(self.in_flight_pause_s)
        with self.in_flight:
            shed = self.shed_routes[scope["path"]]
            if shed is not None and (runtime := self.app.state.runtime).inference.shedding():
                refusal = await shedding_refusal(runtime, shed, body, scope["state"], self.request_timeout_s,
                                                 self.shed_pause_s)
                if refusal is not None:
                    return gateway_error_response(refusal)
            return await respond(entry, scope, body)
