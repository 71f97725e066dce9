"""The hot routes (api/hot.py) served straight from the HTTP server's protocol (gateway/http_protocol.py): no ASGI
cycle, no ASGI layers. What those layers do for such a request is done here in their order, by the same functions
(api/middleware.py, api/shedding.py, api/hot.py):

request id -> (once answered) the access log and request metrics -> last resort (a logged 500) -> key check ->
body limit (the protocol hands over only a body whose Content-Length is within the limit) -> in-flight bound ->
shedding gate -> the hot route (JSON check, parse, validation, handler) -> (under /tei/) TEI's error shape, as
TeiErrorShape gives it (api/tei_errors.py). A client that leaves before its answer has its request cancelled by the
protocol and logged 499, as CancelOnDisconnect does.

The routes are the fixed-path ones of `hot_routes` and the POST routes of /tei/{model} (`model_routes` of api/tei.py's
router; a target naming its model plainly: FastAPI's router matches the percent-decoded path).

Why: on the H100 host the ASGI cycle and the layers above the hot route cost a quarter of a worker's CPU per
single-text request, and serving single texts from the protocol served 1.26-1.32x the texts/s at 256 clients
(loadtest/results/h100-20aa-bare-front). Off with GATEWAY_DIRECT_ROUTES=false, and while tracing is on (the server
span of a request is FastAPI's): every request then goes through the ASGI stack. Either way the answers are the same.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from typing import Any, NamedTuple

from starlette.responses import Response

from gateway.api.errors import gateway_error_response
from gateway.api.hot import HotRoute, bind, respond
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
from gateway.api.tei_errors import TEI_PREFIX, tei_error
from gateway.service.registry import Task
from gateway.settings import GatewaySettings

STATE_KEY = "direct_routes"  # where the app's lifespan state hands the protocol its DirectRoutes (None: off)

Headers = list[tuple[bytes, bytes]]
Write = Callable[[int, Headers, bytes], None]  # (status, headers, body): the protocol writes the answer
# /tei/NAME or /tei/NAME/SUFFIX (/embed, /v1/embeddings): no '%' (the router matches the decoded path), query or
# fragment
_TEI_TARGET = re.compile(rb"/tei/([^/%?#]+)(/[^%?#]*)?")


class Target(NamedTuple):
    """A request the protocol hands over: its hot route, its path and its inference route (api/shedding.py)."""

    entry: HotRoute
    path: str
    shed: tuple[str, Task | None, str | None] | None


class DirectRoutes:
    """The hot routes of one worker's app, for its HTTP protocol: `routes` at fixed paths, `tei` (path after
    /tei/{model} -> route) under each model's TEI base URL."""

    def __init__(self, app: Any, routes: dict[str, HotRoute], tei: dict[str, HotRoute], in_flight: InFlight,
                 settings: GatewaySettings, in_flight_pause_s: float) -> None:
        self.app = app  # the FastAPI app: handlers reach its state (services) through their Request
        self.routes = {path.encode(): Target(entry, path, inference_route(path)) for path, entry in routes.items()}
        self.tei = {suffix.encode(): entry for suffix, entry in tei.items()}
        self.in_flight = in_flight
        self.in_flight_pause_s = in_flight_pause_s
        self.api_keys, self.admin_keys = settings.api_keys, settings.admin_keys
        self.max_body_bytes = settings.max_body_bytes
        self.request_timeout_s, self.shed_pause_s = settings.request_timeout_s, settings.shed_pause_s
        self.id_lookup = settings.request_id_header.lower().encode()
        self.id_name = settings.request_id_header.encode()

    def route(self, target: bytes, headers: Headers) -> Target | None:
        """The hot route of a POST to `target` (the raw request target) whose body can be read whole before it is
        served: one declared Content-Length within GATEWAY_MAX_BODY_BYTES, no Transfer-Encoding. None: the ASGI
        stack serves it (an unknown path, a query string, a body of unknown or too large a size)."""
        found = self.routes.get(target) or self._tei_route(target)
        if found is None:
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
        return found

    def _tei_route(self, target: bytes) -> Target | None:
        """A POST route of /tei/{model} (`tei`), its handler given the model the target names."""
        match = _TEI_TARGET.fullmatch(target) if target.isascii() else None
        entry = self.tei.get(match[2] or b"") if match else None
        if match is None or entry is None:
            return None
        path = target.decode("ascii")
        return Target(bind(entry, match[1].decode("ascii")), path, inference_route(path))

    async def serve(self, target: Target, headers: Headers, body: bytes, write: Write,
                    gone: Callable[[], bool]) -> None:
        """Answer one request through `write`, then count and log it. `gone()`: whether the client left (the
        protocol then cancels this call, and the request is logged 499 with no answer)."""
        start = time.perf_counter()
        state: dict[str, object] = {}
        scope = {"type": "http", "method": "POST", "path": target.path, "headers": headers, "app": self.app,
                 "state": state, "route": target.entry[0]}
        rid = state["request_id"] = request_id(scope, self.id_lookup)
        try:
            response = await self._respond(target, scope, body)
        except asyncio.CancelledError:
            if not gone():
                raise  # the server is shutting down: neither counted nor logged, as in the ASGI stack
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            record(scope, state, CLIENT_CLOSED_REQUEST, time.perf_counter() - start)
            return
        except Exception:  # noqa: BLE001 - LastResort's answer
            response = unhandled_error(rid)
        status, answer = response.status_code, [*response.raw_headers, (self.id_name, rid.encode("ascii"))]
        if status >= 400 and target.path.startswith(TEI_PREFIX):
            write(*tei_error(status, answer, bytes(response.body), target.path))
        else:
            write(status, answer, bytes(response.body))
        # the gateway's own status, as AccessLog (inside TeiErrorShape) records it
        record(scope, state, status, time.perf_counter() - start)

    async def _respond(self, target: Target, scope: dict[str, Any], body: bytes) -> Response:
        denied = key_error(scope, self.api_keys, self.admin_keys)
        if denied is not None:
            return gateway_error_response(denied)
        if self.in_flight.full:
            return await too_many_in_flight(self.in_flight_pause_s)
        with self.in_flight:
            if target.shed is not None and (runtime := self.app.state.runtime).inference.shedding():
                refusal = await shedding_refusal(runtime, target.shed, body, scope["state"], self.request_timeout_s,
                                                 self.shed_pause_s)
                if refusal is not None:
                    return gateway_error_response(refusal)
            return await respond(target.entry, scope, body)
