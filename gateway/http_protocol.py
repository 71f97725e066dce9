"""uvicorn's httptools protocol with TCP_NODELAY on every connection, and one send per response.

With several workers uvicorn binds the listening socket itself (`socket.socket(family)`, protocol
0), and asyncio sets TCP_NODELAY only on sockets whose protocol is IPPROTO_TCP. A response is
written as headers then body, so without it Nagle's algorithm holds the body until the client's
delayed ACK: measured 44 ms per request at concurrency 1 with GATEWAY_WORKERS=2 (1.1 ms with 1).

uvicorn writes a response's head and its body with two `transport.write` calls, which with
TCP_NODELAY are two `send` system calls and two TCP segments. `CoalescingTransport` joins the
writes made in one turn of the event loop into one (loadtest/results/local-2core-20f-gateway-cpu).
"""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


def set_nodelay(transport: asyncio.BaseTransport) -> None:
    """Turn Nagle's algorithm off on the transport's TCP socket (no-op for other sockets)."""
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class CoalescingTransport:
    """A transport whose writes in one turn of the event loop go out together, at the end of the turn
    (or before a close), in order; everything else is the wrapped transport's."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(bytes(data))

    def flush(self) -> None:
        """Write what is pending now."""
        if self._pending:
            pending, self._pending = self._pending, []
            self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class NoDelayHttpToolsProtocol(HttpToolsProtocol):
    """HttpToolsProtocol that sets TCP_NODELAY when a connection is made and writes through a
    `CoalescingTransport`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        set_nodelay(transport)
        super().connection_made(CoalescingTransport(transport, self.loop))  # type: ignore[arg-type]
