"""A real redis-server (Debian's, which scripts/install-tools puts in .cache/bin) as a plain child process on a free
loopback port, without persistence, for the tests and benchmarks of the gateway's shared result cache."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from devstack.tritonserver import LOOPBACK, REPO_ROOT, free_port

STARTUP_TIMEOUT_S = 30.0


def _answers_ping(port: int) -> bool:
    try:
        with socket.create_connection((LOOPBACK, port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """`with RedisServer(log_path) as redis:` a server at `redis.url` until the block ends (killed: nothing to keep)."""

    def __init__(self, log_path: Path, maxmemory: str = "0") -> None:
        self.log_path = log_path
        self.maxmemory = maxmemory
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.port}/0"

    def start(self) -> Self:
        local = REPO_ROOT / ".cache" / "bin" / "redis-server"
        binary = str(local) if local.is_file() else shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("no redis-server in .cache/bin or on PATH: scripts/setup installs Debian's")
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [binary, "--port", str(self.port), "--bind", LOOPBACK, "--save", "", "--appendonly", "no",
                 "--maxmemory", self.maxmemory, "--maxmemory-policy", "allkeys-lru"],
                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while self.process.poll() is None and not _answers_ping(self.port):
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not answer PING within {STARTUP_TIMEOUT_S:g} s; log: "
                                   f"{self.log_path}")
            time.sleep(0.02)
        if self.process.poll() is not None:
            raise RuntimeError(f"redis-server exited with {self.process.returncode}; log: {self.log_path}")
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
                 ) -> None:
        self.stop()
