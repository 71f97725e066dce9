"""Issue 23: the encoders teams deploy in 2026, built by the builder, served by a real tritonserver and the
gateway, and compared with their oracles (tiny random checkpoints made offline):

- XLM-R in bge-m3 shape (CLS, Normalize, 8,192 tokens) and in e5 shape (mean, 512, prompts) against
  `SentenceTransformer.encode`, with texts over 3,000 tokens, one over 8,192 and CJK text;
- ModernBERT (8,192 positions, 64-token local window) with texts longer than its window;
- SPLADE `SparseEncoder` folders in the ST 5 and ST 6 layouts: `/embed_sparse` against `SparseEncoder.encode`;
- bge-m3 lexical weights and ColBERT vectors against FlagEmbedding's BGEM3 math (its `_sparse_embedding`,
  `_process_token_weights`, `_colbert_embedding`, `_process_colbert_vecs`) in PyTorch: FlagEmbedding itself
  needs `datasets`, `peft` and `ir-datasets`, which the test environment does not carry;
- `/embed_all` against `last_hidden_state`: cosine >= 0.9999 per token;
- `/encode`: bge-m3's dense, lexical and ColBERT outputs from one execution of the model step, each equal to what
  its own route answers (checked against its oracle above) to 1e-6, at 8,192 tokens too.
One repository and one tritonserver for the session (tests/gateway/conftest.py), one gateway for the module."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import tritonclient.grpc as grpcclient
import numpy as np
import pytest
import torch
from sentence_transformers import SentenceTransformer, SparseEncoder
from transformers import AutoModel, AutoTokenizer

from devstack.tritonserver import TritonServer
from tests.fixtures.tiny_models import long_text
from tests.fixtures.waiting import until
from tests.gateway.conftest import running_gateway

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(600)]

CJK = ["안녕하세요 이 영화 정말 좋아요", "这个电影很好看 我很喜欢", "日本語の文章を検索するモデルです"]
SHORT = ["the movie was really good", "deep learning is a kind of machine learning"]


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


# The models, their repository and its tritonserver are session fixtures (tests/gateway/conftest.py), shared with
# test_response_models.py.
@pytest.fixture(scope="module")
def models(issue23_models: dict[str, Path]) -> dict[str, Path]:
    return issue23_models


@pytest.fixture(scope="module")
def repository(issue23_repository: Path) -> Path:
    return issue23_repository


@pytest.fixture(scope="module")
def triton(issue23_server: TritonServer) -> TritonServer:
    return issue23_server


@pytest.fixture(scope="module")
async def client(repository: Path, triton: TritonServer) -> AsyncIterator[httpx.AsyncClient]:
    async with running_gateway(triton.grpc_url, triton_http_url=triton.http_address, repository=str(repository), shm_prefix="gw23",
                               max_input_chars=200_000) as (_, http):
        yield http


def _tokens(model_dir: Path, text: str) -> int:
    return len(AutoTokenizer.from_pretrained(model_dir)(text)["input_ids"])


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


async def _post(client: httpx.AsyncClient, route: str, body: dict[str, Any]) -> Any:
    response = await client.post(route, json=body)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.fixture(scope="module")
def long_texts(models: dict[str, Path]) -> dict[str, str]:
    """Texts of the tiny XLM-R tokenizer's tokens: over 3,000 (served whole) and over 8,192 (cut)."""
    words = 700
    while _tokens(models["m3"], long_text(words, seed=1)) < 3000:
        words += 100
    return {"3k": long_text(words, seed=1), "over": long_text(words * 3, seed=2)}


async def test_xlmr_bge_m3_shape_equals_sentence_transformers(client: httpx.AsyncClient, models: dict[str, Path],
                                                             long_texts: dict[str, str]) -> None:
    texts = [*SHORT, *CJK, long_texts["3k"]]
    body = await _post(client, "/embed", {"model": "m3", "inputs": texts})
    want = SentenceTransformer(str(models["m3"]), device="cpu").encode(texts)  # CLS, Normalize, 8,192 tokens
    assert _cosines(body["embeddings"], want).min() >= 0.99999
    lengths = [_tokens(models["m3"], t) for t in texts]
    assert 3000 < lengths[-1] < 8192 and body["usage"]["tokens"] == sum(lengths)  # served whole


