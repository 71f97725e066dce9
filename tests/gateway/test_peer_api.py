"""What application teams expect from peers (TEI, OpenAI, Cohere/Jina, NIM), served by a real
tritonserver from the builder's repository, with sentence-transformers' own code as the oracle:
rerank, sentence pairs, prompts, normalization and matryoshka dimensions as trained, truncation
side, /tokenize and /decode, token-array input, models.retrieve and the deep readiness check."""

from __future__ import annotations

import base64
import threading
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import torch
from sentence_transformers import CrossEncoder, SentenceTransformer
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from devstack.tritonserver import TritonServer
from tests.fixtures.tiny_models import NLI_LABELS
from tests.gateway.conftest import PEER_MATRYOSHKA as MATRYOSHKA
from tests.gateway.conftest import PEER_MAX_SEQ_LENGTH as MAX_SEQ_LENGTH
from tests.gateway.conftest import PEER_PROMPTS as PROMPTS
from tests.gateway.conftest import running_gateway

pytestmark = pytest.mark.anyio
PIPELINES = ["scheduler", "ensemble"]
QUERY = "which film is good"
DOCS = [
    "the movie was really good",
    "terrible service and slow food",
    "i love this film so much",
    "hello world",
    "the price is cheap but the quality is bad " * 6,  # over max_seq_len as a pair: truncated
]
TEXTS = ["the movie was great", "bad food", "hello world " * 12, "a", "안녕하세요 영화"]


# The peer models, their repository and the tritonserver serving them are session fixtures
# (tests/gateway/conftest.py), shared with test_peer_clients.py.
@pytest.fixture
def models(peer_models: dict[str, Path]) -> dict[str, Path]:
    return peer_models


@pytest.fixture
def repository(peer_repository: Path) -> Path:
    return peer_repository


@pytest.fixture
def server(peer_server: TritonServer) -> TritonServer:
    return peer_server


def gateway(server: TritonServer, repository: Path, pipeline: str = "scheduler", **settings: Any) -> Any:
    readable = str(repository) if pipeline == "scheduler" else ""
    return running_gateway(server.grpc_url, triton_http_url=server.http_address, pipeline=pipeline, repository=readable,
                           shm_prefix=f"gwpeer{pipeline}", **settings)


def st_model(path: Path) -> SentenceTransformer:
    return SentenceTransformer(str(path), device="cpu")


# --- rerank -------------------------------------------------------------------------------------
@pytest.mark.parametrize("pipeline", PIPELINES)
async def test_rerank_equals_cross_encoder(server: TritonServer, repository: Path, models: dict[str, Path],
                                           pipeline: str) -> None:
    oracle = CrossEncoder(str(models["rerank"]), device="cpu", max_length=32)
    want = oracle.predict([(QUERY, d) for d in DOCS])  # one logit: sigmoid
    logits = oracle.predict([(QUERY, d) for d in DOCS], activation_fn=torch.nn.Identity())
    assert np.ptp(want) > 1e-3  # the texts really score differently
    async with gateway(server, repository, pipeline) as (_, client):
        response = await client.post("/rerank", json={"model": "reranker", "query": QUERY, "texts": DOCS, "return_text": True})
        assert response.status_code == 200, response.text
        ranks = response.json()
        assert [r["index"] for r in ranks] == np.argsort(-want, kind="stable").tolist()
        got = np.empty(len(DOCS))
        for r in ranks:
            got[r["index"]] = r["score"]
            assert r["text"] == DOCS[r["index"]]
        np.testing.assert_allclose(got, want, atol=1e-5)
        raw = (await client.post("/rerank", json={"model": "reranker", "query": QUERY, "texts": DOCS, "raw_scores": True})).json()
        assert "text" not in raw[0]
        np.testing.assert_allclose(sorted(r["score"] for r in raw), sorted(logits), atol=1e-4)

        cohere = await client.post("/v1/rerank", json={
            "model": "reranker", "query": QUERY, "documents": [DOCS[0], {"text": DOCS[1]}, *DOCS[2:]], "top_n": 2,
            "return_documents": True})
        assert cohere.status_code == 200, cohere.text
        body = cohere.json()
        top = np.argsort(-want, kind="stable")[:2].tolist()
        assert [r["index"] for r in body["results"]] == top
        assert [r["document"]["text"] for r in body["results"]] == [DOCS[i] for i in top]
        np.testing.assert_allclose([r["relevance_score"] for r in body["results"]], want[top], atol=1e-5)
        tokenizer = AutoTokenizer.from_pretrained(models["rerank"])
        lengths = [min(len(tokenizer(QUERY, d)["input_ids"]), 32) for d in DOCS]
        assert body["usage"]["total_tokens"] == sum(lengths)
        assert body["model"] == "reranker" and body["id"]

        oracle.tokenizer.truncation_side = "left"  # the long pair loses its first tokens instead
        left = oracle.predict([(QUERY, d) for d in DOCS])
        assert np.abs(left - want).max() > 1e-4
        ranks = (await client.post("/rerank", json={"model": "reranker", "query": QUERY, "texts": DOCS,
                                                    "truncation_direction": "left"})).json()
        got = np.empty(len(DOCS))
        for r in ranks:
            got[r["index"]] = r["score"]
        np.testing.assert_allclose(got, left, atol=1e-5)


