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