@pytest.mark.slow
async def test_xlmr_bge_m3_shape_cuts_a_text_over_8192_tokens(client: httpx.AsyncClient, models: dict[str, Path],
                                                             long_texts: dict[str, str]) -> None:
    """Slow (PyTorch runs 8,192 tokens on the CPU): `pytest -m slow tests/gateway/test_long_sparse_vectors.py`."""
    texts = [SHORT[0], long_texts["over"]]
    body = await _post(client, "/embed", {"model": "m3", "inputs": texts})
    want = SentenceTransformer(str(models["m3"]), device="cpu").encode(texts)
    assert _cosines(body["embeddings"], want).min() >= 0.99999
    assert _tokens(models["m3"], texts[1]) > 8192  # cut at 8,192, as sentence-transformers cuts it
    assert body["usage"]["tokens"] == _tokens(models["m3"], texts[0]) + 8192
    response = await client.post("/embed", json={"model": "m3", "inputs": texts, "truncate": False})
    assert response.status_code == 413 and response.json()["error"]["type"] == "input_too_long"


async def test_xlmr_e5_shape_equals_sentence_transformers(client: httpx.AsyncClient, models: dict[str, Path],
                                                         long_texts: dict[str, str]) -> None:
    texts = [*SHORT, *CJK, long_texts["3k"]]
    body = await _post(client, "/embed", {"model": "e5", "inputs": texts, "prompt_name": "query"})
    want = SentenceTransformer(str(models["e5"]), device="cpu").encode(texts, prompt_name="query")  # mean, 512
    assert _cosines(body["embeddings"], want).min() >= 0.99999


async def test_modernbert_beyond_its_local_window(client: httpx.AsyncClient, models: dict[str, Path]) -> None:
    texts = [long_text(300, seed=3), long_text(1500, seed=4), *SHORT]
    lengths = [_tokens(models["mb"], t) for t in texts]
    assert 64 < lengths[0] < 8192 and 2000 < lengths[1] < 8192  # longer than the 64-token sliding window
    body = await _post(client, "/embed", {"model": "mb", "inputs": texts})
    want = SentenceTransformer(str(models["mb"]), device="cpu").encode(texts)
    assert _cosines(body["embeddings"], want).min() >= 0.99999


@pytest.mark.parametrize("name", ["splade5", "splade6"])
async def test_embed_sparse_equals_sparse_encoder(client: httpx.AsyncClient, models: dict[str, Path],
                                                  name: str) -> None:
    texts = [*SHORT, *CJK, "good " * 200]  # the last one cut at 128 tokens
    body = await _post(client, "/embed_sparse", {"model": name, "inputs": texts})
    want = SparseEncoder(str(models[name]), device="cpu").encode(texts, convert_to_tensor=True).to_dense().numpy()
    for got, row in zip(body, want):
        indices = [item["index"] for item in got]
        assert indices == sorted(indices) and indices == np.flatnonzero(row).tolist()
        values = np.array([item["value"] for item in got])
        # 1e-3 relative; values near 0 (log1p of a logit near 0) differ by float32 rounding (~3e-6) instead
        np.testing.assert_allclose(values, row[indices], rtol=1e-3, atol=1e-5)
    assert 0 < len(body[0]) < want.shape[1]  # sparse, and not empty