async def test_rerank_with_several_logits_scores_the_score_label(
    server: TritonServer, repository: Path, models: dict[str, Path]
) -> None:
    oracle = CrossEncoder(str(models["nli"]), device="cpu", max_length=32)
    want = oracle.predict([(QUERY, d) for d in DOCS], apply_softmax=True)[:, NLI_LABELS.index("entailment")]
    async with gateway(server, repository) as (_, client):
        body = (await client.post("/v1/rerank", json={"model": "nlirank", "query": QUERY, "documents": DOCS,
                                                      "return_documents": False})).json()
    assert all("document" not in r for r in body["results"])
    got = np.empty(len(DOCS))
    for r in body["results"]:
        got[r["index"]] = r["relevance_score"]
    np.testing.assert_allclose(got, want, atol=1e-5)


async def test_rerank_large_lists_are_batched(server: TritonServer, repository: Path, models: dict[str, Path]) -> None:
    texts = [f"{DOCS[i % len(DOCS)]} {i}" for i in range(50)]  # over max_batch_size 8: several batches
    want = CrossEncoder(str(models["rerank"]), device="cpu", max_length=32).predict([(QUERY, t) for t in texts])
    async with gateway(server, repository) as (_, client):
        ranks = (await client.post("/rerank", json={"model": "reranker", "query": QUERY, "texts": texts})).json()
    got = np.empty(len(texts))
    for r in ranks:
        got[r["index"]] = r["score"]
    np.testing.assert_allclose(got, want, atol=1e-5)


# --- sentence pairs and truncation side ---------------------------------------------------------
def pair_probs(path: Path, pairs: list[list[str]], side: str = "right") -> np.ndarray:
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.truncation_side = side
    enc = tokenizer([p[0] for p in pairs], [p[1] for p in pairs], padding=True, truncation=True, max_length=32,
                    return_tensors="pt")
    with torch.no_grad():
        logits = AutoModelForSequenceClassification.from_pretrained(path).eval()(**enc).logits
    return torch.softmax(logits, -1).numpy()


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("side", ["right", "left"])
async def test_pair_classification_equals_pytorch(
    server: TritonServer, repository: Path, models: dict[str, Path], pipeline: str, side: str
) -> None:
    pairs = [[QUERY, d] for d in DOCS] + [["a man eats", "someone is eating food " * 8]]
    want = pair_probs(models["nli"], pairs, side)
    async with gateway(server, repository, pipeline) as (_, client):
        response = await client.post("/classify", json={"model": "nli", "inputs": pairs,
                                                        "truncation_direction": side})
        assert response.status_code == 200, response.text
        got = np.array([[p["scores"][label] for label in NLI_LABELS] for p in response.json()["predictions"]])
    np.testing.assert_allclose(got, want, atol=1e-5)
    if side == "left":  # the long pairs really were cut differently
        assert np.abs(want - pair_probs(models["nli"], pairs, "right")).max() > 1e-6


