"""Fixtures of the gateway tests: a fake-contract Triton (session) and in-process gateways."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from devstack.tritonserver import TritonServer
from gateway.app import create_app
from gateway.settings import GatewaySettings
from devstack.fake_repository import write_fake_repository


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def fake_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake repository (fakecls + fakeemb), see fake_repository.py."""
    return write_fake_repository(tmp_path_factory.mktemp("fake_repository"))


@pytest.fixture(scope="session")
def fake_triton(fake_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """A real tritonserver on the fake repository, shared by the tests that do not stop it."""
    log = tmp_path_factory.mktemp("logs") / "fake_triton.log"
    with TritonServer(repository=fake_repository, log_path=log) as server:
        yield server


def shm_segments(prefix: str) -> list[str]:
    """Names in /dev/shm that belong to regions with `prefix`."""
    return sorted(f for f in os.listdir("/dev/shm") if f.startswith(prefix + "_"))


@asynccontextmanager
async def running_gateway(triton_url: str, **settings: Any) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    """The gateway app with its lifespan run, and an httpx client speaking ASGI to it."""
    app = create_app(GatewaySettings(triton_url=triton_url, **settings))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway", timeout=60) as client:
            yield app, client
