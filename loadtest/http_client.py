"""A lean HTTP/1.1 client for the load generator: one keep-alive connection per request slot, requests written
as prepared bytes, answers parsed by httptools (the C parser uvicorn uses).

Why not aiohttp: the load generator shares the host with the stack it measures. aiohttp spends about 0.2-0.3 ms of
CPU per request (bench7's `client µs/req`), which at c=1 sits in series with every request's latency and under
load takes cores the stack would use. A server's clients run on other machines; this client keeps what the
measurement adds small. `GatewaySpec.client` picks it or aiohttp.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import httptools


class HttpConnection(asyncio.Protocol):
    """One connection: one request at a time, its answer as (status, body)."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.chunks: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionError(f"unparsable answer: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self._fail(ConnectionError("the server closed the connection"))

    # httptools' callbacks
    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        answer = (self.parser.get_status_code(), b"".join(self.chunks))
        self.chunks = []
        if not self.parser.should_keep_alive():
            self.close()
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(answer)

    def send(self, request: bytes) -> asyncio.Future[tuple[int, bytes]]:
        """Write one whole request; the future is its answer."""
        assert self.transport is not None and self.waiter is None, "one request at a time, on an open connection"
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(request)
        return self.waiter

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
            self.transport = None

    def _fail(self, exc: Exception) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)


class HttpClient:
    """POSTs to one base URL from numbered slots, each slot its own keep-alive connection (opened when first used
    and again after the server closed it, or after a request failed)."""

    def __init__(self, base_url: str, headers: dict[str, str], timeout_s: float) -> None:
        url = urlsplit(base_url)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 80
        self.head = "".join(f"{k}: {v}\r\n" for k, v in {"host": f"{self.host}:{self.port}", **headers}.items())
        self.timeout_s = timeout_s
        self.connections: dict[int, HttpConnection] = {}

    async def post(self, slot: int, path: str, body: bytes) -> tuple[int, bytes]:
        """(status, body) of a POST of `body` (JSON) to `path`; raises on a failed connection or the timeout."""
        connection = self.connections.get(slot)
        if connection is None or connection.transport is None:
            _, connection = await asyncio.get_running_loop().create_connection(HttpConnection, self.host, self.port)
            self.connections[slot] = connection
        request = f"POST {path} HTTP/1.1\r\n{self.head}content-length: {len(body)}\r\n\r\n".encode() + body
        try:
            async with asyncio.timeout(self.timeout_s):
                return await connection.send(request)
        except BaseException:
            connection.close()  # an answer may still come: never read it as the next request's
            raise

    async def close(self) -> None:
        for connection in self.connections.values():
            connection.close()
        self.connections.clear()
