"""The gateway's edge: the steps every HTTP request takes, in order, written once (`Edge.serve`).

    1. request id   the caller's X-Request-ID when short and plain, else a new one; echoed on every answer; the
                    request's deadline (X-Request-Timeout) and lane (X-Priority) are read from its arrival
    2. access log   the answer, whoever gave it, counted and timed on its route, and one log line
    3. last resort  an exception that escapes is a logged 500 carrying the request id
    4. key          401/403/404 before anything of the body is read (api/auth.py)
    5. body limit   413 by Content-Length before the body is read, or once it grows past the limit
    6. in flight    a paced 429 over GATEWAY_MAX_IN_FLIGHT (probes always pass)
    7. body         read whole within GATEWAY_BODY_TIMEOUT_S, else 408
    8. shedding     for a model that sheds load, before the body is validated or tokenized: the request held
                    until there is room for it, or a paced 503
    9. route        the route's JSON check, parse and validation, then its handler (api/route_table.py);
                    a request for no route of the table goes to FastAPI's router (docs, probes, admin, 404s)
   10. response     under /tei/, errors in TEI's shape (api/tei_errors.py)

A client that leaves before its answer has its request cancelled (its queued rows and Triton calls stop) and
logged 499. Two transports hand requests to `serve`: the HTTP protocol itself for the routes of the table
(gateway/http_protocol.py: no ASGI cycle per request), and an ASGI layer for everything else (api/asgi.py).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, get_args

import orjson
from fastapi import FastAPI
from starlette.types import Scope
from fastapi.exceptions import RequestValidationError

from gateway.api.auth import check_admin_key, check_api_key, is_admin, is_public
from gateway.api.errors import error_response, gateway_error_response, validation_error_response
from gateway.api.probes import PROBE_PATHS
from gateway.api.route_table import EdgeRoute, RouteTable
from gateway.api.tei_errors import TEI_PREFIX, tei_error
from gateway.errors import ErrorType, GatewayError
from gateway.metrics import IN_FLIGHT, INPUTS_PER_REQUEST, REQUEST_LATENCY, REQUESTS
from gateway.service.admission import LANES, Lane, Urgency
from gateway.service.registry import Backend
from gateway.settings import GatewaySettings

if TYPE_CHECKING:
    from starlette.responses import Response

log = logging.getLogger("gateway.access")
Headers = list[tuple[bytes, bytes]]  # lower-case names, in order
CLIENT_CLOSED_REQUEST = 499  # nginx's "client closed request": the status logged when the client left
_SAFE_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:\-]{1,128}")
_BACKENDS: dict[str, Backend] = {name: name for name in get_args(Backend)}
TIMEOUT_HEADER = b"x-request-timeout"  # seconds the client will wait for its answer
PRIORITY_HEADER = b"x-priority"  # interactive (the default) or batch
_LANES: dict[bytes, Lane] = {lane.encode(): lane for lane in LANES}
_URGENCIES = {(lane, own): Urgency(lane, own) for lane in LANES for own in (False, True)}


class Answer(NamedTuple):
    """What the transport writes: status, headers, body; `close`: end the connection after it."""

    status: int
    headers: Headers
    body: bytes
    close: bool = False


Write = Callable[[Answer], Awaitable[None]]  # the transport writes an answer


class BodyTooLarge(Exception):
    """The body grew past the limit while it was read."""


class ClientGone(Exception):
    """The client left while its body was read."""


class Incoming(Protocol):
    """One request as a transport hands it to the edge."""

    method: str
    path: str  # percent-decoded, without the query
    headers: Headers
    state: dict[str, Any]  # the request's state (`request.state`): its id, model and input count
    gone: bool  # the client left: set by the transport, which then cancels the request's task

    @property
    def expects_body(self) -> bool:
        """Whether a body follows the head (a Content-Length over 0, or chunked)."""

    def declared_length(self) -> int | None:
        """The Content-Length, when one plain number."""

    def body_now(self, limit: int) -> bytes | None:
        """The whole body when it has arrived (BodyTooLarge past `limit`), else None."""

    async def read_body(self, limit: int) -> bytes:
        """The whole body, once it has arrived (BodyTooLarge past `limit`; ClientGone when the client left)."""

    def scope(self, app: FastAPI, route: EdgeRoute | None) -> Scope:
        """The ASGI scope handlers see (their `Request`)."""

    async def fallback(self, body: bytes) -> Answer:
        """The answer of FastAPI's router to a request for no route of the table."""


def header(headers: Headers, name: bytes) -> bytes:
    return next((v for k, v in headers if k == name), b"")


class HeadFacts:
    """What a request's head says of its body (both transports' requests are these)."""

    __slots__ = ()
    headers: Headers

    @property
    def expects_body(self) -> bool:
        return self.declared_length() not in (None, 0) or bool(header(self.headers, b"transfer-encoding"))

    def declared_length(self) -> int | None:
        value = header(self.headers, b"content-length")
        return int(value) if value.isdigit() else None


