"""Triton killed and restarted under traffic: 503 while it is down, then success, same gateway."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient

from devstack.tritonserver import TritonServer
from tests.gateway.conftest import running_gateway, shm_segments

pytestmark = pytest.mark.anyio


async def test_triton_restart_under_traffic(fake_repository: Path, tmp_path: Path) -> None:
    prefix = "gwrestart"
    server = TritonServer(repository=fake_repository, log_path=tmp_path / "triton.log").start()
    try:
        async with running_gateway(server.grpc_url, shm_prefix=prefix, shm_pool_size=2, triton_timeout_s=5) as (_, client):
            phase = "up"
            seen: list[tuple[str, int, str]] = []  # (phase the request started and ended in, status, type)
            stop = asyncio.Event()

            async def traffic() -> None:
                while not stop.is_set():
                    started_in = phase
                    r = await client.post("/embed", json={"model": "fakeemb", "inputs": ["a b", "c", "d e f"]})
                    kind = r.json()["error"]["type"] if r.status_code != 200 else ""
                    seen.append((started_in if started_in == phase else "crossing", r.status_code, kind))
                    await asyncio.sleep(0.02)

            task = asyncio.create_task(traffic())
            await asyncio.sleep(0.5)
            phase = "killing"  # a request that starts before the kill lands may still succeed
            await asyncio.to_thread(server.stop, True)  # SIGKILL: no goodbye, shm registrations lost
            phase = "down"  # the process is gone: every request from here on must fail with 503
            await asyncio.sleep(1.0)
            phase = "restarting"
            await asyncio.to_thread(server.start)
            phase = "restarted"
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not any(p == "restarted" and s == 200 for p, s, _ in seen):
                await asyncio.sleep(0.1)
            stop.set()
            await task
            status = grpcclient.InferenceServerClient(server.grpc_url).get_system_shared_memory_status(as_json=True)
            reregistered = [n for n in status.get("regions", {}) if n.startswith(prefix)]

        phases = ("up", "crossing", "killing", "down", "restarting", "restarted")
        by_phase = {p: [(s, k) for q, s, k in seen if q == p] for p in phases}
        assert by_phase["up"] and all(s == 200 for s, _ in by_phase["up"]), by_phase["up"]
        assert by_phase["down"] and all(s == 503 for s, _ in by_phase["down"]), by_phase["down"]
        assert {s for s, _ in by_phase["killing"] + by_phase["restarting"] + by_phase["crossing"]} <= {200, 503}, by_phase
        assert any(s == 200 for s, _ in by_phase["restarted"]), by_phase["restarted"]
        assert len(reregistered) == 6  # 2 regions x 3 ensembles, registered again after the restart
        assert shm_segments(prefix) == []
    finally:
        server.stop()
