"""`python -m devstack [--repository PATH]`: Triton (CPU wheel binary) + gateway, no Docker, no GPU.

Build the repository with the builder's `--runtime python` (into model_repository/models, the
folder compose mounts too), then e.g.
    PATH=$PWD/.venv/bin:$PATH .venv/bin/python -m devstack --port 8080
and call http://127.0.0.1:8080/classify. Both listen on 127.0.0.1 only. Ctrl-C, SIGTERM or SIGHUP
(terminal closed) stop both. Any GATEWAY_* variable in the environment (see .env.example) configures
the gateway; the flags below override them.

Before starting anything devstack checks the settings, the ports it was given and the repository (it
exists, holds models, and each runs here: on the python backend of the local tritonserver, on the
devices of this machine); a failed check is one `error:` line naming the cause and the fix, exit 2.
When Triton or the gateway exits, devstack says which in one `error:` line with the last error lines
of its log, stops the other and exits 1.

Ports: the gateway listens on --port, else $GATEWAY_PORT, else 8080. Triton's HTTP, gRPC and
metrics ports are --triton-http-port / --triton-grpc-port / --triton-metrics-port, else
$TRITON_HTTP_PORT / $TRITON_GRPC_PORT / $TRITON_METRICS_PORT (the names .env.example gives the
Compose stack's published ports), else free ports (printed at start), e.g.
    GATEWAY_PORT=9080 TRITON_GRPC_PORT=9001 .venv/bin/python -m devstack
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path
from typing import NoReturn

from devstack.checks import check_port_free
from devstack.failures import ChildFailed, CheckFailed, StackError
from devstack.stack import LocalStack
from devstack.tritonserver import LOOPBACK

DEFAULT_REPOSITORY = Path("model_repository/models")
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
POLL_S = 0.2
DEFAULT_GATEWAY_PORT = 8080
# TritonServer's port fields and the variables (.env.example's) that set them when no flag does
TRITON_PORT_VARIABLES = {"http_port": "TRITON_HTTP_PORT", "grpc_port": "TRITON_GRPC_PORT",
                         "metrics_port": "TRITON_METRICS_PORT"}


class _OneLineParser(argparse.ArgumentParser):
    """argparse that reports a usage error as one `error:` line on stderr (exit 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see --help)\n")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = _OneLineParser(prog="python -m devstack", description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, default=DEFAULT_REPOSITORY,
                        help=f"model repository (builder output; default {DEFAULT_REPOSITORY}, as compose)")
    parser.add_argument("--port", type=int, default=None,
                        help=f"gateway port (default $GATEWAY_PORT, else {DEFAULT_GATEWAY_PORT})")
    for field, variable in TRITON_PORT_VARIABLES.items():
        parser.add_argument(f"--triton-{field.removesuffix('_port')}-port", dest=f"triton_{field}", type=int,
                            default=None, help=f"Triton's {field.removesuffix('_port')} port (default ${variable}, "
                                               "else a free one)")
    parser.add_argument("--workers", type=int, default=None, help="gateway worker processes")
    parser.add_argument("--shm", choices=("system", "cuda", "none"), default=None, help="tensor transport")
    parser.add_argument("--log-dir", type=Path, default=Path(".cache/devstack"), help="log files")
    return parser.parse_args(argv)


def _port(value: str | int, variable: str) -> int:
    """A port number from a flag or `variable`, or CheckFailed naming that variable."""
    if str(value).isdigit() and 1 <= int(value) <= 65535:
        return int(value)
    raise CheckFailed(f"{variable}: must be a port number, 1 to 65535 (got {str(value)!r})")


def ports(args: argparse.Namespace, environ: dict[str, str] | None = None) -> tuple[int, dict[str, int]]:
    """(the gateway's port, Triton's ports that are set): each flag, else its variable, else the default."""
    env = os.environ if environ is None else environ
    gateway = _port(args.port or env.get("GATEWAY_PORT") or DEFAULT_GATEWAY_PORT, "GATEWAY_PORT")
    triton = {}
    for field, variable in TRITON_PORT_VARIABLES.items():
        if value := getattr(args, f"triton_{field}") or env.get(variable):
            triton[field] = _port(value, variable)
    return gateway, triton


def check_ports(gateway: int, triton: dict[str, int]) -> None:
    """The ports devstack was given are free (it picks free ones for the rest), before anything starts: a
    server already there would otherwise answer devstack's own health checks."""
    check_port_free(gateway, LOOPBACK, "the gateway's",
                    "stop what listens there, or choose another port: --port N or GATEWAY_PORT=N")
    for field, port in triton.items():
        kind = field.removesuffix("_port")
        check_port_free(port, LOOPBACK, f"Triton's {kind} port", f"stop what listens there, or choose another port "
                        f"(--triton-{kind}-port N or {TRITON_PORT_VARIABLES[field]}=N), or set neither: a free one")


def stop_on_signals() -> threading.Event:
    """An event set by SIGINT, SIGTERM or SIGHUP (handled alike: the stack is stopped)."""
    stop = threading.Event()
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda *_: stop.set())
    return stop


def serve(stack: LocalStack, stop: threading.Event) -> int:
    """Wait for a stop signal (0) or for a child to exit by itself (1, said on stderr)."""
    while not stop.wait(POLL_S):
        if exited := stack.exited():
            report(ChildFailed(f"{exited}; stopping the stack", exited.log_path, exited.log_start))
            return 1
    return 0


def report(error: StackError) -> None:
    print("\n".join(error.report()), file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    settings = {k: str(v) for k, v in (("workers", args.workers), ("shm", args.shm)) if v is not None}
    stop = stop_on_signals()  # before the children start: a signal during start-up stops them too
    try:
        gateway_port, triton_ports = ports(args)
        check_ports(gateway_port, triton_ports)
        with LocalStack(args.repository.resolve(), gateway_port=gateway_port, gateway_settings=settings,
                        log_dir=args.log_dir, triton_ports=triton_ports) as stack:
            assert stack.triton and stack.gateway
            print(f"triton  grpc {stack.triton.grpc_url}  http {stack.triton.http_url}  metrics {stack.triton.metrics_url}")
            print(f"gateway {stack.gateway.url}  (docs {stack.gateway.url}/docs)  logs in {args.log_dir}", flush=True)
            return serve(stack, stop)
    except StackError as error:
        report(error)
        return error.exit_code


if __name__ == "__main__":
    sys.exit(main())