@pytest.mark.parametrize("pipeline", PIPELINES)
async def test_left_truncation_of_embeddings_equals_sentence_transformers(
    server: TritonServer, repository: Path, models: dict[str, Path], pipeline: str
) -> None:
    oracle = st_model(models["st"])
    oracle.tokenizer.truncation_side = "left"
    long_text = "the film was good but the food was bad and slow " * 4
    want = oracle.encode([long_text], prompt_name="query", normalize_embeddings=True)
    oracle.tokenizer.truncation_side = "right"
    right = oracle.encode([long_text], prompt_name="query", normalize_embeddings=True)
    assert np.abs(want - right).max() > 1e-4
    async with gateway(server, repository, pipeline) as (_, client):
        body = (await client.post("/embed", json={"inputs": [long_text], "prompt_name": "query",
                                                  "truncation_direction": "left"})).json()
    np.testing.assert_allclose(body["embeddings"], want, atol=1e-5)


# --- prompts, normalization, matryoshka ---------------------------------------------------------
@pytest.mark.parametrize("pipeline", PIPELINES)
async def test_embed_prompts_and_normalization_equal_sentence_transformers(
    server: TritonServer, repository: Path, models: dict[str, Path], pipeline: str
) -> None:
    oracle = st_model(models["st"])
    async with gateway(server, repository, pipeline) as (_, client):
        card = (await client.get("/v1/models/st")).json()
        assert card["max_tokens"] == MAX_SEQ_LENGTH and card["normalize"] is True
        assert card["prompts"] == PROMPTS and card["default_prompt_name"] == "passage"
        assert card["matryoshka_dimensions"] == [*MATRYOSHKA, 32]
        for prompt_name in ("query", None):
            body = {"inputs": TEXTS} if prompt_name is None else {"inputs": TEXTS, "prompt_name": prompt_name}
            response = await client.post("/embed", json=body)
            assert response.status_code == 200, response.text
            # the model ends in a Normalize module: ST's own output is unit length, and so is ours by default
            want = oracle.encode(TEXTS, prompt_name=prompt_name)
            np.testing.assert_allclose(np.linalg.norm(want, axis=1), 1, atol=1e-5)
            np.testing.assert_allclose(response.json()["embeddings"], want, atol=1e-5)
        prefix = len(oracle.tokenizer("passage: ", add_special_tokens=False)["input_ids"])
        plain = len(oracle.tokenizer("bad food")["input_ids"])
        usage = (await client.post("/embed", json={"inputs": "bad food"})).json()["usage"]["tokens"]
        assert usage == plain + prefix  # the default prompt's tokens are billed
        for dims in MATRYOSHKA:
            got = (await client.post("/embed", json={"inputs": TEXTS, "dimensions": dims})).json()
            want = st_model(models["st"]).encode(TEXTS, normalize_embeddings=True, truncate_dim=dims)
            assert got["dimensions"] == dims
            np.testing.assert_allclose(got["embeddings"], want, atol=1e-5)
        raw = (await client.post("/embed", json={"inputs": TEXTS, "normalize": False})).json()["embeddings"]
        assert np.abs(np.linalg.norm(raw, axis=1) - 1).max() > 1e-3  # without Normalize: the pooled vectors


