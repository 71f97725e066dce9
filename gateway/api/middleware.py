"""The gateway's own pure-ASGI layers around every HTTP request, one job each.

The app factory (gateway/app.py) stacks them in this order, outermost first:

1. `RequestId`: the request's id (the caller's when plain, else a new one) in `request.state.request_id`
   and on every response.
2. `AccessLog`: counts and times the request on its route and writes its access-log line, after the
   answer, whoever gave it (the refusals of the layers below included).
3. `LastResort`: what escaped the layers below: the 413 of a body that grew past the limit while it
   was read, any other exception a logged 500 (with the request id). Nothing once an answer started.
4. `RequireKey`: the 401/403/404 of a request without the key its path needs, before its body is read.
5. `BodyLimit`: the 413 of a body over the limit, by its Content-Length or while it is read.
6. `MaxInFlight`: the paced 429 of a request over the in-flight bound (probes are never refused).
7. `CancelOnDisconnect`: a client that leaves after sending its body gets its work cancelled (499).

Then api/shedding.py's `SheddingGate`, api/hot.py's `HotRoutes` and FastAPI's own stack. Each layer
costs one call per request (`Layer`), and one small wrapper of `send` or `receive` where it must see the
messages. The hot routes served from the HTTP protocol (api/direct.py) skip this stack and call the functions
the layers are made of (`request_id`, `record`, `unhandled_error`, `key_error`, `InFlight`, `too_many_in_flight`).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import os
import re
import time
from collections.abc import Awaitable

from starlette.exceptions import HTTPException
from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.api.auth import check_admin_key, check_api_key, is_admin, is_public
from gateway.api.errors import error_response, gateway_error_response
from gateway.api.probes import PROBE_PATHS
from gateway.api.responses import OrjsonResponse
from gateway.api.shedding import inference_route
from gateway.errors import ErrorType, GatewayError
from gateway.metrics import IN_FLIGHT, INPUTS_PER_REQUEST, REQUEST_LATENCY, REQUESTS

log = logging.getLogger("gateway.access")
_SAFE_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:\-]{1,128}")
CLIENT_CLOSED_REQUEST = 499  # nginx's "client closed request": logged for a request whose client left


class Layer:
    """An ASGI layer of HTTP requests: `http` serves one; lifespan events pass on to `app` untouched.
    (`__call__` returns the coroutine it picks: no coroutine of its own per request.)"""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        return (self.http if scope["type"] == "http" else self.app)(scope, receive, send)

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        raise NotImplementedError


def header(scope: Scope, name: bytes) -> str:
    return next((v.decode("latin-1") for k, v in scope["headers"] if k == name), "")


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


def request_id(scope: Scope, header: bytes) -> str:
    """The caller's request id when it is short and plain (it is echoed and logged), else a new one."""
    value = next((v for k, v in scope["headers"] if k == header), b"")
    return value.decode("ascii") if _SAFE_REQUEST_ID.fullmatch(value) else _request_ids.new()


class RequestId(Layer):
    """Puts the request id into `request.state.request_id` and on every response as the `header` header."""

    def __init__(self, app: ASGIApp, *, header: str) -> None:
        super().__init__(app)
        self.lookup = header.lower().encode()
        self.name = header.encode()

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        rid = request_id(scope, self.lookup)
        scope.setdefault("state", {})["request_id"] = rid
        rid_header = (self.name, rid.encode("ascii"))

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", ()), rid_header]
            await send(message)

        await self.app(scope, receive, send_with_id)


class AccessLog(Layer):
    """Counts and times each request on its route (probes excepted), and writes one access-log line.

    The status is the answer's; a layer below that answers nothing puts the status to log into
    `request.state.status` (CancelOnDisconnect: 499). A request that raises (a server shutting down
    cancels it) is neither counted nor logged."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        status = 500  # until an answer starts

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        start = time.perf_counter()
        await self.app(scope, receive, send_status)
        elapsed = time.perf_counter() - start
        state = scope.get("state") or {}
        record(scope, state, state.get("status", status), elapsed)


@functools.lru_cache(maxsize=8)
def _templates(paths: tuple[str, ...]) -> tuple[tuple[re.Pattern[str], str], ...]:
    return tuple((compile_path(path)[0], path) for path in paths)


def _known_route(scope: Scope) -> str:
    """The template of the app's API route (its OpenAPI paths) that `scope`'s path names, for a request
    refused before routing (a missing key); "unmatched" for any other path."""
    openapi = getattr(scope.get("app"), "openapi", None)
    for regex, template in _templates(tuple(openapi()["paths"])) if openapi else ():
        if regex.match(scope["path"]):
            return template
    return "unmatched"


def record(scope: Scope, state: dict[str, object], status: int, elapsed: float) -> None:
    """Count and time one answered request on its route template, and log it."""
    route = scope.get("route")
    # an inference route refused before routing (a missing key, a shedding model) is still counted as that route
    known = inference_route(scope["path"])
    path = getattr(route, "path", None) or (known[0] if known else _known_route(scope))
    model = str(state.get("model", ""))
    if path not in PROBE_PATHS:
        REQUESTS.labels(path, model, str(status)).inc()
        REQUEST_LATENCY.labels(path, model).observe(elapsed)
        if isinstance(inputs := state.get("inputs"), int):
            INPUTS_PER_REQUEST.labels(path).observe(inputs)
    log.info(
        "request",
        extra={
            "request_id": state.get("request_id"),
            "method": scope["method"],
            "path": scope["path"],
            "route": path,
            "model": model,
            "status": status,
            "duration_ms": round(elapsed * 1000, 3),
        },
    )


class BodyTooLarge(HTTPException):
    """The body grew past the limit while it was read (no or a false Content-Length). An HTTPException,
    because FastAPI turns any other failure while it reads the body into a 400."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body over the limit of {limit} bytes")


