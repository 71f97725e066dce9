"""How a burst of 256 keep-alive connections lands on 4 gateway workers (run from the repository root, with
PYTHONPATH=. and .venv's python). The gateway needs no Triton to accept connections and answer /healthz.
`reuse_port=true` needs the gateway of e7086ce (GATEWAY_REUSE_PORT, reverted in the next commit)."""
import socket
import sys
import time

import psutil

from devstack.gateway import GatewayProcess
from loadtest.experiments.host_cpu import worker_connections

for reuse_port in sys.argv[1:]:
    for trial in range(3):
        with GatewayProcess("127.0.0.1:1", settings={"workers": "4", "reuse_port": reuse_port}) as gw:
            time.sleep(4)  # every worker up (this probe's own wait; the test of e7086ce waited on /proc instead)
            workers = [c.pid for c in psutil.Process(gw.process.pid).children()]
            burst = [socket.create_connection(("127.0.0.1", gw.port)) for _ in range(256)]
            for c in burst:
                c.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            for c in burst:
                assert c.recv(4096).startswith(b"HTTP/1.1 200")
            print(reuse_port, sorted(worker_connections([gw.process.pid, *workers]).values()))
