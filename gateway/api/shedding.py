"""Cheap refusals while a model sheds load (an ASGI layer in front of the routes).

When no model is shedding this layer only looks at the path. While one is (its last admission
check refused a request, service/admission.py), a POST to an inference route has its body read
(api/middleware.py's BodyLimit still bounds it) and only the `model` and `backend` fields
picked out, and the model's admission check runs before FastAPI validates the body or anything
is tokenized: a storm of retries that ignore Retry-After costs the gateway a JSON peek per
request, not the work of the requests the model is serving. What is admitted here goes on with
its body replayed, and is checked again by the service.

A refusal here is answered after a pause (`GATEWAY_SHED_PAUSE_S`, at most the time the work ahead
needs; Retry-After then says what is left of it): a client that retries the moment it is refused
sends at most one request per pause, however fast it is, so a retry storm cannot take the CPU
the admitted work needs. The pause costs a timer, not a thread.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, get_args

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.api.errors import gateway_error_response
from gateway.errors import GatewayError
from gateway.service.registry import Backend, Task

if TYPE_CHECKING:
    from gateway.service.runtime import Runtime

# The inference routes, by the task whose model they run (the body's `model` names it).
TASK_OF_PATH: dict[str, Task] = {
    "/embed": "embed",
    "/v1/embeddings": "embed",
    "/classify": "classify",
    "/rerank": "rerank",
    "/v1/rerank": "rerank",
    "/v2/embed": "embed",
    "/v2/rerank": "rerank",
}
# TEI's routes per model (/tei/{model}/...; api/tei.py): the path names the model. None: the model's own task.
TEI_PREFIX = "/tei/"
TEI_TASKS: dict[str, Task | None] = {"": None, "/embed": "embed", "/predict": "classify", "/rerank": "rerank"}


def inference_route(path: str) -> tuple[str, Task | None, str | None] | None:
    """(route template, task, model named by the path) of an inference route; None for any other path."""
    if path in TASK_OF_PATH:
        return path, TASK_OF_PATH[path], None
    if path.startswith(TEI_PREFIX):
        model, _, rest = path[len(TEI_PREFIX):].partition("/")
        suffix = f"/{rest}" if rest else ""
        if model and suffix in TEI_TASKS:
            return f"{TEI_PREFIX}{{model}}{suffix}", TEI_TASKS[suffix], model
    return None


_BACKENDS: dict[str, Backend] = {name: name for name in get_args(Backend)}  # the API's backends, by name


def _fields(body: bytes) -> tuple[str | None, Backend | None] | None:
    """(model, backend) of a JSON object body; None when it is not one (the route will say why)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(data, dict):
        return None
    model, backend = data.get("model"), data.get("backend")
    return (model if isinstance(model, str) else None, _BACKENDS.get(backend) if isinstance(backend, str) else None)


class SheddingGate:
    """Refuses a request for a shedding model before its body is validated or tokenized."""

    def __init__(self, app: ASGIApp, request_timeout_s: float, pause_s: float) -> None:
        self.app = app
        self.request_timeout_s = request_timeout_s
        self.pause_s = pause_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        route = inference_route(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        runtime: Runtime | None = getattr(scope["app"].state, "runtime", None) if route else None
        if route is None or runtime is None or not runtime.inference.shedding():
            await self.app(scope, receive, send)
            return
        body, rest = await _read_body(receive)
        refusal = await shedding_refusal(runtime, route, body, scope.setdefault("state", {}), self.request_timeout_s,
                                         self.pause_s)
        if refusal is not None:
            await gateway_error_response(refusal)(scope, receive, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay if rest is None else rest, send)


async def shedding_refusal(runtime: Runtime, route: tuple[str, Task | None, str | None], body: bytes,
                           state: dict[str, object], request_timeout_s: float, pause_s: float) -> GatewayError | None:
    """The refusal of a request for a shedding model (`route`: `inference_route`'s), answered after the pause
    (its model noted in the request's `state`); None when the request goes on (the service checks it again)."""
    _, task, path_model = route
    fields = _fields(body)
    if fields is None:
        return None
    model = path_model or fields[0]
    try:
        runtime.check_admission(model, task, fields[1], time.monotonic() + request_timeout_s)
    except GatewayError as exc:
        state["model"] = model or ""
        pause = min(pause_s, exc.retry_after_s or 0.0)
        if pause > 0:
            await asyncio.sleep(pause)
            exc.retry_after_s = (exc.retry_after_s or 0.0) - pause
        return exc
    return None


async def _read_body(receive: Receive) -> tuple[bytes, Receive | None]:
    """The whole body; when the client left while it was sent, a receive that reports that instead."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            async def gone() -> Message:
                return message
            return b"", gone
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), None
