"""The client libraries application teams already use, from PyPI and unchanged, against a real gateway
(uvicorn on a real socket, API keys on) in front of real tritonservers: huggingface_hub's InferenceClient,
langchain-huggingface and LlamaIndex on the TEI API at /tei/{model}, cohere.ClientV2 on /v2/embed and
/v2/rerank. sentence-transformers (SentenceTransformer, CrossEncoder) and transformers are the oracles.
TEI's exact shapes, errors, /info and /health are checked over plain HTTP.
"""

from __future__ import annotations

import base64
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import cohere
import httpx
import numpy as np
import openai
import pytest
import torch
import uvicorn
from cohere.core.api_error import ApiError
from huggingface_hub import InferenceClient
from huggingface_hub.errors import HfHubHTTPError
from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference
from sentence_transformers import CrossEncoder, SentenceTransformer
from sentence_transformers.quantization import quantize_embeddings
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from devstack.tritonserver import REPO_ROOT, TritonServer, free_port
from gateway.api.tei_schemas import TEI_VERSION
from gateway.app import create_app
from gateway.settings import GatewaySettings
from tests.fixtures.repository import stored_ranges
from tests.fixtures.tiny_models import LABELS, NLI_LABELS
from tests.gateway.conftest import PEER_MATRYOSHKA, PEER_MAX_SEQ_LENGTH

KEY = "client-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
MAX_INPUT_CHARS = 200  # small, so that the character limit is reached by a test text
LANGCHAIN_PYTHON = REPO_ROOT / ".cache" / "langchain-venv" / "bin" / "python"  # made by scripts/test
QUERY = "which film is good"
DOCS = ["the movie was really good", "terrible service and slow food", "i love this film so much", "hello world",
        "the price is cheap but the quality is bad " * 4]  # over max_seq_len as a pair: truncated
TEXTS = ["the movie was great", "bad food", "hello world " * 12, "a", "안녕하세요 영화"]


