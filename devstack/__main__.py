"""`python -m devstack --repository PATH`: Triton (CPU wheel binary) + gateway, no Docker, no GPU.

Build the repository with the builder's `--runtime python`, then e.g.
    PATH=$PWD/.venv/bin:$PATH .venv/bin/python -m devstack --repository /tmp/repo --port 8080
and call http://127.0.0.1:8080/classify. Ctrl-C stops both. Any GATEWAY_* variable in the
environment (see .env.example) configures the gateway; the flags below override them.
"""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

from devstack.stack import LocalStack


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m devstack", description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, required=True, help="model repository (builder output)")
    parser.add_argument("--port", type=int, default=8080, help="gateway port (default 8080)")
    parser.add_argument("--workers", type=int, default=None, help="gateway worker processes")
    parser.add_argument("--shm", choices=("system", "none"), default=None, help="tensor transport")
    parser.add_argument("--log-dir", type=Path, default=Path(".cache/devstack"), help="log files")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    settings = {k: str(v) for k, v in (("workers", args.workers), ("shm", args.shm)) if v is not None}
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with LocalStack(args.repository.resolve(), gateway_port=args.port, gateway_settings=settings, log_dir=args.log_dir) as stack:
        assert stack.triton and stack.gateway
        print(f"triton  grpc {stack.triton.grpc_url}  http {stack.triton.http_url}  metrics {stack.triton.metrics_url}")
        print(f"gateway {stack.gateway.url}  (docs {stack.gateway.url}/docs)  logs in {args.log_dir}", flush=True)
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
