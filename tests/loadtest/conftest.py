"""Fixtures of the load-test tests: a real gateway process (1 worker, shm) in front of the session's
fake-contract tritonserver (tests/conftest.py), as devstack runs them; and a results table of their own, so that no
test appends to loadtest/results/results.csv."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from devstack.gateway import GatewayProcess
from devstack.tritonserver import TritonServer
from loadtest.results_table import TABLE_ENV


@dataclass(frozen=True)
class Stack:
    """What the load tests call: Triton directly (gRPC, shm) and the gateway (HTTP)."""

    triton: TritonServer
    gateway: GatewayProcess


@pytest.fixture(autouse=True)
def own_results_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The table the benchmarks append to in this test (their child processes inherit it)."""
    table = tmp_path / "results.csv"
    monkeypatch.setenv(TABLE_ENV, str(table))
    return table


@pytest.fixture(scope="session")
def lt_stack(fake_triton: TritonServer, fake_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """`python -m gateway` (1 worker, system shm) on the fake repository's shared tritonserver."""
    log = tmp_path_factory.mktemp("lt_logs") / "gateway.log"
    settings = {"workers": "1", "shm": "system", "repository": str(fake_repository), "shm_prefix": "gwloadtest"}
    with GatewayProcess(fake_triton.grpc_url, triton_http_url=fake_triton.http_address, settings=settings, log_path=log) as gateway:
        yield Stack(fake_triton, gateway)