async def test_openai_client_float_base64_dimensions_input_type_and_retrieve(
    server: TritonServer, repository: Path, models: dict[str, Path]
) -> None:
    oracle = st_model(models["st"])
    async with gateway(server, repository) as (app, _):
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway/v1")
        client = openai.AsyncOpenAI(base_url="http://gateway/v1", api_key="unused", max_retries=0, http_client=http)
        want = oracle.encode(TEXTS, prompt_name="query", normalize_embeddings=True)
        got: dict[str, np.ndarray] = {}
        for fmt in ("float", "base64", openai.NOT_GIVEN):  # not given: recent clients ask for base64 and decode
            raw = await client.embeddings.with_raw_response.create(model="st", input=TEXTS, encoding_format=fmt,
                                                                   extra_body={"input_type": "query"})
            sent = [d["embedding"] for d in raw.http_response.json()["data"]]  # what the gateway answered
            vectors = [d.embedding for d in raw.parse().data]  # what the official client hands back
            if fmt == "float":
                assert all(isinstance(v, list) for v in sent) and vectors == sent
            else:  # the gateway sent base64 strings of little-endian float32
                assert all(isinstance(v, str) for v in sent)
                if fmt == "base64":  # asked explicitly: the client hands the string back as it came
                    assert vectors == sent
                    vectors = [np.frombuffer(base64.b64decode(v), "<f4") for v in vectors]
                else:  # not given: the client decodes; byte for byte the bytes the gateway sent
                    assert [np.asarray(v, "<f4").tobytes() for v in vectors] == [base64.b64decode(v) for v in sent]
            got[str(fmt)] = np.asarray(vectors, np.float32)
            np.testing.assert_allclose(got[str(fmt)], want, atol=1e-5)
        # the float answer is exact float32 too: the three formats carry the very same numbers
        for fmt, vectors in got.items():
            assert vectors.tobytes() == got["float"].tobytes(), fmt
        small = await client.embeddings.create(model="st", input="bad food", dimensions=8)
        np.testing.assert_allclose(small.data[0].embedding, oracle.encode(
            ["bad food"], normalize_embeddings=True, truncate_dim=8)[0], atol=1e-5)  # default prompt: passage
        with pytest.raises(openai.BadRequestError, match="allowed dimensions"):
            await client.embeddings.create(model="st", input="x", dimensions=12)
        card = await client.models.retrieve("reranker")
        assert card.id == "reranker" and getattr(card, "task") == "rerank"
        with pytest.raises(openai.NotFoundError):
            await client.models.retrieve("missing")
        await http.aclose()


class ThreadRecorder:
    """Stands in for an encoder's `tokenizers.Tokenizer` and records, for each call of it, whether it ran on
    the thread that made the recorder (the event loop's)."""

    def __init__(self, encoder: Any) -> None:
        self.tokenizer, self.seen, self.home = encoder.tokenizer, [], threading.get_ident()
        encoder.tokenizer = self

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.tokenizer, name)
        if name not in ("encode_batch", "decode_batch"):
            return attribute

        def recorded(*args: Any, **kwargs: Any) -> Any:
            self.seen.append(threading.get_ident() == self.home)
            return attribute(*args, **kwargs)

        return recorded


