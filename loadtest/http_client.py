"""A lean HTTP/1.1 client for the load generators: keep-alive connections that POST JSON, requests written as
prepared bytes, answers parsed by httptools (the C parser uvicorn uses).

Why not aiohttp: a load generator shares the host with the stack it measures. aiohttp spends about 0.25 ms of CPU
per request there (bench7's `client µs/req`), which at c=1 sits in series with every request's latency and under
load takes cores the stack would use; this client takes about a quarter of that (loadtest/results/h100-20ab-client).
A server's clients run on other machines. bench7 (through `GatewaySpec.client`), the overload storm, stack-check and
ab-gateway use it.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import httptools

Answer = tuple[int, float | None, bytes]  # status, Retry-After (seconds, when given as such), body


class HttpProtocol(asyncio.Protocol):
    """One connection's protocol: one request at a time, its answer as an `Answer`."""

    def __init__(self) -> None:
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[Answer] | None = None
        self.chunks: list[bytes] = []
        self.retry_after: float | None = None

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
        self._fail(ConnectionError("connection failed"))

    # httptools' callbacks
    def on_message_begin(self) -> None:
        self.chunks, self.retry_after = [], None

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"retry-after":
            try:
                self.retry_after = float(value)
            except ValueError:
                self.retry_after = None  # an HTTP date: not what the gateway sends

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)

    def on_message_complete(self) -> None:
        answer = (self.parser.get_status_code(), self.retry_after, b"".join(self.chunks))
        if not self.parser.should_keep_alive():
            self.close()
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(answer)

    def send(self, request: bytes) -> asyncio.Future[Answer]:
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


class Connection:
    """One keep-alive HTTP/1.1 connection to `base_url` that POSTs JSON, opened on first use and again after the
    server closed it or a request failed. Raises ConnectionError when it cannot connect or the answer does not come
    whole, TimeoutError after `timeout_s` (None: no limit)."""

    def __init__(self, base_url: str, headers: dict[str, str] | None = None, timeout_s: float | None = None) -> None:
        url = urlsplit(base_url)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 80
        fields = {"host": f"{self.host}:{self.port}", "content-type": "application/json", **(headers or {})}
        self.head = "".join(f"{k}: {v}\r\n" for k, v in fields.items())
        self.timeout_s = timeout_s
        self.protocol: HttpProtocol | None = None

    async def connect(self) -> None:
        if self.protocol is None or self.protocol.transport is None:
            try:
                _, self.protocol = await asyncio.get_running_loop().create_connection(HttpProtocol, self.host, self.port)
            except OSError:
                raise ConnectionError("cannot connect") from None

    async def post(self, path: str, body: bytes) -> Answer:
        """(status, Retry-After, body) of a POST of `body` to `path`."""
        await self.connect()
        assert self.protocol is not None
        request = f"POST {path} HTTP/1.1\r\n{self.head}content-length: {len(body)}\r\n\r\n".encode() + body
        try:
            async with asyncio.timeout(self.timeout_s):
                return await self.protocol.send(request)
        except BaseException:
            self.protocol.close()  # an answer may still come: never read it as the next request's
            raise

    async def close(self) -> None:
        if self.protocol is not None:
            self.protocol.close()
            self.protocol = None
