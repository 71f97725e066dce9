"""Inference over Triton's HTTP/REST endpoint, for calls whose tensors all live in shared memory.

Such a call's message is a few hundred bytes of JSON each way: region names, offsets, shapes. Over keep-alive
HTTP/1.1 connections read by the event loop itself it costs the worker much less CPU and latency than a
`tritonclient.grpc.aio` call, because grpc.aio hands every answer from its poller thread to the loop. Everything else (health, repository, shm
registration, tensors that travel in the message) stays on gRPC.

One request at a time per connection; idle connections are kept for the next call. Failures come back as
`InferenceServerException`s carrying the gRPC status that Triton's gRPC endpoint gives for the same error, so
the client translates both transports in one place:
- Triton's HTTP status (http_server.cc's HttpCodeFromError) -> its gRPC code;
- no answer within the call's time -> DEADLINE_EXCEEDED (the connection is closed: an answer may still come);
- no connection, or a new connection whose peer closes it or answers with something that is not HTTP/1.x (the
  address is not Triton's HTTP endpoint: its gRPC port, say) -> HttpUnreachable (the call was not served there;
  the client sends it over gRPC); a connection lost mid-answer -> UNAVAILABLE; a kept connection that the server
  had closed is retried once on a new one, as HTTP clients do for idle keep-alive connections.
Unlike gRPC, closing a connection does not cancel the request in Triton: a call abandoned past its deadline
is still computed (the python-backend models' skip of cancelled requests applies to gRPC only).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httptools
import orjson
from tritonclient.utils import InferenceServerException

# Triton's HTTP status -> the gRPC status its gRPC endpoint gives for the same TRITONSERVER_Error code
_GRPC_STATUS = {400: "INVALID_ARGUMENT", 404: "NOT_FOUND", 500: "INTERNAL", 501: "UNIMPLEMENTED",
                503: "UNAVAILABLE"}
MAX_IDLE = 64  # connections kept open per endpoint and worker: one per call in flight is the most it needs
Answer = tuple[int, bytes]


def _error(status: str, message: str) -> InferenceServerException:
    return InferenceServerException(message, status=f"StatusCode.{status}")


class HttpUnreachable(InferenceServerException):
    """No connection to the HTTP endpoint could be made (the call was not sent): the caller may use gRPC."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status="StatusCode.UNAVAILABLE")


class _NotHttp(ConnectionError):
    """The peer answered with bytes that are not an HTTP/1.x answer."""


