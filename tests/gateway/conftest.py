"""Fixtures of the gateway tests: the peer models' repository and server (session) and in-process gateways
(the fake-contract Triton is in tests/conftest.py)."""

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
from tests.fixtures.repository import PYTHON_CPU, build_repository
from devstack.redis_server import RedisServer
from tests.fixtures.shared import SharedRepositories
from tests.fixtures.tiny_models import (
    write_tiny_cross_encoder,
    write_tiny_modernbert,
    write_tiny_pair_classifier,
    write_tiny_splade,
    write_tiny_st_embedder,
    write_tiny_xlmr,
)
from tests.fixtures.triton import serving

# The peer models' embedder (sentence-transformers layout): prompts, max length, matryoshka dimensions.
PEER_PROMPTS = {"query": "query: ", "passage": "passage: "}
PEER_MAX_SEQ_LENGTH = 24  # the embedder's sentence_bert_config.json: the builder takes it as max_seq_len
PEER_MATRYOSHKA = [8, 16]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def peer_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """What peers serve: `rerank` a cross-encoder, `nli` a pair classifier, `st` a sentence-transformers
    embedder with prompts (default `passage`), a Normalize module and matryoshka dimensions."""
    root = tmp_path_factory.mktemp("peer_models")
    return {
        "rerank": write_tiny_cross_encoder(root / "cross"),
        "nli": write_tiny_pair_classifier(root / "nli"),
        "st": write_tiny_st_embedder(root / "st", normalize=True, prompts=PEER_PROMPTS, default_prompt_name="passage",
                                     max_seq_length=PEER_MAX_SEQ_LENGTH, matryoshka_dims=PEER_MATRYOSHKA),
    }


@pytest.fixture(scope="session")
def peer_repository(peer_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`reranker`, `nlirank` (rerank by the entailment logit), `nli` (pair classifier), `st` (embedder)."""
    repository = tmp_path_factory.mktemp("peer_repository") / "model_repository"
    build_repository(
        repository,
        [
            {"model": str(peer_models["rerank"]), "task": "rerank", "name": "reranker", "max_seq_len": 32},
            {"model": str(peer_models["nli"]), "task": "rerank", "name": "nlirank", "score_label": "entailment",
             "max_seq_len": 32},
            {"model": str(peer_models["nli"]), "task": "classify", "name": "nli", "pairs": True, "max_seq_len": 32},
            {"model": str(peer_models["st"]), "task": "embed", "name": "st"},
        ],
        **PYTHON_CPU,
        max_batch_size=8,
    )
    return repository


@pytest.fixture(scope="session")
def peer_server(peer_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """A real tritonserver serving `peer_repository` (test_peer_api.py, test_peer_clients.py)."""
    with serving(TritonServer(repository=peer_repository, log_path=tmp_path_factory.mktemp("peer_logs") / "triton.log")) as s:
        yield s


@pytest.fixture(scope="session")
def issue23_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Issue 23's encoders (test_long_sparse_vectors.py): XLM-R in bge-m3 shape (sparse and ColBERT heads) and in
    e5 shape, ModernBERT, and SPLADE folders in the sentence-transformers 5 and 6 layouts."""
    root = tmp_path_factory.mktemp("issue23_models")
    return {
        "m3": write_tiny_xlmr(root / "m3", "bge-m3"),
        "e5": write_tiny_xlmr(root / "e5", "e5"),
        "mb": write_tiny_modernbert(root / "mb"),
        "splade5": write_tiny_splade(root / "splade5", "st5"),
        "splade6": write_tiny_splade(root / "splade6", "st6", seed=10, pooling="sum", activation="log1p_relu"),
    }


@pytest.fixture(scope="session")
def issue23_repository(issue23_models: dict[str, Path], shared: SharedRepositories) -> Path:
    """`m3`, `e5`, `mb` (embed) and `splade5`, `splade6` (sparse-embed), max_batch_tokens 8,192."""
    models = issue23_models
    return shared.repository("issue23", [
        {"model": str(models["m3"]), "task": "embed", "name": "m3"},
        {"model": str(models["e5"]), "task": "embed", "name": "e5"},
        {"model": str(models["mb"]), "task": "embed", "name": "mb"},
        {"model": str(models["splade5"]), "task": "sparse-embed", "name": "splade5"},
        {"model": str(models["splade6"]), "task": "sparse-embed", "name": "splade6"},
    ], **PYTHON_CPU, max_batch_size=8, max_batch_tokens=8192)


@pytest.fixture(scope="session")
def issue23_server(issue23_repository: Path, shared: SharedRepositories) -> TritonServer:
    """A real tritonserver serving `issue23_repository` (killed at the end of the session)."""
    return shared.server("issue23")


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A real redis-server without persistence, one per session (tests/fixtures/redis_server.py)."""
    with RedisServer(tmp_path_factory.mktemp("redis") / "redis.log") as server:
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