class _RequestIds:
    """New request ids: 32 hex digits, a random prefix per process then a counter. Unique like uuid4's, at
    a fraction of its cost (uuid4 reads 16 random bytes from the kernel per request)."""

    def __init__(self) -> None:
        self.renew()
        os.register_at_fork(after_in_child=self.renew)

    def renew(self) -> None:
        self.prefix = os.urandom(8).hex()
        self.counter = itertools.count()

    def new(self) -> str:
        return f"{self.prefix}{next(self.counter) & 0xFFFF_FFFF_FFFF_FFFF:016x}"


_request_ids = _RequestIds()


def request_id(headers: Headers, name: bytes) -> str:
    """The caller's request id when it is short and plain (it is echoed and logged), else a new one."""
    value = header(headers, name)
    return value.decode("ascii") if _SAFE_REQUEST_ID.fullmatch(value) else _request_ids.new()


class InFlight:
    """The requests one worker serves at once (the gauge `IN_FLIGHT`) and their bound (GATEWAY_MAX_IN_FLIGHT).
    `with in_flight:` counts a request."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0

    @property
    def full(self) -> bool:
        return self.count >= self.limit

    def __enter__(self) -> None:
        self.count += 1
        IN_FLIGHT.inc()

    def __exit__(self, *_: object) -> None:
        self.count -= 1
        IN_FLIGHT.dec()


def _answer(response: Response, close: bool = False) -> Answer:
    return Answer(response.status_code, response.raw_headers, bytes(response.body), close)


def _error(exc: GatewayError, close: bool = False) -> Answer:
    return _answer(gateway_error_response(exc), close)


def unhandled_error(request_id: str | None) -> Answer:
    """Log an exception that escaped a request's handling, with the request id; its 500."""
    log.exception("unhandled error", extra={"request_id": request_id})
    return _answer(error_response(ErrorType.INTERNAL_ERROR, "internal error"))