class _Protocol(asyncio.Protocol):
    """One connection: one request at a time, its answer as (HTTP status, body)."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[Answer] | None = None
        self.chunks: list[bytes] = []
        self.received = False  # any byte of the current request's answer
        self.keep_alive = True

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(_NotHttp(f"its answer is not HTTP/1.x ({exc})"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._fail(ConnectionError("the connection was closed"))

    def on_message_begin(self) -> None:
        self.chunks = []

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        self.keep_alive = self.parser.should_keep_alive()
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result((self.parser.get_status_code(), b"".join(self.chunks)))

    def send(self, request: bytes) -> asyncio.Future[Answer]:
        assert self.transport is not None and self.waiter is None
        self.received = False
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self.waiter

    @property
    def open(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None

    def _fail(self, exc: Exception) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)


class TritonHttpInfer:
    """POST /v2/models/{model}/infer to Triton's HTTP endpoint `url` (host:port)."""

    def __init__(self, url: str) -> None:
        host, _, port = url.rpartition(":")
        self.url, self.host, self.port = url, host.strip("[]") or "localhost", int(port)
        self._idle: list[_Protocol] = []
        self._head = f"Host: {url}\r\nContent-Type: application/json\r\n"

    async def infer(self, model: str, request: dict[str, Any], timeout_s: float,
                    headers: dict[str, str] | None = None) -> dict[str, Any]:
        """Triton's JSON answer to `request` (the KServe v2 inference request), within `timeout_s`."""
        body = orjson.dumps(request)
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items()) if headers else ""
        message = (f"POST /v2/models/{model}/infer HTTP/1.1\r\n{self._head}{extra}"
                   f"Content-Length: {len(body)}\r\n\r\n").encode() + body
        try:
            async with asyncio.timeout(timeout_s):
                status, answer = await self._exchange(message)
        except TimeoutError:
            raise _error("DEADLINE_EXCEEDED", f"Triton's HTTP endpoint gave no answer within {timeout_s:.3f} s"
                         ) from None
        if status == 200:
            try:
                return dict(orjson.loads(answer))
            except (orjson.JSONDecodeError, TypeError, ValueError):
                raise _error("INTERNAL", f"Triton's HTTP endpoint answered 200 with no JSON object: {answer[:200]!r}"
                             ) from None
        try:
            message_text = str(orjson.loads(answer).get("error", ""))
        except (orjson.JSONDecodeError, AttributeError):
            message_text = answer[:500].decode(errors="replace")
        raise _error(_GRPC_STATUS.get(status, "UNKNOWN"), message_text or f"HTTP {status}")

    async def live(self, timeout_s: float) -> None:
        """Return when `GET /v2/health/live` answers 200 within `timeout_s`: the endpoint is Triton's HTTP endpoint
        and it is live. HttpUnreachable when nothing there speaks HTTP/1.x; InferenceServerException otherwise."""
        message = f"GET /v2/health/live HTTP/1.1\r\nHost: {self.url}\r\n\r\n".encode()
        try:
            async with asyncio.timeout(timeout_s):
                status, _ = await self._exchange(message)
        except TimeoutError:
            raise _error("DEADLINE_EXCEEDED", f"no answer within {timeout_s:.3f} s") from None
        if status != 200:
            raise _error(_GRPC_STATUS.get(status, "UNKNOWN"), f"/v2/health/live answered HTTP {status}")

    async def _exchange(self, message: bytes) -> Answer:
        """Send `message` on a kept connection (or a new one) and wait for its answer; the connection is kept
        when the answer came whole and the server keeps it alive, closed otherwise."""
        while self._idle:
            connection = self._idle.pop()
            if not connection.open:
                continue
            try:
                return await self._on(connection, message)
            except ConnectionError:
                if connection.received:  # it failed mid-answer, not as a stale idle connection
                    raise _error("UNAVAILABLE", "Triton's HTTP connection failed during a call") from None
        try:
            _, connection = await asyncio.get_running_loop().create_connection(_Protocol, self.host, self.port)
        except OSError as exc:
            raise HttpUnreachable(f"cannot connect to Triton's HTTP endpoint {self.url}: {exc}") from None
        try:
            return await self._on(connection, message)
        except _NotHttp as exc:
            raise HttpUnreachable(f"{self.url} is not Triton's HTTP endpoint: {exc}") from None
        except ConnectionError as exc:
            if not connection.received:  # a new connection closed unanswered: nothing served the call there
                raise HttpUnreachable(f"{self.url} closed a new connection without answering") from None
            raise _error("UNAVAILABLE", f"Triton's HTTP endpoint {self.url}: {exc}") from None

    async def _on(self, connection: _Protocol, message: bytes) -> Answer:
        try:
            answer = await connection.send(message)
        except BaseException:
            connection.close()  # an answer may still come: never read it as the next call's
            raise
        if connection.keep_alive and connection.open and len(self._idle) < MAX_IDLE:
            self._idle.append(connection)
        else:
            connection.close()
        return answer

    @property
    def idle(self) -> int:
        """Connections kept for the next calls and still open."""
        return sum(connection.open for connection in self._idle)

    def close(self) -> None:
        """Close the idle connections (calls in flight close theirs when they end)."""
        for connection in self._idle:
            connection.close()
        self._idle.clear()
