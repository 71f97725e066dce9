"""TCP_NODELAY on the gateway's connections when uvicorn binds the socket itself (several workers).

Without it a response (headers, then body) waits for the client's delayed ACK: 44 ms per request
at concurrency 1 with GATEWAY_WORKERS=2, measured on the 2-core VM. The tests look at the socket
option on the server side of a real connection, for a listening socket made as uvicorn makes it.
"""

from __future__ import annotations

import asyncio
import socket

import pytest
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from gateway.http_protocol import GatewayHttpProtocol

pytestmark = pytest.mark.anyio


async def _app(scope: dict, receive: object, send: object) -> None:  # type: ignore[type-arg]
    """An ASGI app that is never called (the test only connects)."""


async def server_nodelay(protocol: type[HttpToolsProtocol]) -> int:
    """TCP_NODELAY of the server side of one connection to a `protocol` server on a uvicorn-style socket."""
    config = uvicorn.Config(app=_app, http=protocol, log_config=None)
    config.load()
    state = ServerState()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # what uvicorn's bind_socket() does: proto 0
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: protocol(config=config, server_state=state, app_state={}), sock=listener)
    try:
        reader, writer = await asyncio.open_connection(*listener.getsockname())
        for _ in range(100):
            if state.connections:
                break
            await asyncio.sleep(0.01)
        (connection,) = state.connections
        value = connection.transport.get_extra_info("socket").getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        writer.close()
        return int(value)
    finally:
        server.close()


async def test_gateway_protocol_sets_tcp_nodelay_where_asyncio_does_not() -> None:
    assert await server_nodelay(HttpToolsProtocol) == 0  # the bug: Nagle stays on for uvicorn's own socket
    assert await server_nodelay(GatewayHttpProtocol) != 0


def test_gateway_serves_with_the_nodelay_protocol(monkeypatch: pytest.MonkeyPatch) -> None:
    import gateway.__main__ as entry

    seen: dict[str, object] = {}
    monkeypatch.setattr(entry.uvicorn, "run", lambda *a, **kw: seen.update(kw))
    monkeypatch.setattr(entry, "prepare_metrics_dir", lambda settings: None)  # keeps this process's metrics mode
    monkeypatch.setenv("GATEWAY_WORKERS", "2")
    entry.main()
    assert seen["http"] == "gateway.http_protocol:GatewayHttpProtocol" and seen["workers"] == 2


class _CountingTransport:
    """A connection's transport that counts the writes made through it."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        self.writes = 0

    def write(self, data: bytes) -> None:
        self.writes += 1
        self.transport.write(data)

    def __getattr__(self, name: str) -> object:
        return getattr(self.transport, name)


def counting(protocol: type[HttpToolsProtocol], writes: list[_CountingTransport]) -> type[HttpToolsProtocol]:
    class Counting(protocol):  # type: ignore[valid-type, misc]
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            counted = _CountingTransport(transport)
            writes.append(counted)
            super().connection_made(counted)

    return Counting


async def _answers(scope: dict, receive: object, send: object) -> None:  # type: ignore[type-arg]
    """/json: a JSON body; /stream: three chunks; /fail: a head, then an error."""
    if scope["type"] != "http":
        return
    path = scope["path"]
    if path == "/stream":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
        for part in (b"one,", b"two,", b"three"):
            await send({"type": "http.response.body", "body": part, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    body = b'{"ok":true}'
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def serve(protocol: type[HttpToolsProtocol], requests: bytes) -> tuple[bytes, int]:
    """What a client that sends `requests` (raw HTTP, then half-closes nothing) reads until the server closes,
    and the number of writes the server made."""
    writes: list[_CountingTransport] = []
    config = uvicorn.Config(app=_answers, http=counting(protocol, writes), log_config=None, timeout_keep_alive=1)
    config.load()
    state = ServerState()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: config.http_protocol_class(config=config, server_state=state, app_state={}), "127.0.0.1", 0)
    try:
        reader, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
        writer.write(requests)
        received = await asyncio.wait_for(reader.read(-1), 10)  # the last request says `Connection: close`
        writer.close()
        return received, sum(w.writes for w in writes)
    finally:
        server.close()


def _request(method: str, path: str, close: bool = False) -> bytes:
    return (f"{method} {path} HTTP/1.1\r\nhost: test\r\n" + ("connection: close\r\n" if close else "") + "\r\n").encode()


async def test_each_answer_leaves_in_one_write_with_the_gateway_protocol() -> None:
    requests = _request("GET", "/json") * 2 + _request("GET", "/json", close=True)
    plain, plain_writes = await serve(HttpToolsProtocol, requests)
    one, one_writes = await serve(GatewayHttpProtocol, requests)
    assert plain_writes == 6 and one_writes == 3  # uvicorn's own: a head, then a body
    assert one.count(b'HTTP/1.1 200 OK') == 3 and one.count(b'{"ok":true}') == 3
    assert _without_dates(one) == _without_dates(plain)


async def test_streamed_head_and_closing_answers_are_whole_and_in_order() -> None:
    requests = _request("GET", "/stream") + _request("HEAD", "/json") + _request("GET", "/json", close=True)
    plain, _ = await serve(HttpToolsProtocol, requests)
    one, writes = await serve(GatewayHttpProtocol, requests)
    assert _without_dates(one) == _without_dates(plain)
    assert b"4\r\none,\r\n4\r\ntwo,\r\n5\r\nthree\r\n0\r\n\r\n" in one  # the chunks, in order, then the end
    assert one.count(b"HTTP/1.1 200 OK") == 3 and one.endswith(b'{"ok":true}')
    assert writes == 4 + 1 + 1  # the stream's head went with its first chunk; HEAD's head went alone


def _without_dates(raw: bytes) -> bytes:
    return b"\r\n".join(line for line in raw.split(b"\r\n") if not line.startswith(b"date: "))
