"""Model lifecycle on a running stack (issue 11), with real parts: the builder, a tritonserver in
explicit model control (as compose runs it), in-process gateways, real gRPC and shared memory.

- the admin routes: keys (off / 401 / 403), list, unknown family 404, unload under traffic (404/503
  with the JSON error shape for that family, the other one unaffected), per-family readiness, a
  family that is loading answers 503 with Retry-After, load again;
- a rebuild with changed weights published as version 2, then a reload under concurrent traffic:
  no failed request, every answer is the old or the new model's vector for its text, after the
  reload only the new one, for the gateway that reloaded and for one that only follows Triton;
- `builder serve --version 1` and a reload roll back to the old vectors.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from sentence_transformers.quantization import quantize_embeddings
from tritonclient.grpc import model_config_pb2 as mc

from builder.cli import main as builder_main
from builder.configs import read_config
from builder.versions import versions
from devstack.tritonserver import TritonServer
from tests.fixtures.repository import PYTHON_CPU, TINY_LIMITS, build_repository, stored_ranges
from tests.fixtures.tiny_models import write_tiny_embedder
from tests.fixtures.triton import serving
from tests.fixtures.waiting import until
from tests.gateway.conftest import running_gateway

pytestmark = pytest.mark.anyio

ADMIN = {"Authorization": "Bearer admin-key"}
TEXTS = [f"text number {i} " + "word " * (i % 7) for i in range(12)]
FAMILY = ("tinyemb_tokenizer", "tinyemb_onnx", "tinyemb_onnx_ensemble")


def _build(repository: Path, models: list[dict[str, Any]]) -> None:
    build_repository(repository, models, **PYTHON_CPU, **TINY_LIMITS)


@pytest.fixture(scope="module")
def lifecycle(python_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TritonServer, Path, Path]]:
    """(server, repository, root): a copy of the session's tinycls + tinyemb repository (the same builder
    output, not built again), served by a tritonserver of this module only: its tests unload, rebuild and
    reload models."""
    root = tmp_path_factory.mktemp("admin")
    repository = root / "model_repository" / "models"
    shutil.copytree(python_repository, repository)
    with serving(TritonServer(repository, log_path=root / "tritonserver.log")) as server:
        assert "--model-control-mode=explicit" in server.command(Path("/x")) and "--load-model=*" in server.command(Path("/x"))
        yield server, repository, root


def _error(r: httpx.Response, status: int | tuple[int, ...]) -> dict[str, Any]:
    assert r.status_code in ((status,) if isinstance(status, int) else status), (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error"} and body["error"]["type"] and body["error"]["message"], body
    return body["error"]  # type: ignore[no-any-return]


async def _served(client: httpx.AsyncClient) -> set[str]:
    return {m["id"] for m in (await client.get("/v1/models")).json()["data"]}


async def _embed(client: httpx.AsyncClient, texts: list[str]) -> np.ndarray:
    r = await client.post("/embed", json={"model": "tinyemb", "inputs": texts, "normalize": False})
    assert r.status_code == 200, r.text
    return np.array(r.json()["embeddings"], dtype=np.float32)


async def _int8(client: httpx.AsyncClient, texts: list[str]) -> list[list[int]]:
    r = await client.post("/embed", json={"model": "tinyemb", "inputs": texts, "embedding_type": "int8"})
    assert r.status_code == 200, r.text
    return list(r.json()["embeddings"])


async def test_admin_keys(lifecycle: tuple[TritonServer, Path, Path]) -> None:
    """Off without GATEWAY_ADMIN_KEYS (404); 401 without a key; 403 for an API key or a wrong one;
    admin keys open no API route when API keys are set."""
    server, repository, _ = lifecycle
    async with running_gateway(server.grpc_url, triton_http_url=server.http_address, shm="none", repository=str(repository)) as (_, client):
        off = _error(await client.get("/admin/models", headers=ADMIN), 404)
        assert "GATEWAY_ADMIN_KEYS" in off["message"]
    async with running_gateway(server.grpc_url, triton_http_url=server.http_address, shm="none", repository=str(repository), admin_keys="admin-key",
                               api_keys="api-key") as (_, client):
        r = await client.post("/admin/models/tinyemb/reload")
        assert _error(r, 401)["type"] == "authentication_error" and r.headers["WWW-Authenticate"] == "Bearer"
        for key in ("api-key", "wrong"):
            r = await client.post("/admin/models/tinyemb/unload", headers={"Authorization": f"Bearer {key}"})
            assert _error(r, 403)["type"] == "forbidden"
        assert (await client.get("/admin/models", headers=ADMIN)).status_code == 200
        _error(await client.post("/embed", json={"inputs": ["x"]}, headers=ADMIN), 401)  # not an API key
    assert (await _states(server, repository)) == {"tinycls": "ready", "tinyemb": "ready"}  # nothing was unloaded


async def _states(server: TritonServer, repository: Path) -> dict[str, str]:
    async with running_gateway(server.grpc_url, triton_http_url=server.http_address, shm="none", repository=str(repository)) as (_, client):
        return (await client.get("/readyz")).json()["families"]  # type: ignore[no-any-return]


@pytest.mark.slow  # ~6 s of the default run; the result cache's reload test reloads under a gateway by default
async def test_unload_and_load_under_traffic(lifecycle: tuple[TritonServer, Path, Path]) -> None:
    server, repository, _ = lifecycle
    async with running_gateway(server.grpc_url, triton_http_url=server.http_address, repository=str(repository), admin_keys="admin-key",
                               shm_prefix=f"gwadm{random.randrange(1 << 20)}", refresh_interval_s=0.5) as (_, client):
        listed = (await client.get("/admin/models", headers=ADMIN)).json()["data"]
        assert {f["name"]: (f["state"], f["served"]) for f in listed} == {
            "tinycls": ("ready", True), "tinyemb": ("ready", True)}
        emb = next(f for f in listed if f["name"] == "tinyemb")
        assert {(e["name"], e["version"], e["state"]) for e in emb["entries"]} == {(n, "1", "READY") for n in FAMILY}
        assert _error(await client.post("/admin/models/nosuch/load", headers=ADMIN), 404)["type"] == "model_not_found"
        assert _error(await client.get("/admin/models/nosuch", headers=ADMIN), 404)

        # unload tinycls while both families get traffic
        stop = asyncio.Event()
        outcomes: dict[str, list[httpx.Response]] = {"tinycls": [], "tinyemb": []}

        async def traffic(model: str) -> None:
            route = "/classify" if model == "tinycls" else "/embed"
            while not stop.is_set():
                outcomes[model].append(await client.post(route, json={"model": model, "inputs": TEXTS[:3]}))

        tasks = [asyncio.create_task(traffic(m)) for m in ("tinycls", "tinyemb") for _ in range(3)]
        await until(lambda: all(len(outcomes[m]) >= 3 for m in outcomes), "both families answering")
        r = await client.post("/admin/models/tinycls/unload", headers=ADMIN)
        assert r.status_code == 200 and r.json()["state"] in ("unloading", "unloaded") and not r.json()["served"], r.text
        emb_at_unload = len(outcomes["tinyemb"])
        await until(lambda: any(r.status_code == 404 for r in outcomes["tinycls"])
                    and len(outcomes["tinyemb"]) >= emb_at_unload + 6, "tinycls refused, tinyemb still answering")
        stop.set()
        await asyncio.gather(*tasks)
        assert all(r.status_code == 200 for r in outcomes["tinyemb"]), {r.status_code for r in outcomes["tinyemb"]}
        cls = outcomes["tinycls"]
        assert any(r.status_code == 200 for r in cls) and any(r.status_code == 404 for r in cls)
        for r in cls:
            if r.status_code != 200:
                _error(r, (404, 503))

        assert await _served(client) == {"tinyemb"}
        assert _error(await client.post("/classify", json={"model": "tinycls", "inputs": ["x"]}), 404)[
            "message"].startswith("model 'tinycls' is not served: it is unload")
        ready = await client.get("/readyz")  # the other family still serves: the gateway stays ready
        assert ready.status_code == 200 and ready.json()["models"] == ["tinyemb"], ready.text
        assert ready.json()["families"]["tinycls"] in ("unloading", "unloaded")

        # load it again: while it loads its requests get 503 with Retry-After, then it serves
        load = asyncio.create_task(client.post("/admin/models/tinycls/load", headers=ADMIN))

        async def loading() -> bool:
            assert not load.done(), "the load finished before the test saw the family loading"
            return bool((await client.get("/readyz")).json()["families"]["tinycls"] == "loading")

        await until(loading, "tinycls loading")
        during = await client.post("/classify", json={"model": "tinycls", "inputs": ["x"]})
        assert _error(during, 503)["type"] == "model_loading" and during.headers["Retry-After"] == "2"
        assert (await client.get("/readyz")).json()["families"]["tinycls"] == "loading"
        loaded = await load
        assert loaded.status_code == 200 and loaded.json()["state"] == "ready" and loaded.json()["served"], loaded.text
        assert await _served(client) == {"tinycls", "tinyemb"}
        r = await client.post("/classify", json={"model": "tinycls", "inputs": ["back"]})
        assert r.status_code == 200, r.text
        assert (await client.get("/readyz")).json()["families"] == {"tinycls": "ready", "tinyemb": "ready"}


@pytest.mark.slow  # a rebuild with the real builder, then a reload under traffic: scripts/test -m slow
async def test_rebuild_then_reload_under_traffic(lifecycle: tuple[TritonServer, Path, Path]) -> None:
    """Version 2 with other weights; a reload while 8 clients call two gateways: the one that
    reloads (scheduler pipeline: it tokenizes and calls the step) and one that only follows Triton
    (ensemble pipeline, refresh 0.5 s). Zero failures; old-or-new per text; then only new: on the one that
    reloaded, for every request sent after the reload answered; on the other, for every request sent after
    its second refresh since then (the first may have begun before the reload)."""
    server, repository, root = lifecycle
    settings: dict[str, Any] = {"repository": str(repository), "refresh_interval_s": 0.5}
    async with (running_gateway(server.grpc_url, triton_http_url=server.http_address, admin_keys="admin-key", shm_prefix="gwadmA", **settings) as (_, a),
                running_gateway(server.grpc_url, triton_http_url=server.http_address, pipeline="ensemble", shm_prefix="gwadmB", **settings) as (app_b, b)):
        b_refreshes = 0  # refreshes gateway b completed
        b_runtime = app_b.state.runtime
        b_refresh = b_runtime.refresh

        async def counted_refresh(force: bool = False) -> None:
            nonlocal b_refreshes
            await b_refresh(force)
            b_refreshes += 1

        b_runtime.refresh = counted_refresh
        old = await _embed(a, TEXTS)
        np.testing.assert_allclose(await _embed(b, TEXTS), old, rtol=1e-5, atol=1e-6)
        old_ranges = stored_ranges(repository, "tinyemb")[32]

        await asyncio.to_thread(_build, repository, [
            {"model": str(write_tiny_embedder(root / "emb_v2", seed=2)), "task": "embed", "name": "tinyemb"}])
        for entry in FAMILY:
            assert versions(repository / entry) == [1, 2], entry
            policy = read_config(repository / entry / "config.pbtxt").version_policy
            assert policy == mc.ModelVersionPolicy(latest=mc.ModelVersionPolicy.Latest(num_versions=1))
        np.testing.assert_allclose(await _embed(a, TEXTS), old, rtol=1e-5, atol=1e-6)  # published, not loaded
        new_ranges = stored_ranges(repository, "tinyemb")[32]  # the new version's own int8 ranges
        assert not np.allclose(new_ranges, old_ranges)

        # (gateway, texts, rows, sent after the gateway follows the reload)
        answers: list[tuple[str, list[int], np.ndarray | str, bool]] = []
        stop = asyncio.Event()
        reloaded = False  # the reload call has answered
        b_follows_from: int | None = None  # b's refreshes count from which it must serve the new version

        def follows(name: str) -> bool:
            return reloaded if name == "a" else b_follows_from is not None and b_refreshes >= b_follows_from

        async def traffic(name: str, client: httpx.AsyncClient, seed: int) -> None:
            rng = random.Random(seed)
            while not stop.is_set():
                picked = rng.sample(range(len(TEXTS)), rng.randint(1, 4))
                after = follows(name)
                r = await client.post("/embed", json={"model": "tinyemb", "inputs": [TEXTS[i] for i in picked],
                                                      "normalize": False})
                rows = np.array(r.json()["embeddings"], dtype=np.float32) if r.status_code == 200 else r.text
                answers.append((name, picked, rows, after))

        tasks = [asyncio.create_task(traffic(n, c, i)) for i, (n, c) in enumerate([("a", a), ("b", b)] * 4)]
        await until(lambda: len(answers) >= 16, "both gateways answering")
        reload_started = time.monotonic()
        r = await a.post("/admin/models/tinyemb/reload", headers=ADMIN)
        took = time.monotonic() - reload_started
        reloaded, b_follows_from = True, b_refreshes + 2
        assert r.status_code == 200 and r.json()["state"] == "ready", r.text
        assert {e["name"] for e in r.json()["entries"] if e["version"] == "2" and e["state"] == "READY"} == set(FAMILY)
        await until(lambda: all(sum(n == name and after for n, _, _, after in answers) >= 8 for name in "ab"),
                    "both gateways answered requests sent after they follow the reload")
        stop.set()
        await asyncio.gather(*tasks)

        new = await _embed(a, TEXTS)
        assert not np.allclose(new, old, atol=1e-3), "the rebuilt model answers like the old one"
        np.testing.assert_allclose(await _embed(b, TEXTS), new, rtol=1e-5, atol=1e-6)
        failed = [(n, rows) for n, _, rows, _ in answers if isinstance(rows, str)]
        assert failed == [], failed[:3]
        counts = {"old": 0, "new": 0}
        for name, picked, rows, after in answers:
            assert isinstance(rows, np.ndarray)
            for i, row in zip(picked, rows):
                is_old = np.allclose(row, old[i], rtol=1e-4, atol=1e-5)
                is_new = np.allclose(row, new[i], rtol=1e-4, atol=1e-5)
                assert is_old or is_new, f"gateway {name}: text {i} is neither the old nor the new vector"
                counts["old" if is_old else "new"] += 1
                if after:
                    assert is_new, f"gateway {name}: old vector for a request sent after it follows the reload"
        assert counts["old"] > 0 and counts["new"] > 0, counts
        print(f"reload took {took:.2f}s; {len(answers)} requests, none failed; {counts}")

        # a rollback: serve version 1 again, reload, the old vectors are back
        assert builder_main(["serve", "--repository", str(repository), "--name", "tinyemb", "--version", "1"]) == 0
        assert builder_main(["serve", "--repository", str(repository), "--name", "tinyemb", "--version", "7"]) == 2
        assert (await a.post("/admin/models/tinyemb/reload", headers=ADMIN)).status_code == 200
        np.testing.assert_allclose(await _embed(a, TEXTS), old, rtol=1e-5, atol=1e-6)
        assert await _int8(a, TEXTS) == quantize_embeddings(old, precision="int8", ranges=old_ranges).tolist()
        assert builder_main(["serve", "--repository", str(repository), "--name", "tinyemb", "--version", "latest"]) == 0
        assert (await a.post("/admin/models/tinyemb/reload", headers=ADMIN)).status_code == 200
        np.testing.assert_allclose(await _embed(a, TEXTS), new, rtol=1e-5, atol=1e-6)
        assert await _int8(a, TEXTS) == quantize_embeddings(new, precision="int8", ranges=new_ranges).tolist()
