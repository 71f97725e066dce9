"""The result cache across a reload of a rebuilt model (other weights, published as version 2), with real parts: a
tritonserver of this module only (explicit model control), in-process gateways, a real redis-server.

The old vectors are never answered after the reload: by the gateway that reloaded, by another one sharing its
Redis that has not re-read Triton's repository since (the shared epoch), and by a gateway with a per-worker cache
once it has read the new version (the version is in the key).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from devstack.tritonserver import TritonServer
from tests.fixtures.metrics import delta
from devstack.redis_server import RedisServer
from tests.fixtures.triton import serving
from tests.fixtures.waiting import until
from tests.gateway.conftest import running_gateway
from tests.gateway.test_result_cache import scrape

pytestmark = pytest.mark.anyio

ADMIN = {"Authorization": "Bearer admin-key"}
FAMILY = ("tinyemb_tokenizer", "tinyemb_onnx", "tinyemb_onnx_ensemble")
TEXTS = ["the cache must let go", "of the old weights"]


@pytest.fixture(scope="module")
def reloading(python_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TritonServer, Path]]:
    """A copy of the session's `tinyemb` (the builder's output, not built again), served by a server of its own."""
    root = tmp_path_factory.mktemp("cache_reload")
    repository = root / "model_repository"
    for entry in FAMILY:
        shutil.copytree(python_repository / entry, repository / entry)
    with serving(TritonServer(repository, log_path=root / "tritonserver.log")) as server:
        yield server, repository


def publish_other_weights(repository: Path) -> None:
    """Version 2 of the family, as a rebuild publishes it: the same files, the step's weights scaled."""
    for entry in FAMILY:
        shutil.copytree(repository / entry / "1", repository / entry / "2")
    path = repository / "tinyemb_onnx" / "2" / "model.onnx"
    model = onnx.load(path)
    for tensor in model.graph.initializer:
        if tensor.data_type == onnx.TensorProto.FLOAT:
            tensor.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(tensor) * np.float32(1.5), tensor.name))
    onnx.save(model, path)


async def embed(client: httpx.AsyncClient) -> np.ndarray:
    r = await client.post("/embed", json={"model": "tinyemb", "inputs": TEXTS})
    assert r.status_code == 200, r.text
    return np.asarray(r.json()["embeddings"], dtype=np.float32)


def serves_version_2(runtime: object) -> bool:
    family = getattr(runtime, "registry").families.get("tinyemb")
    return family is not None and {(e.name, e.version) for e in family.entries if e.state == "READY"} == {
        (entry, "2") for entry in FAMILY}


async def test_a_reload_of_other_weights_never_answers_the_old_vectors(
    reloading: tuple[TritonServer, Path], redis_server: RedisServer
) -> None:
    server, repository = reloading
    common = {"triton_http_url": server.http_address, "repository": str(repository)}
    shared = {**common, "cache": "redis", "cache_redis_url": redis_server.url, "refresh_interval_s": 3600}
    async with running_gateway(server.grpc_url, shm_prefix="cacheRA", admin_keys="admin-key", **shared) as (_, a), \
            running_gateway(server.grpc_url, shm_prefix="cacheRB", **shared) as (_, b), \
            running_gateway(server.grpc_url, shm_prefix="cacheRL", cache="local", refresh_interval_s=0.1,
                            **common) as (app_local, local):
        await embed(a)  # makes the model's epoch in Redis: the next lookups can hit
        old = await embed(a)
        before = scrape()
        assert (await embed(b)).tobytes() == old.tobytes()  # from Redis
        assert (await embed(local)).tobytes() == (await embed(local)).tobytes()
        assert delta(before, scrape(), "gateway_cache_lookups_total", model="tinyemb", result="hit") == 4

        publish_other_weights(repository)
        r = await a.post("/admin/models/tinyemb/reload", headers=ADMIN)
        assert r.status_code == 200, r.text
        new = await embed(a)
        assert not np.allclose(new, old, atol=1e-3), "the rebuilt model answers like the old one"
        # b has not re-read the repository: its key still names version 1, the epoch Redis holds is new
        np.testing.assert_allclose(await embed(b), new, rtol=1e-5, atol=1e-6)
        # the per-worker cache: version 2 in its registry is another key
        await until(lambda: serves_version_2(app_local.state.runtime), "the local gateway reads version 2")
        np.testing.assert_allclose(await embed(local), new, rtol=1e-5, atol=1e-6)
