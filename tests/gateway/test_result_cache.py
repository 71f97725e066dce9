"""The embedding result cache (gateway/service/cache), with real parts: the peer models' tritonserver, in-process
gateways, a real redis-server.

- the stores: the per-worker LRU stays within its bytes and counts its evictions; Redis entries of an old epoch,
  or of an epoch key that was lost, are never answered; Redis down is a miss, never a failed request;
- the keys: another model, version, endpoint, pipeline, prompt text or truncation direction is another key;
- a cached answer is the fresh answer, byte for byte, on /embed and /v1/embeddings, and across two gateways
  sharing one Redis; a request of hits and misses keeps its order and bills the same usage as a fresh one;
- options applied after the model (dimensions, normalize) and options that change the row (prompt, truncation
  direction) never get another option's answer; `truncate: false` refuses an over-long cached text as a fresh
  request does.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi import FastAPI

from devstack.tritonserver import TritonServer, free_port
from gateway.metrics import render_latest
from gateway.service.cache.keys import model_identity, text_key
from gateway.service.cache.local import LocalStore, entry_size
from gateway.service.cache.redis_store import RedisStore
from gateway.service.cache.store import new_epoch, pack, unpack
from gateway.service.registry import Endpoint, Registry, ServedModel
from gateway.triton.client import IndexEntry
from tests.fixtures.metrics import delta
from devstack.redis_server import RedisServer
from tests.gateway.conftest import running_gateway

pytestmark = pytest.mark.anyio

ROW = np.arange(8, dtype=np.float32)
LONG = "a long text that the peer embedder's 24 tokens cut off, " * 4


def scrape() -> str:
    return render_latest()[0].decode()


# --- the stores ---------------------------------------------------------------------------------------------
async def test_local_store_stays_within_its_bytes_least_recently_used_first() -> None:
    value = pack(new_epoch(), ROW, 3)
    store = LocalStore(entry_size(value) * 3)
    before = scrape()
    await store.put([(b"a", value), (b"b", value), (b"c", value)])
    assert (await store.get("m", [b"a"]))[0] == [value]  # a is now the most recently used
    await store.put([(b"d", value)])
    assert (await store.get("m", [b"a", b"b", b"c", b"d"]))[0] == [value, None, value, value]
    after = scrape()
    assert delta(before, after, "gateway_cache_evictions_total") == 1
    assert store.entries.currsize == 3 * entry_size(value) <= store.entries.maxsize
    assert delta(before, after, "gateway_cache_bytes") == 3 * entry_size(value)
    await store.close()
    assert delta(after, scrape(), "gateway_cache_bytes") == -3 * entry_size(value)


async def test_an_entry_of_another_epoch_or_width_is_a_miss() -> None:
    epoch = new_epoch()
    value = pack(epoch, ROW, 5)
    entry = unpack(value, epoch, 8)
    assert entry is not None and entry.num_tokens == 5 and entry.row.tobytes() == ROW.tobytes()
    assert unpack(value, new_epoch(), 8) is None and unpack(value, epoch, 16) is None and unpack(None, epoch, 8) is None
    store = LocalStore(1 << 20)
    first = store.epoch("m")
    await store.invalidate("m")
    assert store.epoch("m") != first and store.epoch("other") != store.epoch("m")


async def test_redis_store_epochs_and_a_lost_epoch_key(redis_server: RedisServer) -> None:
    store = RedisStore(redis_server.url, timeout_s=5)
    try:
        values, epoch = await store.get("redis-unit", [b"k1"])
        assert values == [None] and epoch is None  # no epoch yet: made now, nothing stored under none
        values, epoch = await store.get("redis-unit", [b"k1"])
        assert values == [None] and epoch is not None
        await store.put([(b"k1", pack(epoch, ROW, 2))])
        values, again = await store.get("redis-unit", [b"k1", b"k2"])
        assert again == epoch and unpack(values[0], epoch, 8) is not None and values[1] is None
        await store.invalidate("redis-unit")
        values, newer = await store.get("redis-unit", [b"k1"])
        assert newer not in (None, epoch) and unpack(values[0], newer, 8) is None
        await store.redis.delete(b"gateway:embed:epoch:redis-unit")  # evicted or flushed: made anew, never the old
        await store.get("redis-unit", [b"k1"])
        values, remade = await store.get("redis-unit", [b"k1"])
        assert remade not in (None, epoch, newer) and unpack(values[0], remade, 8) is None
    finally:
        await store.close()


async def test_redis_down_is_a_miss_counted_as_an_error() -> None:
    store = RedisStore(f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.5)  # nothing listens there
    before = scrape()
    values, epoch = await store.get("m", [b"k"])
    assert values == [None] and epoch is None
    await store.put([(b"k", pack(new_epoch(), ROW, 1))])  # left alone for a while: no second attempt
    await store.invalidate("m")
    after = scrape()
    assert delta(before, after, "gateway_cache_errors_total", operation="get") == 1
    assert delta(before, after, "gateway_cache_errors_total", operation="put") == 0
    assert delta(before, after, "gateway_cache_errors_total", operation="invalidate") == 1
    await store.close()


# --- the keys -----------------------------------------------------------------------------------------------
def test_every_part_of_the_identity_and_the_text_makes_another_key() -> None:
    endpoint = Endpoint("e_onnx_ensemble", "onnx", 8, step_model="e_onnx")
    model = ServedModel("e", "embed", 64, embedding_dim=8, endpoints={"onnx": endpoint})
    registry = Registry(2.0)
    registry.replace([], [IndexEntry("e_onnx", "1", "READY"), IndexEntry("e_onnx_ensemble", "1", "READY")])
    base = model_identity(registry, model, endpoint, "scheduler")
    assert model_identity(registry, model, endpoint, "scheduler") == base  # stable
    others = [model_identity(registry, dataclasses.replace(model, name="f"), endpoint, "scheduler"),
              model_identity(registry, dataclasses.replace(model, max_seq_len=32), endpoint, "scheduler"),
              model_identity(registry, model, dataclasses.replace(endpoint, backend="trt", step_model="e_trt_fp16"),
                             "scheduler"),
              model_identity(registry, model, endpoint, "ensemble")]
    registry.replace([], [IndexEntry("e_onnx", "2", "READY"), IndexEntry("e_onnx_ensemble", "2", "READY")])
    others.append(model_identity(registry, model, endpoint, "scheduler"))  # a new version
    assert len({base, *others}) == 1 + len(others)
    keys = {text_key(base, "right", "query: x"), text_key(base, "left", "query: x"), text_key(base, "right", "x"),
            text_key(others[0], "right", "query: x")}
    assert len(keys) == 4 and {len(k) for k in keys} == {16}


# --- through the gateway ------------------------------------------------------------------------------------
@asynccontextmanager
async def gateway(server: TritonServer, repository: Path, **settings: Any
                  ) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    async with running_gateway(server.grpc_url, triton_http_url=server.http_address, repository=str(repository),
                               **settings) as (app, client):
        yield app, client


async def embed(client: httpx.AsyncClient, texts: list[str], **options: Any) -> tuple[np.ndarray, int]:
    r = await client.post("/embed", json={"model": "st", "inputs": texts, **options})
    assert r.status_code == 200, r.text
    body = r.json()
    return np.asarray(body["embeddings"], dtype=np.float32), body["usage"]["tokens"]


async def test_cached_answers_are_the_fresh_ones_byte_for_byte_in_order_with_the_same_usage(
    peer_server: TritonServer, peer_repository: Path
) -> None:
    texts = ["cache me once", "and me too", "a third text"]
    async with gateway(peer_server, peer_repository, cache="local", shm_prefix="cacheA") as (_, client), \
            gateway(peer_server, peer_repository, shm_prefix="cacheOff") as (_, plain):
        before = scrape()
        fresh, tokens = await embed(client, texts)
        cached, cached_tokens = await embed(client, texts)
        assert cached.tobytes() == fresh.tobytes() and cached_tokens == tokens
        after = scrape()
        assert delta(before, after, "gateway_cache_lookups_total", model="st", result="miss") == 3
        assert delta(before, after, "gateway_cache_lookups_total", model="st", result="hit") == 3
        # hits and misses in one request: the input order, the usage of a fresh request
        mixed = ["new one", texts[2], "another new one", texts[0], texts[0]]
        got, got_tokens = await embed(client, mixed)
        want, want_tokens = await embed(plain, mixed)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
        assert got_tokens == want_tokens
        assert got[1].tobytes() == fresh[2].tobytes() and got[3].tobytes() == got[4].tobytes() == fresh[0].tobytes()
        # the OpenAI route shares the cache: its base64 is the same float32
        r = await client.post("/v1/embeddings", json={"model": "st", "input": texts, "encoding_format": "base64"})
        assert r.status_code == 200 and r.json()["usage"]["total_tokens"] == tokens
        raw = b"".join(base64.b64decode(d["embedding"]) for d in r.json()["data"])
        assert raw == fresh.tobytes()
        assert delta(after, scrape(), "gateway_cache_lookups_total", model="st", result="hit") >= 2 + 3


async def test_options_never_get_another_options_answer(peer_server: TritonServer, peer_repository: Path) -> None:
    """Each option set after a warm cache of the others answers as a gateway without the cache does."""
    variants: list[dict[str, Any]] = [
        {}, {"prompt_name": "query"}, {"dimensions": 8}, {"normalize": False}, {"dimensions": 8, "normalize": False},
        {"truncation_direction": "left"}, {"prompt_name": "query", "truncation_direction": "left"},
    ]
    texts = ["options apart", LONG]
    async with gateway(peer_server, peer_repository, cache="local", shm_prefix="cacheB") as (_, client), \
            gateway(peer_server, peer_repository, shm_prefix="cacheOff2") as (_, plain):
        for _ in range(2):  # the second pass answers every variant from the cache
            for options in variants:
                got, got_tokens = await embed(client, texts, **options)
                want, want_tokens = await embed(plain, texts, **options)
                np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=str(options))
                assert got_tokens == want_tokens
        # truncate: false refuses the over-long text though its row is cached, with the fresh answer's error
        r = await client.post("/embed", json={"model": "st", "inputs": texts, "truncate": False})
        fresh = await plain.post("/embed", json={"model": "st", "inputs": texts, "truncate": False})
        assert r.status_code == fresh.status_code == 413 and r.json() == fresh.json()
        short, _ = await embed(client, texts[:1], truncate=False)
        np.testing.assert_allclose(short, (await embed(plain, texts[:1]))[0], rtol=1e-6, atol=1e-7)


async def test_two_gateways_sharing_one_redis_answer_the_same_bytes(
    peer_server: TritonServer, peer_repository: Path, redis_server: RedisServer
) -> None:
    texts = ["shared between gateways", "and replicas"]
    shared = {"cache": "redis", "cache_redis_url": redis_server.url}
    async with gateway(peer_server, peer_repository, shm_prefix="cacheR1", **shared) as (_, first), \
            gateway(peer_server, peer_repository, shm_prefix="cacheR2", **shared) as (_, second):
        await embed(first, ["an epoch for st"])  # the first lookup of a model in Redis makes its epoch
        before = scrape()
        fresh, tokens = await embed(first, texts)
        cached, cached_tokens = await embed(second, texts)
        assert cached.tobytes() == fresh.tobytes() and cached_tokens == tokens
        assert delta(before, scrape(), "gateway_cache_lookups_total", model="st", result="hit") == 2


async def test_a_gateway_whose_redis_is_down_keeps_serving(peer_server: TritonServer, peer_repository: Path) -> None:
    down = f"redis://127.0.0.1:{free_port()}/0"
    async with gateway(peer_server, peer_repository, shm_prefix="cacheD", cache="redis", cache_redis_url=down,
                       cache_redis_timeout_s=0.5) as (_, client):
        before = scrape()
        first, _ = await embed(client, ["redis is down"])
        again, _ = await embed(client, ["redis is down"])
        np.testing.assert_allclose(first, again, rtol=1e-6)
        assert delta(before, scrape(), "gateway_cache_errors_total", operation="get") >= 1