def _flag_m3(model_dir: Path, texts: list[str]) -> tuple[list[dict[int, float]], list[np.ndarray]]:
    """FlagEmbedding's BGEM3 inference math (FlagEmbedding 1.4.2, encoder_only/m3.py and its modeling.py):
    lexical weights relu(sparse_linear(h)) per token, max per token id, cls/eos/pad/unk and zeros dropped;
    ColBERT vectors normalize(colbert_linear(h[:, 1:])) of the real tokens."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir).eval()
    sparse = torch.nn.Linear(model.config.hidden_size, 1)
    sparse.load_state_dict(torch.load(model_dir / "sparse_linear.pt", weights_only=True))
    colbert = torch.nn.Linear(model.config.hidden_size, model.config.hidden_size)
    colbert.load_state_dict(torch.load(model_dir / "colbert_linear.pt", weights_only=True))
    unused = {tokenizer.convert_tokens_to_ids(tokenizer.special_tokens_map[t])
              for t in ("cls_token", "eos_token", "pad_token", "unk_token") if t in tokenizer.special_tokens_map}
    weights_out, colbert_out = [], []
    with torch.inference_mode():
        for text in texts:
            batch = tokenizer([text], truncation=True, max_length=8192, return_tensors="pt")
            hidden = model(**batch).last_hidden_state
            token_weights = torch.relu(sparse(hidden)).squeeze(-1)[0].numpy()
            result: dict[int, float] = defaultdict(int)
            for w, idx in zip(token_weights, batch["input_ids"][0].tolist()):
                if idx not in unused and w > 0 and w > result[idx]:
                    result[idx] = float(w)
            weights_out.append(dict(result))
            vecs = torch.nn.functional.normalize(colbert(hidden[:, 1:]), dim=-1)[0].numpy()
            colbert_out.append(vecs[: int(batch["attention_mask"].sum()) - 1])
    return weights_out, colbert_out


async def test_bge_m3_lexical_weights_and_colbert_vectors(client: httpx.AsyncClient, models: dict[str, Path],
                                                          long_texts: dict[str, str]) -> None:
    texts = [*SHORT, *CJK, "good good movie movie", long_texts["3k"]]
    want_weights, want_colbert = _flag_m3(models["m3"], texts)
    sparse = await _post(client, "/embed_sparse", {"model": "m3", "inputs": texts})
    for got, want in zip(sparse, want_weights):
        assert [item["index"] for item in got] == sorted(want)
        np.testing.assert_allclose([item["value"] for item in got], [want[i] for i in sorted(want)], rtol=1e-3,
                                   atol=1e-5)
    multi = await _post(client, "/embed_multi_vector", {"model": "m3", "inputs": texts})
    for got, want in zip(multi, want_colbert):
        assert np.asarray(got).shape == want.shape
        assert _cosines(got, want).min() >= 0.9999


@pytest.mark.parametrize("name", ["m3", "e5", "mb"])
async def test_embed_all_equals_last_hidden_state(client: httpx.AsyncClient, models: dict[str, Path],
                                                  long_texts: dict[str, str], name: str) -> None:
    limit = {"m3": 8192, "e5": 512, "mb": 8192}[name]
    texts = [*SHORT, CJK[0], long_texts["3k"] if name != "mb" else long_text(800, seed=5)]
    body = await _post(client, "/embed_all", {"model": name, "inputs": texts})
    tokenizer = AutoTokenizer.from_pretrained(models[name])
    model = AutoModel.from_pretrained(models[name]).eval()
    with torch.inference_mode():
        for got, text in zip(body, texts):
            batch = tokenizer([text], truncation=True, max_length=limit, return_tensors="pt")
            want = model(**batch).last_hidden_state[0].numpy()
            assert np.asarray(got).shape == want.shape  # every token, specials included
            assert _cosines(got, want).min() >= 0.9999


def _same_sparse(got: list[list[dict[str, float]]], want: list[list[dict[str, float]]]) -> None:
    assert [[i["index"] for i in row] for row in got] == [[i["index"] for i in row] for row in want]
    np.testing.assert_allclose([i["value"] for row in got for i in row], [i["value"] for row in want for i in row],
                               rtol=1e-5, atol=1e-6)


async def test_tei_routes_serve_sparse_and_per_token_vectors(client: httpx.AsyncClient) -> None:
    """TEI's /embed_sparse and /embed_all under a model's base URL answer what the gateway's own routes do (checked
    against their oracles above); TEI's POST / of a SPLADE model is /embed_sparse, and /info says so."""
    texts = [*SHORT, CJK[0]]
    for name in ("splade5", "m3"):  # SPLADE rows, bge-m3's lexical weights
        want = await _post(client, "/embed_sparse", {"model": name, "inputs": texts})
        _same_sparse(await _post(client, f"/tei/{name}/embed_sparse", {"inputs": texts}), want)
    _same_sparse(await _post(client, "/tei/splade5", {"inputs": texts}),
                 await _post(client, "/embed_sparse", {"model": "splade5", "inputs": texts}))
    want = await _post(client, "/embed_all", {"model": "e5", "inputs": texts})
    got = await _post(client, "/tei/e5/embed_all", {"inputs": texts, "truncation_direction": "Right"})
    assert [len(row) for row in got] == [len(row) for row in want]
    for got_row, want_row in zip(got, want):
        assert _cosines(got_row, want_row).min() >= 0.99999
    info = (await client.get("/tei/splade5/info")).json()
    assert info["model_type"] == {"embedding": {"pooling": "splade"}}
    for path in ("/tei/e5/embed_sparse", "/tei/splade5/embed_all"):
        response = await client.post(path, json={"inputs": ["hello"]})
        assert response.status_code == 424, (path, response.text)
        assert response.json()["error_type"] == "Backend"


async def test_outputs_a_model_lacks_are_424(client: httpx.AsyncClient) -> None:
    for route, name in (("/embed_sparse", "e5"), ("/embed_multi_vector", "e5"), ("/embed_all", "splade5"),
                        ("/embed_sparse", "mb")):
        response = await client.post(route, json={"model": name, "inputs": ["hello"]})
        assert response.status_code == 424, (route, name, response.text)
        assert name in response.json()["error"]["message"]
    response = await client.post("/embed", json={"model": "splade5", "inputs": ["hello"]})
    assert response.status_code == 400 and response.json()["error"]["type"] == "wrong_task"
    cards = {c["id"]: c for c in (await client.get("/v1/models")).json()["data"]}
    assert cards["m3"]["token_outputs"] == ["token_embeddings", "token_weights", "colbert_vectors"]
    assert cards["splade5"]["task"] == "sparse-embed" and cards["splade5"]["token_outputs"] == []


