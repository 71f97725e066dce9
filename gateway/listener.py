"""One listening socket per gateway worker (SO_REUSEPORT), so that the kernel spreads connections evenly.

uvicorn's workers share the parent's one listening socket by default, and asyncio accepts every connection that is
pending when a worker wakes (up to the backlog, 2,048). A burst of new connections (a client fleet starting, a
load balancer's pool filling) then piles onto whichever worker woke first: 64 connections over 4 workers landed as
0, 6, 9, 24 and 25 on the dev VM (loadtest/results/local-2core-20z-listen). Keep-alive connections stay where they
landed, so a crowded worker's event loop is full while others idle. With a socket of its own per worker, Linux
hashes each new connection to one of them.

uvicorn binds once in its parent and hands the socket to each spawned worker by pickling it.
`ReusePortListener` is that socket: the parent's binds the port and never listens, and each worker's copy is a new
socket of its own on the same address. A worker that uvicorn restarts gets a new one too.
"""

from __future__ import annotations

import logging
import socket
import sys
from typing import Any

log = logging.getLogger("gateway")


class ReusePortListener(socket.socket):
    """A TCP socket bound with SO_REUSEPORT; pickled into another process, it arrives there as a new socket of
    its own bound to the same address."""

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:  # noqa: ARG002 - the same at every protocol
        return bind_reuse_port, (self.family, self.getsockname()[:2])


def bind_reuse_port(family: socket.AddressFamily, address: tuple[str, int]) -> ReusePortListener:
    """A socket bound to `address` with SO_REUSEADDR and SO_REUSEPORT, not listening yet (uvicorn's server does)."""
    sock = ReusePortListener(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def per_worker_listener(host: str, port: int) -> ReusePortListener:
    """The parent's socket on (host, port), for uvicorn's workers: it holds the port, each worker listens on its
    own copy. Raises OSError as bind does (the port is taken)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = bind_reuse_port(family, (host, port))
    log.info("listening on %s:%d, one socket per worker (SO_REUSEPORT)", host, sock.getsockname()[1])
    return sock


def reuse_port_balances() -> bool:
    """Whether SO_REUSEPORT spreads connections over the sockets here: Linux's does (by a hash of each connection's
    addresses); elsewhere it may hand them all to one socket."""
    return sys.platform == "linux" and hasattr(socket, "SO_REUSEPORT")