# --- tokenize, decode, token arrays -------------------------------------------------------------
async def test_tokenize_decode_and_token_array_input(
    server: TritonServer, repository: Path, models: dict[str, Path]
) -> None:
    hf = AutoTokenizer.from_pretrained(models["st"])
    text = "Hello world, 안녕하세요"
    async with gateway(server, repository) as (_, client):
        tokens = (await client.post("/tokenize", json={"model": "st", "inputs": [text, "a"]})).json()
        assert [t["id"] for t in tokens[0]] == hf(text)["input_ids"]
        assert tokens[0][0]["special"] and tokens[0][-1]["special"] and tokens[0][0]["start"] is None
        for token in tokens[0][1:-1]:
            assert not token["special"] and text[token["start"]:token["stop"]] == token["text"]
        assert len(tokens) == 2
        bare = (await client.post("/tokenize", json={"model": "st", "inputs": text,
                                                     "add_special_tokens": False})).json()[0]
        ids = [t["id"] for t in bare]
        assert ids == hf(text, add_special_tokens=False)["input_ids"]
        decoded = (await client.post("/decode", json={"model": "st", "ids": [hf(text)["input_ids"], ids]})).json()
        assert decoded == [hf.decode(hf(text)["input_ids"], skip_special_tokens=True), hf.decode(ids)]

        by_ids = await client.post("/v1/embeddings", json={"model": "st", "input": [ids]})
        prompted = (await client.post("/tokenize", json={"model": "st", "inputs": text, "prompt_name": "passage",
                                                         "add_special_tokens": False})).json()[0]
        by_text = await client.post("/v1/embeddings", json={"model": "st", "input": [text]})
        assert by_ids.status_code == by_text.status_code == 200, by_ids.text
        with_prompt = await client.post("/v1/embeddings", json={"model": "st", "input": [t["id"] for t in prompted]})
        # token ids are taken as given: the same ids as the (default-prompted) text give the same vector
        np.testing.assert_allclose(with_prompt.json()["data"][0]["embedding"],
                                   by_text.json()["data"][0]["embedding"], atol=1e-6)
        assert by_ids.json()["usage"]["prompt_tokens"] == len(ids) + 2

        vocab = hf.backend_tokenizer.get_vocab_size(with_added_tokens=True)
        bad = await client.post("/v1/embeddings", json={"model": "st", "input": [[1, vocab]]})
        assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_token_id"
        bad = await client.post("/decode", json={"model": "st", "ids": [-1]})
        assert bad.status_code == 422
        needs_model = await client.post("/tokenize", json={"inputs": "x"})
        assert needs_model.status_code == 400 and needs_model.json()["error"]["type"] == "model_required"
    async with gateway(server, repository, tokenize_inline_chars=64) as (app, client):
        # a large /tokenize or /decode runs on the model's tokenizer pool, off the event loop; a small one inline
        encoder = app.state.runtime.inference.tokenizer_for(app.state.runtime.registry.models["st"]).encoder
        threads = ThreadRecorder(encoder)
        long_text = "Hello world, 안녕하세요 " * 40
        for path, body in (("/tokenize", {"model": "st", "inputs": [long_text, "a"]}),
                           ("/decode", {"model": "st", "ids": [hf(long_text)["input_ids"]]}),
                           ("/tokenize", {"model": "st", "inputs": "a"})):
            assert (await client.post(path, json=body)).status_code == 200, path
        assert threads.seen == [False, False, True], threads.seen  # (on the event loop's thread)
    async with gateway(server, repository, "ensemble") as (_, client):
        refused = await client.post("/v1/embeddings", json={"model": "st", "input": [ids]})
        assert refused.status_code == 400 and refused.json()["error"]["type"] == "token_input_unsupported"
        unavailable = await client.post("/tokenize", json={"model": "st", "inputs": "x"})
        assert unavailable.status_code == 501 and unavailable.json()["error"]["type"] == "tokenizer_unavailable"


# --- bad uses, readiness, OpenAPI ---------------------------------------------------------------
@pytest.mark.parametrize(
    ("path", "body", "status", "kind"),
    [
        ("/embed", {"model": "st", "inputs": "x", "prompt_name": "nope"}, 400, "unknown_prompt"),
        ("/embed", {"model": "st", "inputs": "x", "dimensions": 12}, 400, "unsupported_dimensions"),
        ("/v1/embeddings", {"model": "st", "input": "x", "dimensions": 4}, 400, "unsupported_dimensions"),
        ("/classify", {"model": "nli", "inputs": ["single text"]}, 400, "pairs_required"),
        ("/classify", {"model": "nli", "inputs": [["one", "two", "three"]]}, 422, "validation_error"),
        ("/rerank", {"model": "st", "query": "q", "texts": ["t"]}, 400, "wrong_task"),
        ("/v1/rerank", {"model": "nli", "query": "q", "documents": ["t"]}, 400, "wrong_task"),
        ("/rerank", {"model": "reranker", "query": "q", "texts": []}, 422, "validation_error"),
        ("/embed", {"model": "st", "inputs": "x", "truncation_direction": "middle"}, 422, "validation_error"),
    ],
)
async def test_bad_uses_get_4xx_with_the_error_shape(
    server: TritonServer, repository: Path, path: str, body: dict[str, Any], status: int, kind: str
) -> None:
    async with gateway(server, repository) as (_, client):
        response = await client.post(path, json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"type", "message"} and error["type"] == kind and error["message"]
    if kind == "unsupported_dimensions":  # the 400 lists what the model allows
        assert error["message"].endswith(f"allowed dimensions: {[*MATRYOSHKA, 32]}"), error


