"""Pure-ASGI middleware: request id, API key (401), body size limit (413), in-flight limit (429),
cancelling the work of a client that disconnected, the last-resort 500 (with the request id),
per-request metrics and one log line."""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
import uuid

from starlette.exceptions import HTTPException
from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.api.auth import check_admin_key, check_api_key, is_admin, is_public
from gateway.api.errors import error_response, gateway_error_response
from gateway.api.shedding import inference_route
from gateway.errors import ErrorType, GatewayError
from gateway.metrics import IN_FLIGHT, INPUTS_PER_REQUEST, REQUEST_LATENCY, REQUESTS

log = logging.getLogger("gateway.access")
_UNTRACKED = {"/metrics", "/healthz", "/readyz"}
_SAFE_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:\-]{1,128}")


class BodyTooLarge(HTTPException):
    """The body grew past the limit while it was read (no or a false Content-Length). An HTTPException,
    because FastAPI turns any other failure while it reads the body into a 400."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body over the limit of {limit} bytes")


def request_id(scope: Scope, header: bytes) -> str:
    """The caller's request id when it is short and plain (it is echoed and logged), else a new one."""
    value = next((v for k, v in scope["headers"] if k == header), b"")
    return value.decode("ascii") if _SAFE_REQUEST_ID.fullmatch(value) else uuid.uuid4().hex


def header(scope: Scope, name: bytes) -> str:
    return next((v.decode("latin-1") for k, v in scope["headers"] if k == name), "")


def declared_length(scope: Scope) -> int | None:
    value = header(scope, b"content-length")
    return int(value) if value.isdigit() else None


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


class RequestContextMiddleware:
    """Wraps every HTTP request; handlers put `model`/`inputs` into `request.state`."""

    def __init__(
        self, app: ASGIApp, *, request_id_header: str, max_in_flight: int, max_body_bytes: int, api_keys: list[str],
        refusal_pause_s: float = 0.0,
        admin_keys: list[str] | None = None,
    ) -> None:
        self.app = app
        self.api_keys = api_keys
        self.admin_keys = admin_keys or []
        self.header = request_id_header.lower().encode()
        self.header_name = request_id_header.encode()
        self.max_in_flight = max_in_flight
        self.refusal_pause_s = refusal_pause_s  # a 429 is answered after this pause (GATEWAY_SHED_PAUSE_S)
        self.max_body_bytes = max_body_bytes
        self.in_flight = 0

    def _denied(self, scope: Scope) -> GatewayError | None:
        """The 401/403/404 of a request without the key its path needs (API key, admin key, none)."""
        path, authorization = scope["path"], header(scope, b"authorization")
        if is_admin(path):
            return check_admin_key(authorization, self.admin_keys)
        return None if is_public(path) else check_api_key(authorization, self.api_keys)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = request_id(scope, self.header)
        scope.setdefault("state", {})["request_id"] = rid  # request.state.request_id for the routes
        rid_header = (self.header_name, rid.encode("ascii"))
        status = 500
        started = finished = disconnected = False
        received = 0
        watcher: asyncio.Task[None] | None = None
        handler = asyncio.current_task()

        async def send_with_id(message: Message) -> None:
            nonlocal status, started, finished
            if message["type"] == "http.response.start":
                status, started = message["status"], True
                message["headers"] = [*message.get("headers", ()), rid_header]
            elif not message.get("more_body", False):
                finished = True  # before sending: the server reports the completed response as a disconnect
            await send(message)

        async def reply(type_: ErrorType, message: str, retry_after_s: float | None = None) -> None:
            await error_response(type_, message, retry_after_s)(scope, receive, send_with_id)


        async def watch_disconnect() -> None:
            nonlocal disconnected
            message = await receive()
            if message["type"] == "http.disconnect" and not finished and handler is not None:
                disconnected = True
                handler.cancel()  # the client left: stop its queued rows and Triton calls

        async def limited_receive() -> Message:
            nonlocal received, watcher
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise BodyTooLarge(self.max_body_bytes)
                if not message.get("more_body", False):  # whole body read: from now on only a disconnect comes
                    watcher = asyncio.get_running_loop().create_task(watch_disconnect())
            return message

        start = time.perf_counter()
        too_large = f"request body over the limit of {self.max_body_bytes} bytes"
        length = declared_length(scope)
        denied = self._denied(scope)
        if denied is not None:
            await gateway_error_response(denied)(scope, receive, send_with_id)
        elif length is not None and length > self.max_body_bytes:
            await reply(ErrorType.BODY_TOO_LARGE, too_large)
        elif self.in_flight >= self.max_in_flight and scope["path"] not in _UNTRACKED:
            if self.refusal_pause_s > 0:  # paced, like a shedding model's refusals (api/shedding.py)
                await asyncio.sleep(self.refusal_pause_s)
            await reply(ErrorType.RATE_LIMITED, "too many requests in flight", retry_after_s=1)
        else:
            self.in_flight += 1
            IN_FLIGHT.inc()
            try:
                await self.app(scope, limited_receive, send_with_id)
            except BodyTooLarge:
                if not started:
                    await reply(ErrorType.BODY_TOO_LARGE, too_large)
            except asyncio.CancelledError:
                if not disconnected:
                    raise
                asyncio.current_task().uncancel()  # type: ignore[union-attr]
                status = 499  # nginx's "client closed request": nobody to answer
            except Exception:
                log.exception("unhandled error", extra={"request_id": rid})
                if not started:
                    await reply(ErrorType.INTERNAL_ERROR, "internal error")
            finally:
                finished = True
                if watcher is not None:
                    watcher.cancel()
                self.in_flight -= 1
                IN_FLIGHT.dec()
        self._record(scope, rid, status, time.perf_counter() - start)

    @staticmethod
    def _record(scope: Scope, rid: str, status: int, elapsed: float) -> None:
        route = scope.get("route")
        # an inference route refused before routing (a missing key, a shedding model) is still counted as that route
        known = inference_route(scope["path"])
        path = getattr(route, "path", None) or (known[0] if known else _known_route(scope))
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
