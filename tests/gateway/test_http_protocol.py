"""TCP_NODELAY on the gateway's connections when uvicorn binds the socket itself (several workers).

Without it a response (headers, then body) waits for the client's delayed ACK: 44 ms per request
at concurrency 1 with GATEWAY_WORKERS=2, measured on the 2-core VM. The tests look at the socket
option on the server side of a real connection, for a listening socket made as uvicorn makes it.
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.server import ServerState

from gateway.http_protocol import NoDelayHttpToolsProtocol

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
    assert await server_nodelay(NoDelayHttpToolsProtocol) != 0


def test_gateway_serves_with_the_nodelay_protocol(monkeypatch: pytest.MonkeyPatch) -> None:
    import gateway.__main__ as entry

    seen: dict[str, object] = {}
    monkeypatch.setattr(entry.uvicorn, "run", lambda *a, **kw: seen.update(kw))
    monkeypatch.setattr(entry, "prepare_metrics_dir", lambda settings: None)  # keeps this process's metrics mode
    monkeypatch.setenv("GATEWAY_WORKERS", "2")
    entry.main()
    assert seen["http"] == "gateway.http_protocol:NoDelayHttpToolsProtocol" and seen["workers"] == 2


async def _two_part_app(scope: dict, receive: Any, send: Any) -> None:  # type: ignore[type-arg]
    """Answers each request as starlette's responses do: the head, then the body, two `send` calls."""
    await receive()
    body = b'{"ok":true}'
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


async def test_each_response_leaves_in_one_socket_write_and_a_close_sends_what_is_pending() -> None:
    """Through the gateway's protocol, a response's head and body reach the socket's transport as one write
    (two requests on one keep-alive connection: two writes); a malformed request's 400, which uvicorn writes and
    then closes the connection, still arrives whole."""
    writes: list[bytes] = []

    class Recording(NoDelayHttpToolsProtocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            real_write = transport.write
            transport.write = lambda data: (writes.append(bytes(data)), real_write(data))[1]  # type: ignore[method-assign]
            super().connection_made(transport)

    config = uvicorn.Config(app=_two_part_app, http=Recording, log_config=None)
    config.load()
    state = ServerState()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Recording(config=config, server_state=state, app_state={}),
                                      "127.0.0.1", 0)
    host, port = server.sockets[0].getsockname()[:2]
    try:
        reader, writer = await asyncio.open_connection(host, port)
        for _ in range(2):
            writer.write(b"POST /x HTTP/1.1\r\nhost: a\r\ncontent-length: 2\r\n\r\n{}")
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200") and await reader.readexactly(11) == b'{"ok":true}'
        writer.close()
        assert len(writes) == 2 and all(w.startswith(b"HTTP/1.1 200") and w.endswith(b'{"ok":true}') for w in writes)
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(b"NOT HTTP\r\n\r\n")
        answer = await reader.read()  # until the server closes
        assert answer.startswith(b"HTTP/1.1 400") and answer.endswith(b"Invalid HTTP request received."), answer
        writer.close()
    finally:
        server.close()
