"""The edge's ASGI transport: the app's one layer, between FastAPI's error handling and its router.

Every request an ASGI server hands the app (every request of a test's httpx client; under uvicorn, those the HTTP
protocol does not serve itself, gateway/http_protocol.py) is answered by `Edge.serve` (api/edge.py). A request for
no route of the edge's table goes on to FastAPI's router with its body replayed, and its answer comes back through
the edge (the access log, the request id, TEI's error shape).
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway import tracing
from gateway.api.edge import Answer, BodyTooLarge, ClientGone, Edge, HeadFacts, Headers
from gateway.api.route_table import EdgeRoute


class AsgiRequest(HeadFacts):
    """One ASGI request, as the edge reads it. Once its body is read, a watcher waits for the client to leave before
    the answer is complete, and then cancels the request's task (`gone`)."""

    def __init__(self, scope: Scope, receive: Receive, router: ASGIApp) -> None:
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.headers: Headers = scope["headers"]
        self.state: dict[str, Any] = scope.setdefault("state", {})
        self.gone = False
        self.answered = False
        self._scope, self._receive, self._router = scope, receive, router
        self._task = asyncio.current_task()
        self._watcher: asyncio.Task[None] | None = None

    def body_now(self, limit: int) -> bytes | None:
        return None  # an ASGI body comes by `receive` only

    async def read_body(self, limit: int) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await self._receive()
            if message["type"] != "http.request":
                self.gone = True
                raise ClientGone
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise BodyTooLarge
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        self._watcher = asyncio.get_running_loop().create_task(self._watch())
        return b"".join(chunks)

    async def _watch(self) -> None:
        message = await self._receive()  # from now on only a disconnect comes
        if message["type"] == "http.disconnect" and not self.answered and self._task is not None:
            self.gone = True
            self._task.cancel()

    def stop_watching(self) -> None:
        if self._watcher is not None:
            self._watcher.cancel()

    def scope(self, app: FastAPI, route: EdgeRoute | None) -> Scope:
        if route is not None:
            self._scope["route"] = route.route
        return self._scope

    async def fallback(self, body: bytes) -> Answer:
        replayed = False

        async def receive() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await self._receive()

        start: Message = {}
        chunks: list[bytes] = []

        async def send(message: Message) -> None:
            if message["type"] == "http.response.start":
                start.update(message)
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self._router(self._scope, receive, send)
        return Answer(start["status"], list(start.get("headers", ())), b"".join(chunks))


class EdgeLayer:
    """The ASGI layer that hands every HTTP request to the edge (FastAPI's router, `app`, behind it)."""

    def __init__(self, app: ASGIApp, *, edge: Edge) -> None:
        self.app = app
        self.edge = edge

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = AsgiRequest(scope, receive, self.app)
        route = self.edge.routes.match(request.method, request.path)
        if route is not None and tracing.enabled():
            tracing.route_selected(request.method, route.path)

        async def write(answer: Answer) -> None:
            request.answered = True  # before sending: a server reports the completed answer as a disconnect
            headers = [*answer.headers, (b"connection", b"close")] if answer.close else answer.headers
            await send({"type": "http.response.start", "status": answer.status, "headers": headers})
            await send({"type": "http.response.body", "body": answer.body})

        try:
            await self.edge.serve(request, route, write)
        finally:
            request.stop_watching()
