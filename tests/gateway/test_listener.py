"""Each gateway worker listens on a socket of its own (SO_REUSEPORT), so a burst of connections spreads over all of
them: real uvicorn workers, real sockets, counted from /proc."""

from __future__ import annotations

import multiprocessing
import pickle
import socket
import sys
import time

import psutil
import pytest

from devstack.gateway import GatewayProcess
from gateway.listener import ReusePortListener, bind_reuse_port
from loadtest.experiments.host_cpu import LISTENING, tcp_sockets, worker_connections

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="SO_REUSEPORT balances connections on Linux only")

WORKERS = 4
BURST = 256


def test_a_pickled_listener_arrives_as_a_socket_of_its_own_on_the_same_port() -> None:
    with bind_reuse_port(socket.AF_INET, ("127.0.0.1", 0)) as parent:
        port = parent.getsockname()[1]
        copy = pickle.loads(multiprocessing.reduction.ForkingPickler.dumps(parent))  # as uvicorn hands it to a worker
        with copy:
            assert isinstance(copy, ReusePortListener)
            assert copy.fileno() != parent.fileno()
            assert copy.getsockname() == ("127.0.0.1", port)
            assert copy.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) == 1
            copy.listen()
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                accepted, _ = copy.accept()  # the copy listens; the parent's socket only holds the port
                accepted.close()


def _workers_listening(parent: int) -> dict[int, set[int]]:
    """worker pid -> inodes of the sockets it listens on."""
    workers = psutil.Process(parent).children()
    return {w.pid: {inode for inode, _, state in tcp_sockets(w.pid) if state == LISTENING} for w in workers}


def _burst(port: int) -> list[socket.socket]:
    """`BURST` keep-alive connections opened at once, each answered once (so each has been accepted)."""
    connections = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(BURST)]
    for c in connections:
        c.sendall(b"GET /healthz HTTP/1.1\r\nHost: gateway\r\n\r\n")
    for c in connections:
        assert c.recv(4096).startswith(b"HTTP/1.1 200 ")
    return connections


def test_a_burst_of_connections_spreads_over_every_worker() -> None:
    # Triton is not needed to accept connections and answer /healthz
    with GatewayProcess("127.0.0.1:1", settings={"workers": str(WORKERS)}) as gateway:
        assert gateway.process is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # /healthz answers once the first worker is up; wait for the others
            listening = {pid: inodes for pid, inodes in _workers_listening(gateway.process.pid).items() if inodes}
            if len(listening) == WORKERS:
                break
            time.sleep(0.05)
        assert len(listening) == WORKERS
        inodes = [inode for socks in listening.values() for inode in socks]
        assert len(set(inodes)) == len(inodes) == WORKERS  # a socket of its own each
        assert not [s for s in tcp_sockets(gateway.process.pid) if s[2] == LISTENING]  # the parent only holds the port

        connections = _burst(gateway.port)
        try:
            held = worker_connections(list(listening))
            assert sum(held.values()) == BURST
            # each worker's share is binomial (256, 1/4): 64 +- 6.9; outside [32, 96] is 4.6 sigma away. One shared
            # socket put 107 of them on one worker in 2 of 3 bursts on the dev VM, and all 256 on one when it
            # had just started.
            assert all(BURST / WORKERS / 2 <= n <= BURST / WORKERS * 1.5 for n in held.values()), held
        finally:
            for c in connections:
                c.close()


def test_the_port_taken_is_a_clear_startup_failure() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        gateway = GatewayProcess("127.0.0.1:1", port=port, settings={"workers": "2"}, startup_timeout_s=30)
        with pytest.raises(RuntimeError, match="exited with 3"):
            gateway.start()