@contextmanager
def serving(**settings: Any) -> Iterator[str]:
    """The gateway app under uvicorn on a free local port, in a thread; yields its base URL."""
    port = free_port()
    app = create_app(GatewaySettings(api_keys=[KEY], max_input_chars=MAX_INPUT_CHARS, **settings))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, lifespan="on"))
    thread = threading.Thread(target=server.run, name=f"gateway:{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started, "the gateway did not start"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=60)


@pytest.fixture(scope="module")
def url(peer_server: TritonServer, peer_repository: Path) -> Iterator[str]:
    """The gateway over the peer models: `st` (embedder with prompts), `reranker`, `nli` (pairs), `nlirank`."""
    with serving(triton_url=peer_server.grpc_url, triton_http_url=peer_server.http_address, repository=str(peer_repository), shm_prefix="gwclients") as base:
        yield base


@pytest.fixture(scope="module")
def st(peer_models: dict[str, Path]) -> SentenceTransformer:
    return SentenceTransformer(str(peer_models["st"]), device="cpu")


def cross_encoder(path: Path) -> CrossEncoder:
    return CrossEncoder(str(path), device="cpu", max_length=32)


# --- TEI clients ---------------------------------------------------------------------------------
def test_huggingface_hub_feature_extraction(url: str, st: SentenceTransformer) -> None:
    client = InferenceClient(base_url=f"{url}/tei/st", api_key=KEY)
    one = client.feature_extraction(TEXTS[0])
    assert one.shape == (1, 32)  # TEI answers a bare array, also for one text
    np.testing.assert_allclose(one, st.encode(TEXTS[:1]), atol=1e-5)  # the default prompt, normalized
    np.testing.assert_allclose(client.feature_extraction(TEXTS), st.encode(TEXTS), atol=1e-5)
    small = client.feature_extraction(TEXTS, prompt_name="query", dimensions=PEER_MATRYOSHKA[0])
    want = st.encode(TEXTS, prompt_name="query", normalize_embeddings=True, truncate_dim=PEER_MATRYOSHKA[0])
    np.testing.assert_allclose(small, want, atol=1e-5)
    with pytest.raises(HfHubHTTPError, match="not served") as missing:
        InferenceClient(base_url=f"{url}/tei/missing", api_key=KEY).feature_extraction("x")
    assert missing.value.response.status_code == 404
    with pytest.raises(HfHubHTTPError) as unauthorized:
        InferenceClient(base_url=f"{url}/tei/st", api_key="wrong").feature_extraction("x")
    assert unauthorized.value.response.status_code == 401


def test_openai_client_on_tei_openai_routes(url: str, st: SentenceTransformer) -> None:
    """TEI's OpenAI routes, as a team moving from TEI points the openai client (and LangChain's OpenAIEmbeddings) at
    its base URL + /v1: the path's model, whatever `model` says; /embeddings too; TEI's auto-truncation."""
    client = openai.OpenAI(base_url=f"{url}/tei/st/v1", api_key=KEY, max_retries=0)
    result = client.embeddings.create(model="any-name-tei-ignores", input=TEXTS)  # the client asks for base64
    np.testing.assert_allclose(np.array([d.embedding for d in result.data]), st.encode(TEXTS), atol=1e-5)
    assert [d.index for d in result.data] == list(range(len(TEXTS))) and result.model == "st"
    own = post(url, "/v1/embeddings", {"input": TEXTS, "model": "st"}).json()  # the default prompt's tokens included
    assert result.usage.prompt_tokens == result.usage.total_tokens == own["usage"]["total_tokens"] > 0
    floats = client.embeddings.create(model="st", input=TEXTS[1], encoding_format="float",
                                      dimensions=PEER_MATRYOSHKA[0])
    want = st.encode(TEXTS[1:2], normalize_embeddings=True, truncate_dim=PEER_MATRYOSHKA[0])
    np.testing.assert_allclose([floats.data[0].embedding], want, atol=1e-5)
    plain = post(url, "/tei/st/embeddings", {"input": TEXTS[0]}).json()
    np.testing.assert_allclose([plain["data"][0]["embedding"]], st.encode(TEXTS[:1]), atol=1e-5)
    over = "film " * (MAX_INPUT_CHARS // 4)  # over GATEWAY_MAX_INPUT_CHARS: TEI truncates, /v1/embeddings refuses
    assert post(url, "/tei/st/v1/embeddings", {"input": over}).status_code == 200
    assert post(url, "/v1/embeddings", {"input": over, "model": "st"}).status_code == 413
    with pytest.raises(openai.NotFoundError) as missing:
        openai.OpenAI(base_url=f"{url}/tei/missing/v1", api_key=KEY, max_retries=0).embeddings.create(
            model="st", input="x")
    body = missing.value.body
    assert isinstance(body, dict) and body["code"] == 404 and body["type"] == "Validation"
    assert body["message"].startswith("model 'missing' is not served")


@pytest.mark.parametrize(
    ("path", "body", "headers", "status", "error_type"),
    [
        ("/tei/st/v1/embeddings", {"input": ""}, AUTH, 422, "Validation"),  # the OpenAI body's own validation
        ("/tei/st/embeddings", {"input": []}, AUTH, 422, "Validation"),  # (TEI: 400 Empty for an empty list)
        ("/tei/nli/v1/embeddings", {"input": "x"}, AUTH, 424, "Backend"),  # not an embedding model
        ("/tei/st/v1/embeddings", {"input": "x", "dimensions": 12}, AUTH, 422, "Validation"),
        ("/tei/st/v1/embeddings", {"input": "x", "encoding_format": "int8"}, AUTH, 422, "Validation"),
        ("/tei/st/v1/embeddings", {"input": "x"}, {}, 401, "Validation"),
        ("/tei/st/v1/embeddings", {"input": "x" * 3 * 1024 * 1024}, AUTH, 413, "Validation"),
    ],
)
def test_tei_openai_errors_have_tei_openai_shape(url: str, path: str, body: Any, headers: dict[str, str],
                                                 status: int, error_type: str) -> None:
    """TEI's OpenAICompatErrorResponse: {message, code, type}, the code equal to the status."""
    response = post(url, path, body, headers=headers)
    assert response.status_code == status, response.text
    assert response.json().keys() == {"message", "code", "type"}
    assert response.json()["code"] == status and response.json()["type"] == error_type and response.json()["message"]


def test_huggingface_hub_sentence_similarity(url: str, st: SentenceTransformer) -> None:
    """huggingface_hub posts the similarity body to the base URL (POST /tei/{model}); /similarity is TEI's route."""
    client = InferenceClient(base_url=f"{url}/tei/st", api_key=KEY)
    got = client.sentence_similarity(QUERY, other_sentences=DOCS)
    want = st.similarity(st.encode([QUERY]), st.encode(DOCS))[0].numpy()  # the default prompt, as TEI's /embed
    np.testing.assert_allclose(got, want, atol=1e-5)
    assert np.argmax(got) != np.argmin(got)  # the texts are not all alike to it
    body = {"inputs": {"source_sentence": QUERY, "sentences": DOCS}, "parameters": {"prompt_name": "query"}}
    queried = post(url, "/tei/st/similarity", body).json()
    want = st.similarity(st.encode([QUERY], prompt_name="query"), st.encode(DOCS, prompt_name="query"))[0].numpy()
    np.testing.assert_allclose(queried, want, atol=1e-5)


def test_huggingface_hub_text_classification(triton_server: TritonServer, python_repository: Path,
                                             tiny_classifier_dir: Path) -> None:
    texts = ["the film was great", "bad food and slow service"]
    tokenizer = AutoTokenizer.from_pretrained(tiny_classifier_dir)
    with torch.no_grad():
        logits = AutoModelForSequenceClassification.from_pretrained(tiny_classifier_dir).eval()(
            **tokenizer(texts, padding=True, return_tensors="pt")).logits
    probs = torch.softmax(logits, -1).numpy()
    settings = {"triton_url": triton_server.grpc_url, "triton_http_url": triton_server.http_address, "repository": str(python_repository), "shm_prefix": "gwclientcls"}
    with serving(**settings) as base:
        client = InferenceClient(base_url=f"{base}/tei/tinycls", api_key=KEY)
        for text, want in zip(texts, probs, strict=True):
            got = client.text_classification(text)
            order = np.argsort(-want)
            assert [p.label for p in got] == [LABELS[i] for i in order]  # every label, best first
            np.testing.assert_allclose([p.score for p in got], want[order], atol=1e-5)
        assert len(client.text_classification(texts[0], top_k=1)) == len(LABELS)  # parameters are ignored
        flat = httpx.post(f"{base}/tei/tinycls/predict", headers=AUTH, json={"inputs": texts[0]}).json()
        nested = httpx.post(f"{base}/tei/tinycls", headers=AUTH, json={"inputs": texts[0], "parameters": {}}).json()
        assert flat == nested[0] and isinstance(flat[0], dict)  # TEI's flat list; the Inference API's nesting


def test_langchain_huggingface_endpoint_embeddings(url: str, st: SentenceTransformer) -> None:
    """langchain-huggingface 1.2.1 (the last that takes a URL as `model`) in its own venv (huggingface_hub<2)."""
    assert LANGCHAIN_PYTHON.exists(), f"{LANGCHAIN_PYTHON} is missing: scripts/test makes it"
    script = (
        "import json, sys\n"
        "from langchain_huggingface import HuggingFaceEndpointEmbeddings\n"
        "url, key, texts = json.load(sys.stdin)\n"
        "embeddings = HuggingFaceEndpointEmbeddings(model=url, huggingfacehub_api_token=key)\n"
        "answer = {'documents': embeddings.embed_documents(texts), 'query': embeddings.embed_query(texts[0])}\n"
        "print(json.dumps(answer))\n"
    )
    done = subprocess.run([str(LANGCHAIN_PYTHON), "-c", script], input=json.dumps([f"{url}/tei/st", KEY, TEXTS]),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout)
    want = st.encode(TEXTS)
    np.testing.assert_allclose(answer["documents"], want, atol=1e-5)
    np.testing.assert_allclose(answer["query"], want[0], atol=1e-5)


def test_llama_index_text_embeddings_inference(url: str, st: SentenceTransformer) -> None:
    embed = TextEmbeddingsInference(model_name="st", base_url=f"{url}/tei/st", auth_token=KEY, embed_batch_size=2)
    np.testing.assert_allclose(embed.get_text_embedding_batch(TEXTS), st.encode(TEXTS), atol=1e-5)
    np.testing.assert_allclose(embed.get_query_embedding(QUERY), st.encode(QUERY), atol=1e-5)


# --- Cohere v2 ---------------------------------------------------------------------------------
def test_cohere_v2_embed(url: str, st: SentenceTransformer, peer_repository: Path) -> None:
    client = cohere.ClientV2(api_key=KEY, base_url=url)
    answer = client.embed(model="st", texts=TEXTS, input_type="search_query",
                          embedding_types=["float", "base64", "int8", "uint8", "binary", "ubinary"])
    got = answer.embeddings
    assert got.float_ and got.base64 and got.int8 and got.uint8 and got.binary and got.ubinary
    floats = np.asarray(got.float_, np.float32)
    np.testing.assert_allclose(floats, st.encode(TEXTS, prompt_name="query", normalize_embeddings=True), atol=1e-5)
    # base64 carries the very float32 numbers; the integer types are sentence-transformers' exact quantization
    # (int8 and uint8 on the ranges the build stored)
    decoded = np.stack([np.frombuffer(base64.b64decode(b), "<f4") for b in got.base64])
    assert decoded.tobytes() == floats.tobytes()
    ranges = stored_ranges(peer_repository, "st")[32]
    np.testing.assert_array_equal(got.int8, quantize_embeddings(floats, precision="int8", ranges=ranges))
    np.testing.assert_array_equal(got.uint8, quantize_embeddings(floats, precision="uint8", ranges=ranges))
    np.testing.assert_array_equal(got.ubinary, quantize_embeddings(floats, precision="ubinary"))
    np.testing.assert_array_equal(got.binary, quantize_embeddings(floats, precision="binary"))
    assert answer.texts == TEXTS and answer.id and billed_tokens(answer.meta) > 0
    documents = client.embed(model="st", texts=TEXTS, input_type="search_document", output_dimension=8)
    assert documents.embeddings.base64 is None and documents.embeddings.float_  # float only, the default
    np.testing.assert_allclose(documents.embeddings.float_, st.encode(
        TEXTS, prompt_name="passage", normalize_embeddings=True, truncate_dim=8), atol=1e-5)
    long = ["the film was good but the food was bad and slow " * 3]  # over max_seq_len: its start is cut
    st.tokenizer.truncation_side = "left"
    try:
        want = st.encode(long, prompt_name="query", normalize_embeddings=True)
    finally:
        st.tokenizer.truncation_side = "right"
    start = client.embed(model="st", texts=long, input_type="search_query", truncate="START").embeddings.float_
    assert start is not None
    np.testing.assert_allclose(start, want, atol=1e-5)
    with pytest.raises(ApiError) as refused:  # NONE: a text over max_seq_len is refused, not cut
        client.embed(model="st", texts=long, input_type="search_query", truncate="NONE")
    assert refused.value.status_code == 413


def test_cohere_v2_rerank(url: str, peer_models: dict[str, Path]) -> None:
    want = cross_encoder(peer_models["rerank"]).predict([(QUERY, d) for d in DOCS])
    answer = cohere.ClientV2(api_key=KEY, base_url=url).rerank(model="reranker", query=QUERY, documents=DOCS, top_n=3)
    top = np.argsort(-want, kind="stable")[:3].tolist()
    assert [r.index for r in answer.results] == top
    np.testing.assert_allclose([r.relevance_score for r in answer.results], want[top], atol=1e-5)
    assert answer.id and billed_tokens(answer.meta) > 0


def billed_tokens(meta: Any) -> float:
    return float(meta.billed_units.input_tokens)


# --- TEI over plain HTTP: shapes, options, errors --------------------------------------------------
def post(url: str, path: str, body: Any, **kwargs: Any) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, headers=kwargs.pop("headers", AUTH), **kwargs)


def test_tei_embed_options_and_truncation(url: str, st: SentenceTransformer) -> None:
    single = post(url, "/tei/st/embed", {"inputs": "bad food"}).json()
    assert len(single) == 1 and len(single[0]) == 32  # a bare array of one vector
    raw = np.asarray(post(url, "/tei/st/embed", {"inputs": TEXTS, "normalize": False}).json())
    assert np.abs(np.linalg.norm(raw, axis=1) - 1).max() > 1e-3  # TEI's normalize: false is honoured
    long = "the film was good but the food was bad and slow " * 6  # 294 characters, far over 24 tokens
    for direction in ("right", "left"):
        st.tokenizer.truncation_side = direction
        try:
            want = st.encode([long], prompt_name="query", normalize_embeddings=True)
        finally:
            st.tokenizer.truncation_side = "right"
        got = post(url, "/tei/st/embed", {"inputs": [long], "prompt_name": "query", "truncation_direction": direction})
        assert got.status_code == 200, got.text  # over max_seq_len and over GATEWAY_MAX_INPUT_CHARS: cut, not refused
        np.testing.assert_allclose(got.json(), want, atol=1e-5)
    refused = post(url, "/tei/st/embed", {"inputs": "film " * 30, "truncate": False})  # 30 tokens, 150 characters
    assert refused.status_code == 422 and refused.json()["error_type"] == "Validation"
    assert post(url, "/embed", {"model": "st", "inputs": long}).status_code == 413  # the gateway's own route refuses


def test_tei_predict_pairs_and_batches(url: str, peer_models: dict[str, Path]) -> None:
    pairs = [(QUERY, d) for d in DOCS[:3]]
    oracle = cross_encoder(peer_models["nli"])
    probs = oracle.predict(pairs, apply_softmax=True)
    logits = oracle.predict(pairs, activation_fn=torch.nn.Identity())

    def scores(predictions: list[dict[str, Any]]) -> list[float]:
        assert all(set(p) == {"score", "label"} for p in predictions)
        assert [p["score"] for p in predictions] == sorted((p["score"] for p in predictions), reverse=True)
        by_label = {p["label"]: p["score"] for p in predictions}
        return [by_label[label] for label in NLI_LABELS]

    single = post(url, "/tei/nli/predict", {"inputs": pairs[0]}).json()  # one pair: one flat list
    np.testing.assert_allclose(scores(single), probs[0], atol=1e-5)
    batch = post(url, "/tei/nli", {"inputs": pairs, "raw_scores": True}).json()  # the compat route, a batch
    np.testing.assert_allclose([scores(row) for row in batch], logits, atol=1e-4)
    mixed = post(url, "/tei/nli/predict", {"inputs": [[QUERY], pairs[0]]})
    assert mixed.status_code == 422 and mixed.json()["error_type"] == "Validation"


def test_tei_rerank_and_compat_route(url: str, peer_models: dict[str, Path]) -> None:
    want = cross_encoder(peer_models["rerank"]).predict([(QUERY, d) for d in DOCS])
    for path in ("/tei/reranker/rerank", "/tei/reranker"):
        ranks = post(url, path, {"query": QUERY, "texts": DOCS, "return_text": True, "unknown": 1}).json()
        assert [r["index"] for r in ranks] == np.argsort(-want, kind="stable").tolist()
        assert all(r["text"] == DOCS[r["index"]] for r in ranks)
        np.testing.assert_allclose([r["score"] for r in ranks], want[[r["index"] for r in ranks]], atol=1e-5)
    plain = post(url, "/tei/reranker/rerank", {"query": QUERY, "texts": DOCS[:2]}).json()
    assert all(set(r) == {"index", "score"} for r in plain)  # no `text` key without return_text
    st_compat = post(url, "/tei/st", {"inputs": "bad food"})
    assert st_compat.status_code == 200 and np.asarray(st_compat.json()).shape == (1, 32)


def test_tei_vertex_answers_each_instance_as_its_route(url: str, st: SentenceTransformer) -> None:
    """TEI's /vertex: every instance the body of the model's route, every prediction that route's answer."""
    embeds = [{"inputs": TEXTS[:3]}, {"inputs": "bad food", "normalize": False}, {"inputs": TEXTS[3:]}]
    predictions = post(url, "/tei/st/vertex", {"instances": embeds}).json()["predictions"]
    alone = [post(url, "/tei/st/embed", body).json() for body in embeds]
    assert len(predictions) == len(alone)
    for together, single in zip(predictions, alone, strict=True):  # batched together or alone: float rounding only
        np.testing.assert_allclose(together, single, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(predictions[0], st.encode(TEXTS[:3], normalize_embeddings=True), atol=1e-5)

    pairs = [{"inputs": [[QUERY, DOCS[0]], [QUERY, DOCS[1]]], "raw_scores": True}, {"inputs": [QUERY, DOCS[2]]}]
    assert post(url, "/tei/nli/vertex", {"instances": pairs}).json() == {
        "predictions": [post(url, "/tei/nli/predict", body).json() for body in pairs]}
    ranked = {"query": QUERY, "texts": DOCS, "return_text": True}
    assert post(url, "/tei/reranker/vertex", {"instances": [ranked]}).json() == {
        "predictions": [post(url, "/tei/reranker/rerank", ranked).json()]}
    assert post(url, "/tei/st/vertex", {"instances": []}).json() == {"predictions": []}


def test_tei_tokenize_decode_info_and_health(url: str, peer_models: dict[str, Path]) -> None:
    hf = AutoTokenizer.from_pretrained(peer_models["st"])
    tokens = post(url, "/tei/st/tokenize", {"inputs": "hello world"}).json()
    assert [t["id"] for t in tokens[0]] == hf("hello world")["input_ids"]
    decoded = post(url, "/tei/st/decode", {"ids": [t["id"] for t in tokens[0]]}).json()
    assert decoded == ["hello world"]

    info = {name: httpx.get(f"{url}/tei/{name}/info", headers=AUTH).json() for name in ("st", "nli", "reranker")}
    assert info["st"]["model_type"] == {"embedding": {"pooling": "mean"}}
    assert info["st"]["max_input_length"] == PEER_MAX_SEQ_LENGTH and info["nli"]["max_input_length"] == 32
    # a local folder by its name: the server's paths are not the client's business
    assert info["st"]["model_id"] == peer_models["st"].name and info["st"]["served_model_name"] == "st"
    classifier = info["nli"]["model_type"]["classifier"]
    assert classifier["id2label"] == {str(i): label for i, label in enumerate(NLI_LABELS)}
    assert classifier["label2id"] == {label: i for i, label in enumerate(NLI_LABELS)}
    assert set(info["reranker"]["model_type"]) == {"reranker"}
    assert info["st"]["version"] == TEI_VERSION and info["st"]["auto_truncate"] is True
    assert info["st"]["model_dtype"] == "float32"  # a CPU build

    health = httpx.get(f"{url}/tei/st/health")  # public, as TEI's own
    assert health.status_code == 200 and health.content == b""
    assert httpx.get(f"{url}/tei/missing/health").status_code == 404


@pytest.mark.parametrize(
    ("path", "body", "headers", "status", "error_type"),
    [
        ("/tei/missing/embed", {"inputs": "x"}, AUTH, 404, "Validation"),
        ("/tei/st/embed", {"inputs": ""}, AUTH, 400, "Empty"),
        ("/tei/st/embed", {"inputs": []}, AUTH, 400, "Empty"),
        ("/tei/st", {"inputs": ["a", ""]}, AUTH, 400, "Empty"),
        ("/tei/reranker/rerank", {"query": "q", "texts": []}, AUTH, 400, "Empty"),
        ("/tei/st/decode", {"ids": []}, AUTH, 400, "Empty"),
        ("/tei/st/rerank", {"query": "q", "texts": ["t"]}, AUTH, 424, "Backend"),
        ("/tei/st/embed", {"inputs": "x", "prompt_name": "nope"}, AUTH, 422, "Validation"),
        ("/tei/st/embed", {"inputs": "x", "dimensions": 12}, AUTH, 422, "Validation"),
        ("/tei/st/embed", {"inputs": "x", "normalize": "yes"}, AUTH, 422, "Validation"),
        ("/tei/st/embed", {"inputs": ["x"] * 2049}, AUTH, 422, "Validation"),
        ("/tei/st/embed", {"inputs": "x"}, {}, 401, "Validation"),  # the middleware's own errors too:
        ("/tei/st/embed", {"inputs": "x" * 3 * 1024 * 1024}, AUTH, 413, "Validation"),  # over the body limit
        ("/tei/st/embed_sparse", {"inputs": "x"}, AUTH, 424, "Backend"),  # no sparse output
        ("/tei/nli/embed_all", {"inputs": "x"}, AUTH, 424, "Backend"),  # a classifier: no per-token outputs
        ("/tei/st/similarity", {"inputs": {"source_sentence": "q", "sentences": []}}, AUTH, 400, "Empty"),
        ("/tei/st/similarity", {"inputs": {"source_sentence": "", "sentences": ["a"]}}, AUTH, 400, "Empty"),
        ("/tei/reranker/similarity", {"inputs": {"source_sentence": "q", "sentences": ["a"]}}, AUTH, 424, "Backend"),
        ("/tei/st", {"inputs": {"source_sentence": "q"}}, AUTH, 422, "Validation"),
        ("/tei/st/vertex", {"inputs": "x"}, AUTH, 422, "Validation"),  # no `instances`
        ("/tei/st/vertex", {"instances": [{"inputs": "x"}, {"inputs": 3}]}, AUTH, 422, "Validation"),
        ("/tei/st/vertex", {"instances": [{"inputs": "x"}, {"inputs": ""}]}, AUTH, 400, "Empty"),
        ("/tei/st/vertex", {"instances": [{"query": "q", "texts": ["t"]}]}, AUTH, 424, "Backend"),  # no reranker
        ("/tei/st/vertex", {"instances": [{"inputs": "x"}] * 2049}, AUTH, 422, "Validation"),
        ("/tei/reranker/vertex", {"instances": [{"inputs": "x"}]}, AUTH, 422, "Validation"),  # a /rerank body only
    ],
)
def test_tei_errors_have_tei_shape(url: str, path: str, body: Any, headers: dict[str, str], status: int,
                                   error_type: str) -> None:
    response = post(url, path, body, headers=headers)
    assert response.status_code == status, response.text
    error = response.json()
    assert set(error) == {"error", "error_type"} and error["error_type"] == error_type and error["error"]
    assert response.headers["x-request-id"]


def test_openapi_documents_the_new_bodies_with_examples() -> None:
    schemas = create_app(GatewaySettings()).openapi()["components"]["schemas"]
    for name in ("TeiEmbedRequest", "TeiPredictRequest", "TeiRerankRequest", "TeiTokenizeRequest", "TeiDecodeRequest",
                 "TeiEmbedSparseRequest", "TeiEmbedAllRequest", "TeiSimilarityInput", "TeiSimilarityParameters",
                 "TeiSparseValue", "TeiVertexRequest",
                 "TeiInfo", "TeiRank", "TeiPrediction", "TeiError", "TeiOpenAIError", "CohereEmbedV2Request", "CohereEmbeddings",
                 "CohereRerankV2Request", "CohereRerankV2Result", "CohereEmbedV2Response", "CohereRerankV2Response"):
        for field, value in schemas[name]["properties"].items():
            nested = "$ref" in value or "allOf" in value or field in ("model_type", "response_type")
            assert nested or "examples" in value, (name, field)


# --- a request's deadline and lane, as each client sets a header -------------------------------------------------
URGENT_BUT_WRONG = {"X-Priority": "urgent"}  # not a lane: the gateway's 400 shows the header reached it


def test_each_client_can_send_the_deadline_and_priority_headers(url: str) -> None:
    """How docs/api.md says to set X-Request-Timeout and X-Priority from each client, shown working: a request with
    good values is served, one with a value no lane has is refused with the gateway's 400."""
    good = {"X-Request-Timeout": "30", "X-Priority": "batch"}
    oai = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
    assert oai.embeddings.create(model="st", input=["hi"], extra_headers=good).data
    with pytest.raises(openai.BadRequestError, match="X-Priority"):
        oai.embeddings.create(model="st", input=["hi"], extra_headers=URGENT_BUT_WRONG)
    co = cohere.ClientV2(api_key=KEY, base_url=url)
    assert co.embed(model="st", texts=["hi"], input_type="search_query", embedding_types=["float"],
                    request_options={"additional_headers": good}).embeddings.float_
    with pytest.raises(cohere.errors.BadRequestError):
        co.embed(model="st", texts=["hi"], input_type="search_query", embedding_types=["float"],
                 request_options={"additional_headers": URGENT_BUT_WRONG})
    assert InferenceClient(base_url=f"{url}/tei/st", api_key=KEY, headers=good).feature_extraction("hi").size
    with pytest.raises(HfHubHTTPError) as refused:
        InferenceClient(base_url=f"{url}/tei/st", api_key=KEY, headers=URGENT_BUT_WRONG).feature_extraction("hi")
    assert refused.value.response.status_code == 422  # TEI's shape: the gateway's 400 invalid_request is TEI's 422
