"""Triton killed and restarted under concurrent traffic: 503 while it is down, then correct answers
(each caller's own vectors), same gateway, and no /dev/shm segment left behind by either side. Once
one call after the restart is answered, none sent after it is refused (the channel is back)."""

from __future__ import annotations

import asyncio
import itertools
import secrets
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from devstack.fake_repository import EMBED_DIM, fake_vector
from devstack.tritonserver import TritonServer
from tests.fixtures.waiting import until
from tests.gateway.conftest import running_gateway, shm_segments

pytestmark = pytest.mark.anyio

CALLERS = 8


async def test_triton_restart_under_traffic(fake_repository: Path, tmp_path: Path) -> None:
    prefix = f"gwrestart{secrets.token_hex(3)}"
    server = TritonServer(repository=fake_repository, log_path=tmp_path / "triton.log")
    await asyncio.to_thread(server.start)
    try:
        assert server.shm_files(), "the python backend's regions should carry the server's own prefix"
        async with running_gateway(server.grpc_url, triton_http_url=server.http_address, shm_prefix=prefix, shm_pool_size=2, triton_timeout_s=5) as (_, client):
            phase = "up"
            seen: list[tuple[str, int, str]] = []  # (phase the request started and ended in, status, type)
            events = itertools.count()  # orders the starts and ends of every request
            restarted_answers: list[tuple[int, int, int]] = []  # (start, end, status) of requests sent once restarted
            wrong: list[str] = []  # a 200 whose vectors are not those of its own texts, a 503 without Retry-After
            stop = asyncio.Event()

            async def traffic(caller: int) -> None:
                n = 0
                while not stop.is_set():
                    n += 1
                    texts = [f"caller {caller} request {n}", f"c{caller} r{n} two", f"{n} {caller} three words"]
                    started_in, start = phase, next(events)
                    r = await client.post("/embed", json={"model": "fakeemb", "inputs": texts, "normalize": False})
                    kind = r.json()["error"]["type"] if r.status_code != 200 else ""
                    if r.status_code == 503 and "retry-after" not in r.headers:
                        wrong.append(f"caller {caller} request {n}: 503 without Retry-After")
                    if r.status_code == 200:
                        got = np.array(r.json()["embeddings"])
                        want = np.stack([fake_vector(t, EMBED_DIM) for t in texts])
                        if got.shape != want.shape or not np.allclose(got, want, rtol=1e-6):
                            wrong.append(f"caller {caller} request {n} in phase {started_in}")
                    seen.append((started_in if started_in == phase else "crossing", r.status_code, kind))
                    if started_in == "restarted":
                        restarted_answers.append((start, next(events), r.status_code))
                    await asyncio.sleep(0.02)  # pacing (a 503 comes back at once), not synchronisation

            tasks = [asyncio.create_task(traffic(c)) for c in range(CALLERS)]
            await until(lambda: sum(p == "up" and s == 200 for p, s, _ in seen) >= 2 * CALLERS, "answers while up")
            phase = "killing"  # a request that starts before the kill lands may still succeed
            await asyncio.to_thread(server.stop, True)  # SIGKILL: no goodbye, shm registrations lost
            # devstack unlinks what the python backend of a SIGKILLed server leaves in /dev/shm
            assert server.shm_files() == []
            phase = "down"  # the process is gone: every request from here on must fail with 503
            await until(lambda: sum(p == "down" for p, _, _ in seen) >= 2 * CALLERS, "answers while down")
            phase = "restarting"
            await asyncio.to_thread(server.start)
            phase = "restarted"
            await until(lambda: sum(p == "restarted" and s == 200 for p, s, _ in seen) >= 4 * CALLERS,
                        "answers after the restart")
            stop.set()
            await asyncio.gather(*tasks)
            status = grpcclient.InferenceServerClient(server.grpc_url).get_system_shared_memory_status(as_json=True)
            reregistered = [n for n in status.get("regions", {}) if n.startswith(prefix)]

        phases = ("up", "crossing", "killing", "down", "restarting", "restarted")
        by_phase = {p: [(s, k) for q, s, k in seen if q == p] for p in phases}
        assert not wrong, wrong[:5]
        assert by_phase["up"] and all(s == 200 for s, _ in by_phase["up"]), by_phase["up"]
        assert by_phase["down"] and all(s == 503 for s, _ in by_phase["down"]), by_phase["down"]
        assert {s for s, _ in by_phase["killing"] + by_phase["restarting"] + by_phase["crossing"]} <= {200, 503}, by_phase
        assert sum(s == 200 for s, _ in by_phase["restarted"]) >= 4 * CALLERS, by_phase["restarted"]
        # The channel reconnects (within its backoff): 503 until then, never after. No request sent after the
        # first one answered 200 is refused.
        first_ok = min(end for _, end, status in restarted_answers if status == 200)
        refused_later = [(start, status) for start, _, status in restarted_answers if start > first_ok and status != 200]
        assert not refused_later and {s for s, _ in by_phase["restarted"]} <= {200, 503}, refused_later
        assert len(reregistered) == 6  # 2 regions x 3 ensembles, registered again after the restart
        assert shm_segments(prefix) == []
        # The gateway unregistered its regions when it stopped.
        status = grpcclient.InferenceServerClient(server.grpc_url).get_system_shared_memory_status(as_json=True)
        assert [n for n in status.get("regions", {}) if n.startswith(prefix)] == []
        assert server.shm_files(), "the restarted server has python-backend regions of its own"
        await asyncio.to_thread(server.stop, True)
        assert server.shm_files() == []
    finally:
        await asyncio.to_thread(server.stop)
        assert server.shm_files() == []