class LastResort(Layer):
    """Answers what escaped the layers below in the one error shape, unless an answer has started:
    a `BodyTooLarge` (raised where the body is read) with its 413, any other exception with a 500,
    logged with the request id. Nothing of it reaches the client."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def send_started(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, send_started)
        except BodyTooLarge as exc:
            if not started:
                await error_response(ErrorType.BODY_TOO_LARGE, exc.detail)(scope, receive, send)
        except Exception:
            response = unhandled_error(scope.get("state", {}).get("request_id"))
            if not started:
                await response(scope, receive, send)


def unhandled_error(request_id: str | None) -> OrjsonResponse:
    """Log an exception that escaped a request's handling, with the request id; its 500."""
    log.exception("unhandled error", extra={"request_id": request_id})
    return error_response(ErrorType.INTERNAL_ERROR, "internal error")


def key_error(scope: Scope, api_keys: list[str], admin_keys: list[str]) -> GatewayError | None:
    """The 401/403/404 of a request without the key its path needs (API key, admin key, none: api/auth.py);
    None when it may pass."""
    path = scope["path"]
    if is_admin(path):
        return check_admin_key(header(scope, b"authorization"), admin_keys)
    return None if is_public(path) else check_api_key(header(scope, b"authorization"), api_keys)


class RequireKey(Layer):
    """Refuses a request without the key its path needs before its body is read (`key_error`)."""

    def __init__(self, app: ASGIApp, *, api_keys: list[str], admin_keys: list[str]) -> None:
        super().__init__(app)
        self.api_keys = api_keys
        self.admin_keys = admin_keys

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        denied = key_error(scope, self.api_keys, self.admin_keys)
        if denied is None:
            await self.app(scope, receive, send)
        else:
            await gateway_error_response(denied)(scope, receive, send)


def declared_length(scope: Scope) -> int | None:
    value = header(scope, b"content-length")
    return int(value) if value.isdigit() else None


class BodyLimit(Layer):
    """Refuses a body over `max_bytes`: by its Content-Length at once, else by raising `BodyTooLarge`
    from `receive` once the bytes read pass the limit (LastResort, or FastAPI, answers it)."""

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        super().__init__(app)
        self.max_bytes = max_bytes

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        length = declared_length(scope)
        if length is not None and length > self.max_bytes:
            too_large = f"request body over the limit of {self.max_bytes} bytes"
            await error_response(ErrorType.BODY_TOO_LARGE, too_large)(scope, receive, send)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        await self.app(scope, limited_receive, send)


class InFlight:
    """The requests one worker serves at once (the gauge `IN_FLIGHT`) and their bound (GATEWAY_MAX_IN_FLIGHT):
    `MaxInFlight` and the direct routes (api/direct.py) count in the same one. `with in_flight:` counts a request."""

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


async def too_many_in_flight(pause_s: float) -> OrjsonResponse:
    """The 429 of a request over the in-flight bound, after `pause_s` (GATEWAY_SHED_PAUSE_S, paced like a shedding
    model's refusals in api/shedding.py: a client that retries at once sends one request per pause)."""
    if pause_s > 0:
        await asyncio.sleep(pause_s)
    return error_response(ErrorType.RATE_LIMITED, "too many requests in flight", retry_after_s=1)


class MaxInFlight(Layer):
    """Bounds the requests this worker serves at once (`InFlight`); over the bound a request is answered
    `too_many_in_flight`. Probes are counted but never refused."""

    def __init__(self, app: ASGIApp, *, in_flight: InFlight, pause_s: float) -> None:
        super().__init__(app)
        self.in_flight = in_flight
        self.pause_s = pause_s

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.in_flight.full and scope["path"] not in PROBE_PATHS:
            refusal = await too_many_in_flight(self.pause_s)
            await refusal(scope, receive, send)
            return
        with self.in_flight:
            await self.app(scope, receive, send)


class CancelOnDisconnect(Layer):
    """Once the body is read, watches for the client leaving before its answer is complete, and then
    cancels the request's task: its queued rows and Triton calls stop. The request ends normally, with
    `request.state.status` 499 for the access log (nobody to answer)."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler = asyncio.current_task()
        finished = disconnected = False
        watcher: asyncio.Task[None] | None = None

        async def send_finished(message: Message) -> None:
            nonlocal finished
            if message["type"] != "http.response.start" and not message.get("more_body", False):
                finished = True  # before sending: the server reports the completed response as a disconnect
            await send(message)

        async def watch() -> None:
            nonlocal disconnected
            message = await receive()
            if message["type"] == "http.disconnect" and not finished and handler is not None:
                disconnected = True
                handler.cancel()

        async def receive_then_watch() -> Message:
            nonlocal watcher
            message = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                watcher = asyncio.get_running_loop().create_task(watch())  # from now on only a disconnect comes
            return message

        try:
            await self.app(scope, receive_then_watch, send_finished)
        except asyncio.CancelledError:
            if not disconnected:
                raise
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            scope.setdefault("state", {})["status"] = CLIENT_CLOSED_REQUEST
        finally:
            finished = True
            if watcher is not None:
                watcher.cancel()