async def test_pairs_and_dimensions_to_a_single_text_model(
    triton_server: TritonServer, python_repository: Path
) -> None:
    async with running_gateway(triton_server.grpc_url, triton_http_url=triton_server.http_address, repository=str(python_repository),
                               shm_prefix="gwpeersingle") as (_, client):
        response = await client.post("/classify", json={"model": "tinycls", "inputs": [["a", "b"]]})
        width = (await client.get("/v1/models/tinyemb")).json()["dimensions"]
        dims = await client.post("/embed", json={"model": "tinyemb", "inputs": "a", "dimensions": 8})
    assert response.status_code == 400 and response.json()["error"]["type"] == "pairs_not_supported"
    # an embedder not built as a matryoshka model: only its own width, and the 400 says so
    assert dims.status_code == 400 and dims.json()["error"]["type"] == "unsupported_dimensions"
    assert "not built as a matryoshka model" in dims.json()["error"]["message"]
    assert dims.json()["error"]["message"].endswith(f"allowed dimensions: [{width}]")


async def test_deep_readiness_runs_every_model(server: TritonServer, repository: Path) -> None:
    async with gateway(server, repository) as (_, client):
        shallow = (await client.get("/readyz")).json()
        assert "checks" not in shallow or shallow["checks"] is None
        deep = await client.get("/readyz", params={"deep": "1"})
        assert deep.status_code == 200, deep.text
        assert deep.json()["checks"] == {name: "ok" for name in ("nli", "nlirank", "reranker", "st")}
    async with gateway(server, repository, ready_probe_timeout_s=1e-6) as (_, client):
        failed = await client.get("/readyz", params={"deep": "1"})
    assert failed.status_code == 503
    # a one-token request cannot be served within a microsecond: refused (overloaded) or timed out
    assert all(v.split(":")[0] in ("timeout", "overloaded") for v in failed.json()["checks"].values()), failed.text


async def test_openapi_documents_every_new_field_with_an_example(server: TritonServer, repository: Path) -> None:
    async with gateway(server, repository) as (_, client):
        spec = (await client.get("/openapi.json")).json()
    schemas = spec["components"]["schemas"]
    new_fields = {  # fields issue 10 added to existing bodies
        "EmbedRequest": ["normalize", "truncation_direction", "prompt_name", "dimensions"],
        "ClassifyRequest": ["inputs", "truncation_direction"],
        "OpenAIEmbeddingRequest": ["input", "encoding_format", "dimensions", "input_type"],
        "ModelCard": ["pairs", "normalize", "prompts", "default_prompt_name", "matryoshka_dimensions"],
        "Readiness": ["checks"],
    }
    for schema in ("EmbedRequest", "OpenAIEmbeddingRequest"):  # issue 53: int8 and uint8
        new_fields[schema].append("embedding_type")
    new_fields["ModelCard"].append("embedding_types")
    new_fields["EmbedResponse"] = ["embeddings"]
    for schema in ("RerankRequest", "CohereRerankRequest", "TokenizeRequest", "DecodeRequest",  # new bodies:
                   "Rank", "CohereRerankResponse", "RerankResult", "Document", "RerankUsage", "Token"):  # every field
        new_fields[schema] = list(schemas[schema]["properties"])
    for schema, fields in new_fields.items():
        for name in fields:
            assert "examples" in schemas[schema]["properties"][name], (schema, name)
    for path, param in (("/readyz", "deep"), ("/v1/models/{model_id}", "model_id")):
        (found,) = [p for p in spec["paths"][path]["get"]["parameters"] if p["name"] == param]
        assert "examples" in found["schema"], (path, param)
