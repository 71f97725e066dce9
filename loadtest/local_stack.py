"""What the stack benchmarks (lanes, long-docs, encode) share: one local stack on a built repository, tritonserver
and the gateway with its shipped defaults (devstack), and the end of a run, its summary written and printed and its
context for the results table's rows."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from devstack.gateway import GatewayProcess
from devstack.tritonserver import TritonServer
from loadtest.machine import describe_machine
from loadtest.results_table import RunContext


@contextmanager
def local_stack(repository: Path, settings: dict[str, str] | None = None) -> Iterator[tuple[TritonServer, GatewayProcess]]:
    """tritonserver on `repository` and a gateway in front of it (`settings` over the shipped defaults), logs in a
    folder of their own, until the block ends."""
    with tempfile.TemporaryDirectory() as logs, \
            TritonServer(repository=repository, log_path=Path(logs) / "triton.log") as triton, \
            GatewayProcess(triton.grpc_url, triton_http_url=triton.http_address,
                           settings={"repository": str(repository), **(settings or {})},
                           log_path=Path(logs) / "gateway.log") as gateway:
        yield triton, gateway


def publish(out: Path, name: str, lines: list[str]) -> RunContext:
    """Write the run's summary.md under `out` and print it; the context of its rows in the results table."""
    text = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(text)
    print(text, flush=True)
    return RunContext.of(describe_machine(), name, out)
