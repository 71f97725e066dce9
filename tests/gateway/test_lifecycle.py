"""The gateway's life next to a changing Triton, with real parts (tritonserver, shm, processes):

- discovery follows Triton's repository (explicit model control): models loaded (a) and unloaded (b)
  while the gateway runs show in /v1/models and /readyz by the watcher's next refresh, malformed
  ensembles are skipped with a log line (c), a model rebuilt in place (same name and version, new
  config) is followed (d), and a burst of requests for an unknown model refreshes once;
- a gateway SIGTERMed under load answers every request it accepted, correctly, and leaves no
  shared-memory region behind (neither in /dev/shm nor registered in Triton).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pytest
import tritonclient.grpc as grpcclient

from devstack.fake_repository import (
    EMBED_DIM,
    LABELS,
    _ensemble,
    _step_model,
    fake_vector,
    write_fake_repository,
)
from devstack.gateway import GatewayProcess
from devstack.tritonserver import TritonServer
from gateway.triton.client import IndexEntry
from tests.fixtures.waiting import until
from tests.gateway.conftest import running_gateway, shm_segments

pytestmark = pytest.mark.anyio

REFRESH_S = 0.5
# A change in Triton's repository is served by the first refresh that starts after it, which is at most
# the second one to complete after it (the first may have read the index just before the change).
REFRESHES = 2
EMBED_PARAMS = {"task": "embed", "embedding_dim": str(EMBED_DIM), "pooling": "mean"}
CLASSIFY_PARAMS = {"task": "classify", "labels": orjson.dumps(LABELS).decode()}
# Ensembles Triton serves happily but the gateway must not: each is skipped with a log line.
MALFORMED: dict[str, tuple[str, dict[str, str]]] = {
    "badlabels": ("classify", {**CLASSIFY_PARAMS, "labels": "not json"}),
    "nonstrlabels": ("classify", {**CLASSIFY_PARAMS, "labels": "[[1], [2], [3]]"}),
    "garbagedim": ("embed", {**EMBED_PARAMS, "embedding_dim": "garbage"}),
    "negseqlen": ("embed", {**EMBED_PARAMS, "max_seq_len": "-100"}),
}
AT_START_MALFORMED = ("badlabels", "nonstrlabels")  # loaded with the good models at start
LATER_MALFORMED = ("garbagedim", "negseqlen")  # loaded next to otheremb while the gateway runs


def unique(prefix: str) -> str:
    """A shm prefix no other test (or a concurrent run) uses."""
    return f"{prefix}{secrets.token_hex(3)}"


def write_repository(repo: Path) -> Path:
    """The fake repository, a second embed family `otheremb`, and the malformed ensembles."""
    write_fake_repository(repo)
    _step_model(repo, "otheremb_onnx", "embeddings", EMBED_DIM)
    _ensemble(repo, "otheremb", "otheremb_onnx", "embeddings", EMBED_DIM, EMBED_PARAMS)
    for name, (task, params) in MALFORMED.items():
        step, output, width = ("fakecls_onnx", "logits", len(LABELS)) if task == "classify" else (
            "fakeemb_onnx", "embeddings", EMBED_DIM)
        _ensemble(repo, name, step, output, width, params)
    return repo


def assert_error_shape(r: httpx.Response) -> dict[str, Any]:
    body = r.json()
    assert set(body) == {"error"} and isinstance(body["error"]["type"], str), body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"], body
    return body["error"]  # type: ignore[no-any-return]


async def served(client: httpx.AsyncClient) -> set[str]:
    r = await client.get("/v1/models")
    assert r.status_code == 200, r.text
    return {m["id"] for m in r.json()["data"]}


class RefreshLog:
    """What the gateway served after each refresh it completed (wraps `runtime.refresh`, which its watcher calls)."""

    def __init__(self, runtime: Any) -> None:
        self.served: list[dict[str, tuple[str, ...]]] = []  # model -> its labels, after each refresh
        original = runtime.refresh

        async def refresh(force: bool = False) -> None:
            await original(force)
            self.served.append({name: model.labels for name, model in runtime.registry.models.items()})

        runtime.refresh = refresh

    def mark(self) -> int:
        return len(self.served)

    async def followed(self, since: int, holds: Callable[[dict[str, tuple[str, ...]]], bool], what: str) -> None:
        """Wait until a refresh completed after `since` serves what `holds` checks; it must be one of the next
        REFRESHES refreshes (the watcher's, every REFRESH_S), not a later one."""
        await until(lambda: any(holds(served) for served in self.served[since:]), what)
        first = next(i for i, served in enumerate(self.served[since:]) if holds(served))
        assert first < REFRESHES, f"{what}: only by refresh {first + 1} after the change"


def registered(triton_url: str, prefix: str) -> list[str]:
    status = grpcclient.InferenceServerClient(triton_url).get_system_shared_memory_status(as_json=True)
    return sorted(n for n in status.get("regions", {}) if n.startswith(prefix))


async def check_embeds(client: httpx.AsyncClient, model: str, texts: list[str]) -> None:
    r = await client.post("/embed", json={"model": model, "inputs": texts, "normalize": False})
    assert r.status_code == 200, r.text
    want = np.stack([fake_vector(t, EMBED_DIM) for t in texts])
    np.testing.assert_allclose(np.array(r.json()["embeddings"]), want, rtol=1e-6)


@pytest.mark.slow  # repositories rebuilt and Triton reloaded several times: scripts/test -m slow
async def test_discovery_follows_the_repository(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    repo = write_repository(tmp_path / "repo")
    good = ("fakecls_onnx", "fakecls_onnx_ensemble", "fakeemb_onnx", "fakeemb_onnx_ensemble",
            "fakeemb_trt_fp16_ensemble")
    start = (*good, *(f"{n}_onnx_ensemble" for n in AT_START_MALFORMED))
    server = TritonServer(repository=repo, model_control="explicit", load_models=start, log_path=tmp_path / "triton.log")
    prefix = unique("gwdisc")
    caplog.set_level(logging.WARNING, logger="gateway")
    await asyncio.to_thread(server.start)
    try:
        triton = grpcclient.InferenceServerClient(server.grpc_url)
        async with running_gateway(server.grpc_url, triton_http_url=server.http_address, refresh_interval_s=REFRESH_S, shm_prefix=prefix,
                                   shm_pool_size=2) as (app, client):
            refreshes = RefreshLog(app.state.runtime)
            # At start: the good models, not the malformed ones (c), each of which is named in the log.
            assert await served(client) == {"fakecls", "fakeemb"}
            r = await client.get("/readyz")
            assert r.status_code == 200 and r.json()["models"] == ["fakecls", "fakeemb"], r.text
            for name in AT_START_MALFORMED:
                assert any(f"{name}_onnx_ensemble" in m for m in caplog.messages), (name, caplog.messages)
            regions_before = registered(server.grpc_url, prefix)
            assert len(regions_before) == 3 * 2  # 3 ensembles x pool of 2

            # (a) A model family loaded through Triton's repository API, after two malformed ensembles
            # (c: so that the refresh which finds it also reads them; each is skipped with a log line).
            for model in (*(f"{n}_onnx_ensemble" for n in LATER_MALFORMED), "otheremb_onnx", "otheremb_onnx_ensemble"):
                await asyncio.to_thread(triton.load_model, model)
            await refreshes.followed(refreshes.mark(), lambda models: "otheremb" in models, "otheremb served")
            r = await client.get("/readyz")
            assert r.status_code == 200 and r.json()["models"] == ["fakecls", "fakeemb", "otheremb"], r.text
            assert await served(client) == {"fakecls", "fakeemb", "otheremb"}
            await check_embeds(client, "otheremb", ["new model", "its own texts"])
            await check_embeds(client, "fakeemb", ["still served"])
            r = await client.post("/classify", json={"model": "fakecls", "inputs": ["still served"]})
            assert r.status_code == 200, r.text
            for name in LATER_MALFORMED:
                assert any(f"{name}_onnx_ensemble" in m for m in caplog.messages), (name, caplog.messages)
                r = await client.post("/embed", json={"model": name, "inputs": ["x"]})
                assert r.status_code == 404 and assert_error_shape(r)["type"] == "model_not_found", r.text
            assert len(registered(server.grpc_url, prefix)) == 4 * 2

            # (b) The family unloaded (ensemble and step): requests for it fail cleanly at once and
            # after the refresh; it leaves /v1/models and /readyz, which is ready again.
            await asyncio.to_thread(triton.unload_model, "otheremb_onnx_ensemble")
            await asyncio.to_thread(triton.unload_model, "otheremb_onnx")
            unloaded = refreshes.mark()
            window = await asyncio.gather(  # before the gateway's next refresh: Triton answers "unknown model"
                *(client.post("/embed", json={"model": "otheremb", "inputs": [f"gone {i}"]}) for i in range(8)))
            for r in window:
                assert r.status_code in (404, 503), r.text
                assert_error_shape(r)

            # (the failed calls above may have asked for a refresh of their own: it counts like the watcher's)
            await refreshes.followed(unloaded, lambda models: "otheremb" not in models, "otheremb no longer served")
            assert "otheremb" not in await served(client)
            ready = await client.get("/readyz")
            assert ready.status_code == 200 and ready.json()["models"] == ["fakecls", "fakeemb"], ready.text
            r = await client.post("/embed", json={"model": "otheremb", "inputs": ["gone"]})
            assert r.status_code == 404 and assert_error_shape(r)["type"] == "model_not_found", r.text
            await check_embeds(client, "fakeemb", ["still served after the unload"])

            await until(lambda: registered(server.grpc_url, prefix) == regions_before,  # in the background
                        "the unloaded model's regions unregistered")

            # (d) A model rebuilt in place (same names, same version, a new config: here its labels),
            # as a rebuild plus a Triton restart or reload leaves it: the gateway follows the config.
            renamed = ["bad", "meh", "good"]
            _ensemble(repo, "fakecls", "fakecls_onnx", "logits", len(LABELS),
                      {**CLASSIFY_PARAMS, "labels": orjson.dumps(renamed).decode()})
            await asyncio.to_thread(triton.load_model, "fakecls_onnx_ensemble")
            reloaded = refreshes.mark()
            config = (await asyncio.to_thread(triton.get_model_config, "fakecls_onnx_ensemble")).config
            assert orjson.loads(config.parameters["labels"].string_value) == renamed  # Triton serves the new one
            await refreshes.followed(reloaded, lambda models: models.get("fakecls") == tuple(renamed), "new labels")
            cards = (await client.get("/v1/models")).json()["data"]
            assert [c["labels"] for c in cards if c["id"] == "fakecls"] == [renamed]
            r = await client.post("/classify", json={"model": "fakecls", "inputs": ["relabelled"]})
            assert r.status_code == 200 and set(r.json()["predictions"][0]["scores"]) == set(renamed), r.text
        assert shm_segments(prefix) == [] and registered(server.grpc_url, prefix) == []
    finally:
        await asyncio.to_thread(server.stop, True)  # killed: the gateway is gone, nothing to drain


async def test_unknown_model_burst_refreshes_once(fake_triton: TritonServer) -> None:
    """50 concurrent requests for an unknown model share one read of Triton's index. With
    refresh_interval_s=0 (no watcher, a refresh always due) only the check inside the lock holds it.
    The read is held until all 50 have asked for a refresh, so that the whole burst arrives while it runs."""
    async with running_gateway(fake_triton.grpc_url, triton_http_url=fake_triton.http_address, refresh_interval_s=0, shm_prefix=unique("gwburst"),
                               shm_pool_size=1) as (app, client):
        runtime = app.state.runtime
        client_ = runtime.client
        index_read, refresh = client_.repository_index, runtime.refresh
        reads = asked = 0

        async def counted_refresh(force: bool = False) -> None:
            nonlocal asked
            asked += 1
            await refresh(force)

        async def counted() -> list[IndexEntry]:
            nonlocal reads
            reads += 1
            await until(lambda: asked == 50, "every request of the burst asked for a refresh")
            return await index_read()

        runtime.refresh = counted_refresh
        client_.repository_index = counted
        responses = await asyncio.gather(
            *(client.post("/embed", json={"model": "nosuch", "inputs": [f"t{i}"]}) for i in range(50)))
        assert all(r.status_code == 404 for r in responses), {r.status_code for r in responses}
        assert all(assert_error_shape(r)["type"] == "model_not_found" for r in responses)
        assert reads == 1, reads


TEXTS_PER_REQUEST = 48
CLIENTS = 32


async def test_gateway_sigterm_under_load(fake_triton: TritonServer, tmp_path: Path) -> None:
    """Every request the gateway accepted is answered 200 with its own vectors; then no region is left."""
    prefix = unique("gwterm")
    log_path = tmp_path / "gateway.log"
    gateway = GatewayProcess(fake_triton.grpc_url, triton_http_url=fake_triton.http_address, log_path=log_path, settings={
        "shm_prefix": prefix, "workers": "1", "log_level": "info", "shm_pool_size": "4"})
    await asyncio.to_thread(gateway.start)
    assert gateway.process is not None
    answered: list[tuple[str, float, float]] = []  # (request id, started, ended)
    wrong: list[str] = []  # answered, but not 200 with the right vectors
    failed: list[tuple[str, float, str]] = []  # no response: (request id, started, error)
    sigterm_at = float("inf")
    try:
        async with httpx.AsyncClient(base_url=gateway.url, timeout=30,
                                     limits=httpx.Limits(max_connections=CLIENTS * 2)) as http:

            async def caller(c: int) -> None:
                for n in range(10_000):
                    rid = f"c{c}-{n}"
                    texts = [f"{rid} text {i}" for i in range(TEXTS_PER_REQUEST)]
                    started = time.monotonic()
                    try:
                        r = await http.post("/embed", json={"model": "fakeemb", "inputs": texts, "normalize": False},
                                            headers={"X-Request-ID": rid})
                    except httpx.TransportError as exc:
                        failed.append((rid, started, f"{type(exc).__name__}: {exc}"))
                        return  # refused or closed: the gateway is going away
                    answered.append((rid, started, time.monotonic()))
                    if r.status_code != 200:
                        wrong.append(f"{rid}: {r.status_code} {r.text[:200]}")
                        continue
                    got = np.array(r.json()["embeddings"])
                    want = np.stack([fake_vector(t, EMBED_DIM) for t in texts])
                    if got.shape != want.shape or not np.allclose(got, want, rtol=1e-6):
                        wrong.append(f"{rid}: wrong vectors")

            callers = [asyncio.create_task(caller(c)) for c in range(CLIENTS)]
            await until(lambda: len(answered) >= 2 * CLIENTS, "the load answered for a while")
            sigterm_at = time.monotonic()
            gateway.process.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(gateway.process.wait, 30)
            await asyncio.wait_for(asyncio.gather(*callers), 30)
    except (TimeoutError, subprocess.TimeoutExpired):
        pytest.fail(f"gateway or callers did not stop; log: {log_path}")
    finally:
        await asyncio.to_thread(gateway.stop)

    logged = [orjson.loads(line) for line in log_path.read_bytes().splitlines() if line.startswith(b"{")]
    handled = {e["request_id"]: e["status"] for e in logged if e.get("msg") == "request" and e.get("path") == "/embed"}
    # uvicorn re-raises the SIGTERM it handled once it has shut down cleanly
    assert code in (0, -signal.SIGTERM), log_path.read_text()[-3000:]
    assert any(e.get("msg") == "Application shutdown complete." for e in logged), log_path.read_text()[-3000:]
    # drained within uvicorn's graceful timeout: it never had to cancel a request (it logs an error when it does)
    assert not any("timeout graceful shutdown exceeded" in str(e.get("msg")) for e in logged), log_path.read_text()[-3000:]
    assert not wrong, wrong[:5]
    assert len(failed) <= CLIENTS
    # A request without a response is one the gateway never took in (the listener was closed, or
    # an idle keep-alive connection was closed under it): it must not be in the gateway's log.
    assert not [f for f in failed if f[0] in handled], [f for f in failed if f[0] in handled]
    assert all(handled.get(rid) == 200 for rid, _, _ in answered), [(r, handled.get(r)) for r, _, _ in answered
                                                                      if handled.get(r) != 200][:5]
    assert set(handled) == {rid for rid, _, _ in answered}
    in_flight_at_stop = [rid for rid, started, ended in answered if started < sigterm_at < ended]
    assert in_flight_at_stop, "no request overlapped the stop: add load"
    assert not any(e.get("level") in ("error", "critical") for e in logged), [e for e in logged
                                                                              if e.get("level") == "error"][:3]
    assert shm_segments(prefix) == []
    assert registered(fake_triton.grpc_url, prefix) == []