async def test_ensemble_pipeline_serves_splade_rows_but_not_per_token_outputs(
        client: httpx.AsyncClient, triton: TritonServer) -> None:
    """GATEWAY_PIPELINE=ensemble (or a tokenizer the gateway cannot read): SPLADE rows come through Triton's
    ensemble, equal to the scheduler's; per-token outputs need the scheduler pipeline (501)."""
    texts = [*SHORT, CJK[1]]
    want = await _post(client, "/embed_sparse", {"model": "splade5", "inputs": texts})
    async with running_gateway(triton.grpc_url, triton_http_url=triton.http_address, pipeline="ensemble", shm_prefix="gw23e") as (_, http):
        got = await _post(http, "/embed_sparse", {"model": "splade5", "inputs": texts})
        assert [[i["index"] for i in row] for row in got] == [[i["index"] for i in row] for row in want]
        np.testing.assert_allclose([i["value"] for row in got for i in row], [i["value"] for row in want for i in row],
                                   rtol=1e-5)
        for route, name in (("/embed_all", "e5"), ("/embed_sparse", "m3"), ("/embed_multi_vector", "m3")):
            response = await http.post(route, json={"model": name, "inputs": ["hello"]})
            assert response.status_code == 501 and response.json()["error"]["type"] == "pipeline_unsupported"


def _executions(triton: TritonServer, step: str) -> int:
    stats = grpcclient.InferenceServerClient(triton.grpc_url).get_inference_statistics(step, as_json=True)
    return sum(int(entry.get("execution_count", 0)) for entry in stats["model_stats"])


async def test_encode_gives_every_bge_m3_output_from_one_forward_pass(
        client: httpx.AsyncClient, triton: TritonServer, long_texts: dict[str, str]) -> None:
    texts = [*SHORT, CJK[0], "good good movie movie", long_texts["over"]]  # the last is cut at 8,192 tokens
    body = await _post(client, "/encode", {"model": "m3", "inputs": texts})
    assert None not in body.values()
    embedded = await _post(client, "/embed", {"model": "m3", "inputs": texts})
    np.testing.assert_allclose(body["dense"], embedded["embeddings"], rtol=0, atol=1e-6)
    assert body["usage"] == embedded["usage"]  # billed once
    sparse = await _post(client, "/embed_sparse", {"model": "m3", "inputs": texts})
    assert [[i["index"] for i in row] for row in body["sparse"]] == [[i["index"] for i in row] for row in sparse]
    np.testing.assert_allclose([i["value"] for row in body["sparse"] for i in row],
                               [i["value"] for row in sparse for i in row], rtol=0, atol=1e-6)
    multi = await _post(client, "/embed_multi_vector", {"model": "m3", "inputs": texts})
    assert [len(v) for v in body["multi_vector"]] == [len(v) for v in multi] and len(multi[-1]) == 8191
    for got, want in zip(body["multi_vector"], multi):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)

    # Triton counts an execution once it has answered: each wait ends on a later request's own execution, which
    # the instance starts after the ones before it are counted.
    small = {"model": "m3", "inputs": [*SHORT, CJK[1]]}  # one batch
    for routes, executions in ((["/encode"], 1), (["/embed", "/embed_sparse", "/embed_multi_vector"], 3)):
        before = _executions(triton, "m3_onnx")
        for route in [*routes, "/embed"]:
            await _post(client, route, small)
        await until(lambda: _executions(triton, "m3_onnx") - before >= executions + 1, "the last /embed's execution")
        assert _executions(triton, "m3_onnx") - before == executions + 1


async def test_encode_answers_what_is_asked_and_424_for_what_a_model_lacks(client: httpx.AsyncClient) -> None:
    texts = [*SHORT, CJK[2]]
    body = await _post(client, "/encode", {"model": "m3", "inputs": texts, "outputs": ["sparse", "multi_vector"]})
    assert body["dense"] is None and len(body["sparse"]) == len(body["multi_vector"]) == 3
    body = await _post(client, "/encode", {"model": "e5", "inputs": texts, "outputs": ["dense"], "dimensions": 32})
    assert np.asarray(body["dense"]).shape == (3, 32)
    _same_sparse((await _post(client, "/encode", {"model": "splade5", "inputs": texts, "outputs": ["sparse"]}))["sparse"],
                 await _post(client, "/embed_sparse", {"model": "splade5", "inputs": texts}))
    for name, outputs, lacks in (("e5", ["dense", "sparse"], "sparse"), ("splade5", ["dense"], "dense"),
                                 ("mb", ["multi_vector"], "multi_vector")):
        response = await client.post("/encode", json={"model": name, "inputs": texts, "outputs": outputs})
        assert response.status_code == 424, response.text
        assert f"has no {lacks} output" in response.json()["error"]["message"]
