"""Every 200 body matches the response model its route declares (issue 21).

The inference routes write their answers as dicts for orjson (no pydantic model is built per request: it costs
gateway CPU, issue 20), so the declared models document OpenAPI without checking anything at run time. Here a
real gateway in front of a real tritonserver answers every route that declares a 200 model, and each body is
validated with a pydantic TypeAdapter against that model and written back with its defaults: a missing field
(also one with a default), a wrong type, a value coerced or a field the model does not have fails. The routes come from the app itself, so a new route
without a case here fails too.

Servers: the session's peer models (a reranker, a pair classifier, an embedder with prompts and matryoshka
dimensions; the admin routes unload, load and reload `nlirank` on it, in that order) and the long-context
encoders (`issue23_models`: sparse, ColBERT and SPLADE outputs), both shared with other modules.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute, iter_route_contexts
from pydantic import TypeAdapter

from devstack.tritonserver import TritonServer
from gateway.api.cohere_schemas import CohereRerankV2Response
from gateway.api.schemas import ModelList, Rank
from gateway.api.tei_schemas import TeiEmbedResponse
from gateway.app import create_app
from gateway.settings import GatewaySettings
from tests.gateway.conftest import running_gateway

pytestmark = [pytest.mark.anyio]

ADMIN = {"Authorization": "Bearer admin-key"}
PAIR = ["A man is eating.", "Someone eats food."]


@dataclass(frozen=True)
class Case:
    """One request that must answer 200: on `gateway` (peer or issue23), `method` `url` with `body`."""

    url: str
    body: dict[str, Any] | None = None
    gateway: str = "peer"
    headers: dict[str, str] = field(default_factory=dict)


# (method, route path) -> the requests that exercise it (several where a body has optional parts).
CASES: dict[tuple[str, str], list[Case]] = {
    ("POST", "/classify"): [Case("/classify", {"model": "nli", "inputs": [PAIR, PAIR[::-1]]})],
    ("POST", "/embed"): [Case("/embed", {"model": "st", "inputs": ["hello", "world"]}),
                         Case("/embed", {"model": "st", "inputs": "hello", "dimensions": 8, "prompt_name": "query"}),
                         Case("/embed", {"model": "st", "inputs": ["hello", "world"], "embedding_type": "int8"})],
    ("POST", "/v1/embeddings"): [
        Case("/v1/embeddings", {"model": "st", "input": ["hello", "world"], "input_type": "query"}),
        Case("/v1/embeddings", {"model": "st", "input": [[5, 6, 7]], "encoding_format": "base64", "dimensions": 16}),
        Case("/v1/embeddings", {"model": "st", "input": "hello", "embedding_type": "uint8"}),
    ],
    ("POST", "/rerank"): [
        Case("/rerank", {"model": "reranker", "query": "what is deep learning", "texts": ["deep", "paris"]}),
        Case("/rerank", {"model": "reranker", "query": "q", "texts": ["a", "b"], "return_text": True,
                         "raw_scores": True}),
    ],
    ("POST", "/v1/rerank"): [
        Case("/v1/rerank", {"model": "reranker", "query": "q", "documents": ["a", {"text": "b"}]}),
        Case("/v1/rerank", {"model": "reranker", "query": "q", "documents": ["a", "b", "c"], "top_n": 2,
                            "return_documents": False}),
    ],
    ("POST", "/tokenize"): [Case("/tokenize", {"model": "st", "inputs": ["hello world", "a"]}),
                            Case("/tokenize", {"model": "st", "inputs": "hi", "prompt_name": "query",
                                               "add_special_tokens": False})],
    ("POST", "/decode"): [Case("/decode", {"model": "st", "ids": [[2, 5, 6, 3], [7]]}),
                          Case("/decode", {"model": "st", "ids": [2, 5], "skip_special_tokens": False})],
    ("GET", "/v1/models"): [Case("/v1/models"), Case("/v1/models", gateway="issue23")],
    ("GET", "/v1/models/{model_id}"): [Case(f"/v1/models/{name}") for name in ("st", "reranker", "nli")]
    + [Case(f"/v1/models/{name}", gateway="issue23") for name in ("m3", "splade5")],
    ("GET", "/healthz"): [Case("/healthz")],
    ("GET", "/readyz"): [Case("/readyz"), Case("/readyz?deep=1")],
    ("POST", "/embed_sparse"): [Case("/embed_sparse", {"model": name, "inputs": ["deep learning"]}, "issue23")
                                for name in ("m3", "splade5")],
    ("POST", "/embed_all"): [Case("/embed_all", {"model": "m3", "inputs": ["deep learning", "a"]}, "issue23")],
    ("POST", "/encode"): [Case("/encode", {"model": "m3", "inputs": ["deep", "a b"]}, "issue23"),
                          Case("/encode", {"model": "m3", "inputs": "deep", "outputs": ["sparse"]}, "issue23")],
    ("POST", "/embed_multi_vector"): [Case("/embed_multi_vector", {"model": "m3", "inputs": ["deep", "a b"]},
                                           "issue23")],
    ("POST", "/v2/embed"): [
        Case("/v2/embed", {"model": "st", "texts": ["hello", "world"], "input_type": "search_query",
                           "embedding_types": ["float", "int8", "uint8", "base64", "binary", "ubinary"]}),
        Case("/v2/embed", {"model": "st", "texts": ["hello"], "input_type": "search_document"}),
    ],
    ("POST", "/v2/rerank"): [Case("/v2/rerank", {"model": "reranker", "query": "q", "documents": ["a", "b"],
                                                 "top_n": 1})],
    ("POST", "/tei/{model}"): [Case("/tei/st", {"inputs": "hello"}), Case("/tei/nli", {"inputs": [PAIR]}),
                               Case("/tei/nli", {"inputs": [PAIR], "parameters": {}}),
                               Case("/tei/reranker", {"query": "q", "texts": ["a", "b"]}),
                               Case("/tei/st", {"inputs": {"source_sentence": "q", "sentences": ["a", "b"]}}),
                               Case("/tei/splade5", {"inputs": ["deep learning"]}, "issue23")],
    ("POST", "/tei/{model}/embed"): [Case("/tei/st/embed", {"inputs": ["hello", "world"], "normalize": False})],
    ("POST", "/tei/{model}/embed_sparse"): [Case(f"/tei/{name}/embed_sparse", {"inputs": ["deep learning"]},
                                                 "issue23") for name in ("m3", "splade5")],
    ("POST", "/tei/{model}/embed_all"): [Case("/tei/m3/embed_all", {"inputs": "deep learning"}, "issue23")],
    ("POST", "/tei/{model}/similarity"): [
        Case("/tei/st/similarity", {"inputs": {"source_sentence": "q", "sentences": ["a", "b"]}}),
        Case("/tei/st/similarity", {"inputs": {"source_sentence": "q", "sentences": ["a"]},
                                    "parameters": {"prompt_name": "query", "truncate": True}})],
    ("POST", "/tei/{model}/predict"): [Case("/tei/nli/predict", {"inputs": PAIR}),
                                       Case("/tei/nli/predict", {"inputs": [PAIR, PAIR], "raw_scores": True})],
    ("POST", "/tei/{model}/rerank"): [Case("/tei/reranker/rerank", {"query": "q", "texts": ["a", "b"]}),
                                      Case("/tei/reranker/rerank", {"query": "q", "texts": ["a"],
                                                                    "return_text": True})],
    ("POST", "/tei/{model}/tokenize"): [Case("/tei/st/tokenize", {"inputs": "hello world"})],
    ("POST", "/tei/{model}/v1/embeddings"): [Case("/tei/st/v1/embeddings", {"input": ["hello", "world"]}),
                                             Case("/tei/st/v1/embeddings", {"input": "hi", "encoding_format": "base64",
                                                                            "model": "ignored"})],
    ("POST", "/tei/{model}/embeddings"): [Case("/tei/st/embeddings", {"input": "hello"})],
    ("POST", "/tei/{model}/decode"): [Case("/tei/st/decode", {"ids": [[2, 5, 6, 3]]})],
    ("POST", "/tei/{model}/vertex"): [
        Case("/tei/st/vertex", {"instances": [{"inputs": "hello"}, {"inputs": ["a", "b"], "normalize": False}]}),
        Case("/tei/nli/vertex", {"instances": [{"inputs": PAIR}, {"inputs": [PAIR, PAIR]}]}),
        Case("/tei/reranker/vertex", {"instances": [{"query": "q", "texts": ["a", "b"], "return_text": True}]}),
        Case("/tei/splade5/vertex", {"instances": [{"inputs": ["deep learning"]}]}, "issue23")],
    ("GET", "/tei/{model}/info"): [Case(f"/tei/{name}/info") for name in ("st", "nli", "reranker")]
    + [Case("/tei/splade5/info", gateway="issue23")],
    ("GET", "/admin/models"): [Case("/admin/models", headers=ADMIN)],
    ("GET", "/admin/models/{name}"): [Case("/admin/models/nlirank", headers=ADMIN)],
    # in this order: the family is served again at the end
    ("POST", "/admin/models/{name}/unload"): [Case("/admin/models/nlirank/unload", headers=ADMIN)],
    ("POST", "/admin/models/{name}/load"): [Case("/admin/models/nlirank/load", headers=ADMIN)],
    ("POST", "/admin/models/{name}/reload"): [Case("/admin/models/nlirank/reload", headers=ADMIN)],
}


def declared_200_models(app: FastAPI) -> dict[tuple[str, str], Any]:
    """(method, path) -> the 200 model of every route that declares one (`response_model` or `responses`)."""
    declared = {}
    for context in iter_route_contexts(app.routes):  # the routes of included routers too
        route = context.original_route
        if not isinstance(route, APIRoute):
            continue
        extra = route.responses.get(200) or route.responses.get("200") or {}
        model = route.response_model or extra.get("model")
        if model is not None:
            declared.update({(method, route.path): model for method in route.methods})
    return declared


def same(written: Any, body: Any, where: str = "") -> list[str]:
    """Where `written` (the model's dump) differs from `body` (floats: float32 precision)."""
    if isinstance(body, dict) and isinstance(written, dict):
        keys = sorted(set(body) | set(written))
        return [d for k in keys for d in (same(written.get(k, "<absent>"), body.get(k, "<absent>"), f"{where}.{k}"))]
    if isinstance(body, list) and isinstance(written, list) and len(body) == len(written):
        return [d for i, (w, b) in enumerate(zip(written, body)) for d in same(w, b, f"{where}[{i}]")]
    if isinstance(body, float) and isinstance(written, (int, float)) and not isinstance(written, bool):
        return [] if math.isclose(written, body, rel_tol=1e-6, abs_tol=1e-7) else [f"{where}: {written} != {body}"]
    if type(written) is not type(body) or written != body:
        return [f"{where}: {written!r} != {body!r}"]
    return []


def mismatches(model: Any, response: httpx.Response) -> list[str]:
    """Why the body does not match `model`: validation errors, or what validating and writing it back changed."""
    adapter: TypeAdapter[Any] = TypeAdapter(model)
    try:
        value = adapter.validate_json(response.content)
    except ValueError as exc:
        return [str(exc)]
    # written back with its defaults: a field the body lacks but the model fills in (a default) is a mismatch too
    written = adapter.dump_python(value, mode="json", by_alias=True, exclude_none=True)
    return same(written, without_nulls(response.json()))


def without_nulls(body: Any) -> Any:
    """The body without null fields (a null and an absent optional field mean the same)."""
    if isinstance(body, dict):
        return {k: without_nulls(v) for k, v in body.items() if v is not None}
    if isinstance(body, list):
        return [without_nulls(v) for v in body]
    return body


def test_every_route_with_a_200_model_has_a_case() -> None:
    declared = declared_200_models(create_app(GatewaySettings(triton_url="localhost:1")))
    assert sorted(set(declared) - set(CASES)) == [], "routes that declare a 200 model need a case in CASES"
    assert sorted(set(CASES) - set(declared)) == [], "cases of routes that are gone or declare no 200 model"


@pytest.mark.parametrize(("model", "body", "why"), [
    (list[Rank], [{"index": 0, "score": 0.5, "label": "x"}], ".label"),  # a field the model does not have
    (list[Rank], [{"index": "0", "score": 0.5}], ".index"),  # coerced
    (list[Rank], [{"score": 0.5}], "index"),  # missing
    (ModelList, {"object": "list", "data": [{"id": "m"}]}, "task"),  # missing
    (TeiEmbedResponse, [[0.5, 1.0], [0.5]], "one length"),  # ragged
    (list[list[float]], [[0.5, True]], "[0][1]"),  # a bool is no float
    (CohereRerankV2Response, {"id": "x", "results": [], "meta": {"billed_units": {"input_tokens": 1}}},
     ".meta.api_version"),  # a default the body lacks
])
def test_a_body_off_its_model_is_caught(model: Any, body: Any, why: str) -> None:
    found = mismatches(model, httpx.Response(200, content=orjson.dumps(body)))
    assert found and why in " ".join(found), found


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def clients(peer_server: TritonServer, peer_repository: Path, issue23_server: TritonServer,
                  issue23_repository: Path) -> AsyncIterator[dict[str, tuple[FastAPI, httpx.AsyncClient]]]:
    async with AsyncExitStack() as stack:
        yield {
            "peer": await stack.enter_async_context(running_gateway(
                peer_server.grpc_url, triton_http_url=peer_server.http_address, repository=str(peer_repository),
                shm_prefix="gwtyped",
                admin_keys=["admin-key"])),
            "issue23": await stack.enter_async_context(running_gateway(
                issue23_server.grpc_url, triton_http_url=issue23_server.http_address,
                repository=str(issue23_repository), shm_prefix="gwtyped23")),
        }


async def test_every_200_body_matches_its_declared_model(
        clients: dict[str, tuple[FastAPI, httpx.AsyncClient]]) -> None:
    declared = declared_200_models(clients["peer"][0])
    failures: list[str] = []
    for (method, path), cases in CASES.items():
        model = declared[(method, path)]
        for case in cases:
            _, client = clients[case.gateway]
            response = await client.request(method, case.url, json=case.body, headers=case.headers)
            if response.status_code != 200:
                failures.append(f"{method} {case.url} {case.body}: {response.status_code} {response.text[:300]}")
                continue
            failures += [f"{method} {case.url} {case.body}: {m}" for m in mismatches(model, response)[:5]]
    assert failures == []