def _shedding_fields(body: bytes) -> tuple[str | None, Backend | None] | None:
    """(model, backend) of a JSON object body; None when it is not one (the route's parse will say why)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict):
        return None
    model, backend = data.get("model"), data.get("backend")
    return (model if isinstance(model, str) else None, _BACKENDS.get(backend) if isinstance(backend, str) else None)


class Edge:
    """One worker's edge: `serve` answers a request by the steps above."""

    def __init__(self, app: FastAPI, routes: RouteTable, settings: GatewaySettings) -> None:
        self.app = app  # handlers reach the worker's services through it (`request.app.state`)
        self.routes = routes
        self.in_flight = InFlight(settings.max_in_flight)
        self.api_keys, self.admin_keys = settings.api_keys, settings.admin_keys
        self.max_body_bytes = settings.max_body_bytes
        self.body_timeout_s = settings.body_timeout_s
        self.request_timeout_s = settings.request_timeout_s
        self.max_request_timeout_s = settings.max_request_timeout_s
        self.shed_pause_s = settings.shed_pause_s
        self.in_flight_pause_s = min(settings.shed_pause_s, 1.0)
        self.id_lookup = settings.request_id_header.lower().encode()
        self.id_name = settings.request_id_header.encode()

    async def serve(self, request: Incoming, route: EdgeRoute | None, write: Write) -> None:
        """Answer `request` through `write` (`route`: its route of the table, None for FastAPI's router), then count
        and log it. A request whose client left gets no answer and is logged 499; one cancelled otherwise (the
        server shutting down) is neither answered nor logged."""
        start = time.perf_counter()
        request.state["arrival"] = time.monotonic()
        rid = request.state["request_id"] = request_id(request.headers, self.id_lookup)
        try:
            answer = await self._answer(request, route)
        except asyncio.CancelledError:
            if not request.gone:
                raise
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            self.record(request, route, CLIENT_CLOSED_REQUEST, start)
            return
        except ClientGone:
            self.record(request, route, CLIENT_CLOSED_REQUEST, start)
            return
        except Exception:  # noqa: BLE001 - the last resort
            answer = unhandled_error(rid)
        status, body = answer.status, answer.body
        headers = [*answer.headers, (self.id_name, rid.encode("ascii"))]
        if status >= 400 and request.path.startswith(TEI_PREFIX):
            status, headers, body = tei_error(status, headers, body, request.path)
        await write(Answer(status, headers, body, answer.close))
        self.record(request, route, answer.status, start)  # the gateway's own status, under /tei/ too

    async def _answer(self, request: Incoming, route: EdgeRoute | None) -> Answer:
        """The steps from the key to the handler. A request refused before its body is read has its connection
        closed after the answer: nothing more of it is read."""
        path = request.path
        unread = request.expects_body
        denied = self._key_refusal(request)
        if denied is not None:
            return _error(denied, close=unread)
        try:
            self._terms(request)
        except GatewayError as exc:
            return _error(exc, close=unread)
        declared = request.declared_length()
        if declared is not None and declared > self.max_body_bytes:
            return _answer(self._too_large(), close=unread)
        if self.in_flight.full and path not in PROBE_PATHS:
            if self.in_flight_pause_s > 0:
                await asyncio.sleep(self.in_flight_pause_s)
            too_many = error_response(ErrorType.RATE_LIMITED, "too many requests in flight", retry_after_s=1)
            return _answer(too_many, close=unread)
        with self.in_flight:
            try:
                body = await self._body(request)
            except BodyTooLarge:
                return _answer(self._too_large(), close=True)
            except GatewayError as exc:
                return _error(exc, close=True)
            if route is None:
                return await request.fallback(body)
            if route.task is not None and self.app.state.runtime.inference.shedding():
                refusal = await self._shedding_refusal(request, route, body)
                if refusal is not None:
                    return _error(refusal)
            try:
                return _answer(await route.respond(request.scope(self.app, route), body,
                                                   header(request.headers, b"content-type")))
            except GatewayError as exc:
                return _error(exc)
            except RequestValidationError as exc:  # a handler that validates a body of its own
                return _answer(validation_error_response(exc.errors()))

    def _key_refusal(self, request: Incoming) -> GatewayError | None:
        """The 401/403/404 of a request without the key its path needs (api/auth.py), from its headers alone."""
        path = request.path
        if is_admin(path):
            return check_admin_key(header(request.headers, b"authorization").decode("latin-1"), self.admin_keys)
        if not self.api_keys or is_public(path):
            return None
        return check_api_key(header(request.headers, b"authorization").decode("latin-1"), self.api_keys)

    def _terms(self, request: Incoming) -> None:
        """The request's deadline (time.monotonic(): X-Request-Timeout from now, at most GATEWAY_MAX_REQUEST_TIMEOUT_S,
        else GATEWAY_REQUEST_TIMEOUT_S) and urgency (X-Priority's lane) into its state, for the services."""
        state, headers = request.state, request.headers
        timeout, own = self.request_timeout_s, False
        if given := header(headers, TIMEOUT_HEADER):
            try:
                timeout, own = min(float(given), self.max_request_timeout_s), True
            except ValueError:
                timeout = 0.0
            if not timeout > 0:  # also NaN
                raise GatewayError(ErrorType.INVALID_REQUEST, "X-Request-Timeout: must be a number of seconds over 0 "
                                   f"(got {given.decode('latin-1')[:40]!r})")
        lane: Lane = "interactive"
        if given := header(headers, PRIORITY_HEADER):
            found = _LANES.get(given.strip().lower())
            if found is None:
                raise GatewayError(ErrorType.INVALID_REQUEST, "X-Priority: must be one of "
                                   f"{', '.join(LANES)} (got {given.decode('latin-1')[:40]!r})")
            lane = found
        state["deadline"] = state["arrival"] + timeout
        state["urgency"] = _URGENCIES[lane, own]

    def _too_large(self) -> Response:
        return error_response(ErrorType.BODY_TOO_LARGE, f"request body over the limit of {self.max_body_bytes} bytes")

    async def _body(self, request: Incoming) -> bytes:
        body = request.body_now(self.max_body_bytes)
        if body is not None:
            return body
        try:
            async with asyncio.timeout(self.body_timeout_s):
                return await request.read_body(self.max_body_bytes)
        except TimeoutError:
            raise GatewayError(ErrorType.REQUEST_TIMEOUT, "the request body was not received within "
                               f"{self.body_timeout_s:g}s") from None

    async def _shedding_refusal(self, request: Incoming, route: EdgeRoute, body: bytes) -> GatewayError | None:
        """The refusal of a request for a model that sheds load, answered once the request has been held for the
        pause (GATEWAY_SHED_PAUSE_S) without room for it: a client that retries at once
        sends one request per pause, so a retry storm cannot take the CPU the admitted work needs, and work that
        leaves meanwhile admits held requests. None when the request goes on (the service checks it again)."""
        fields = _shedding_fields(body)
        if fields is None:
            return None
        model = route.path_model(request.path) or fields[0]
        try:
            await self.app.state.runtime.await_admission(model, route.task or None, fields[1],
                                                         request.state["deadline"], request.state["urgency"],
                                                         hold_s=self.shed_pause_s)
        except GatewayError as exc:
            request.state["model"] = model or ""
            return exc
        return None

    def record(self, request: Incoming, route: EdgeRoute | None, status: int, start: float) -> None:
        """Count and time one answered request on its route template, and log it."""
        elapsed = time.perf_counter() - start
        state = request.state
        path = route.path if route is not None else self.routes.template(request.path)
        model = str(state.get("model", ""))
        if path not in PROBE_PATHS:
            REQUESTS.labels(path, model, str(status)).inc()
            REQUEST_LATENCY.labels(path, model).observe(elapsed)
            if isinstance(inputs := state.get("inputs"), int):
                INPUTS_PER_REQUEST.labels(path).observe(inputs)
        log.info("request", extra={"request_id": state.get("request_id"), "method": request.method,
                                   "path": request.path, "route": path, "model": model, "status": status,
                                   "duration_ms": round(elapsed * 1000, 3)})

