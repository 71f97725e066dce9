"""Issue 54: late chunking (`chunks`) and long inputs chunked and pooled (`truncate: "chunk"`), on issue 23's
tiny XLM-R (bge-m3 shape: 8,192 tokens, CLS; e5 shape: 512 tokens, mean, prompts) and ModernBERT (8,192) models
served by a real tritonserver, against PyTorch:

- late chunking: `last_hidden_state` of the whole text (prompt included), averaged over the tokens whose
  characters (the Hugging Face tokenizer's offset mapping) overlap each chunk, special tokens left out;
- chunked long inputs: the same windows (content tokens cut every max_seq_len - 2 - overlap tokens, <s> and </s>
  around each) run through sentence-transformers' Transformer and Pooling modules, combined as the mean weighted
  by each window's tokens, then normalized.

The gateway of this module chunks long inputs by default (GATEWAY_LONG_INPUTS=chunk) with an overlap of 16."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import torch
from openai import AsyncOpenAI
from sentence_transformers import SentenceTransformer
from transformers import AutoModel, AutoTokenizer

from devstack.tritonserver import TritonServer
from tests.fixtures.tiny_models import long_text
from tests.gateway.conftest import running_gateway

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(600)]

OVERLAP = 16
MAX_CHUNKED_TOKENS = 12000
CJK = "这个电影很好看，我很喜欢。日本語の文章を検索するモデルです。안녕하세요 이 영화 정말 좋아요"


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def client(issue23_repository: Path, issue23_server: TritonServer) -> AsyncIterator[httpx.AsyncClient]:
    triton = issue23_server
    async with running_gateway(triton.grpc_url, triton_http_url=triton.http_address, repository=str(issue23_repository),
                               shm_prefix="gw54", max_input_chars=200_000, long_inputs="chunk",
                               chunk_overlap_tokens=OVERLAP, max_chunked_tokens=MAX_CHUNKED_TOKENS) as (_, http):
        yield http


async def _post(client: httpx.AsyncClient, route: str, body: dict[str, Any], status: int = 200) -> Any:
    response = await client.post(route, json=body)
    assert response.status_code == status, response.text
    return response.json()


def _cosines(a: Any, b: Any) -> np.ndarray:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))


def late_chunking_oracle(model_dir: Path, text: str, spans: list[list[int]], prompt: str = "") -> np.ndarray:
    """Each chunk's mean of PyTorch's last_hidden_state over the tokens whose offsets overlap it."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    encoded = tokenizer(prompt + text, return_offsets_mapping=True, return_special_tokens_mask=True,
                        return_tensors="pt")
    offsets = encoded.pop("offset_mapping")[0].numpy() - len(prompt)
    special = encoded.pop("special_tokens_mask")[0].numpy().astype(bool)
    with torch.no_grad():
        hidden = AutoModel.from_pretrained(model_dir).eval()(**encoded).last_hidden_state[0].numpy()
    starts, ends = offsets[:, 0], np.maximum(offsets[:, 1], offsets[:, 0] + 1)
    return np.stack([hidden[~special & (starts < end) & (ends > start)].mean(0) for start, end in spans])


def chunked_oracle(model_dir: Path, text: str, window: int, overlap: int = OVERLAP) -> np.ndarray:
    """The token-weighted mean of the pooled vectors of `text`'s windows, normalized."""
    st = SentenceTransformer(str(model_dir), device="cpu")
    ids = AutoTokenizer.from_pretrained(model_dir)(text, add_special_tokens=False)["input_ids"]
    head, tail = [st.tokenizer.cls_token_id], [st.tokenizer.sep_token_id]
    room = window - 2
    vectors, weights = [], []
    for start in range(0, max(len(ids) - overlap, 1), room - overlap):
        row = torch.tensor([head + ids[start:start + room] + tail])
        with torch.no_grad():
            features = st[1](st[0]({"input_ids": row, "attention_mask": torch.ones_like(row)}))
        vectors.append(features["sentence_embedding"][0].numpy())
        weights.append(row.shape[1])
    mean = np.average(np.stack(vectors), axis=0, weights=weights)
    return mean / np.linalg.norm(mean)


def _spans(text: str, pieces: int) -> list[list[int]]:
    """`pieces` chunks tiling `text`, cut anywhere (inside words and characters' tokens)."""
    bounds = np.linspace(0, len(text), pieces + 1).astype(int)
    return [[int(a), int(b)] for a, b in zip(bounds, bounds[1:])]


async def test_late_chunking_with_a_prompt_and_cjk(client: httpx.AsyncClient, issue23_models: dict[str, Path]) -> None:
    """e5 shape with its `query: ` prompt: offsets are the user's text's, chunks cut tokens and CJK characters."""
    texts = ["the movie was really good. deep learning is a kind of machine learning. " * 3, CJK]
    chunks = [_spans(texts[0], 5), [[0, 5], [5, 13], [13, 30], [30, len(CJK)]]]
    body = await _post(client, "/embed", {"model": "e5", "inputs": texts, "chunks": chunks, "prompt_name": "query"})
    tokenizer = AutoTokenizer.from_pretrained(issue23_models["e5"])
    assert body["usage"]["tokens"] == sum(len(tokenizer("query: " + t)["input_ids"]) for t in texts)
    for text, spans, got in zip(texts, chunks, body["embeddings"]):
        want = late_chunking_oracle(issue23_models["e5"], text, spans, prompt="query: ")
        assert len(got) == len(spans) and _cosines(got, want).min() >= 0.9999
        assert np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)  # normalized as e5 was trained


async def test_late_chunking_with_the_openai_client(client: httpx.AsyncClient, issue23_models: dict[str, Path]) -> None:
    texts = ["deep learning is a kind of machine learning", CJK]
    chunks = [[[0, 13], [14, 43]], [[0, 8], [8, len(CJK)]]]
    openai = AsyncOpenAI(base_url="http://gateway/v1", api_key="none", http_client=client)  # base64, decoded
    answer = await openai.embeddings.create(model="m3", input=texts, extra_body={"chunks": chunks})
    data = answer.data
    assert [(d.index, d.input_index, d.chunk_index) for d in data] == [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
    for i, (text, spans) in enumerate(zip(texts, chunks)):
        got = [d.embedding for d in data if d.input_index == i]
        assert _cosines(got, late_chunking_oracle(issue23_models["m3"], text, spans)).min() >= 0.9999


async def test_late_chunking_refusals(client: httpx.AsyncClient, issue23_models: dict[str, Path]) -> None:
    text = "the movie was really good"
    for chunks in ([[[0, 3]], [[0, 3]]], [[[3, 3]]], [[[0, 99]]]):  # a list per input; empty; past the end
        body = await _post(client, "/embed", {"model": "e5", "inputs": text, "chunks": chunks}, 400)
        assert "chunk" in body["error"]["message"]
    # ModernBERT's WordPiece tokenizer leaves spaces out of its tokens (e5's SentencePiece keeps them)
    body = await _post(client, "/embed", {"model": "mb", "inputs": text, "chunks": [[[0, 3], [3, 4]]]}, 400)
    assert "chunk 1 of input 0 ([3, 4]) covers no token" in body["error"]["message"]
    long = long_text(800, seed=5)
    body = await _post(client, "/embed", {"model": "e5", "inputs": long, "chunks": [[[0, 10]]]}, 413)
    assert "window of 512" in body["error"]["message"] and body["error"]["type"] == "input_too_long"


async def test_long_inputs_chunked_by_default(client: httpx.AsyncClient, issue23_models: dict[str, Path]) -> None:
    """e5 (512 tokens): a text of some 1,500 tokens in windows with an overlap, against the same windows in PyTorch;
    `truncate: true` still truncates, `false` still refuses, and a short text is its own one window."""
    long, short = long_text(350, seed=6), "the movie was really good"
    body = await _post(client, "/embed", {"model": "e5", "inputs": [long, short]})
    want = [chunked_oracle(issue23_models["e5"], text, 512) for text in (long, short)]
    assert _cosines(body["embeddings"], want).min() >= 0.9999
    tokens = len(AutoTokenizer.from_pretrained(issue23_models["e5"])(long, add_special_tokens=False)["input_ids"])
    windows = len(range(0, tokens - OVERLAP, 510 - OVERLAP))
    assert windows >= 3 and body["usage"]["tokens"] == tokens + 2 * windows + (windows - 1) * OVERLAP + (
        len(AutoTokenizer.from_pretrained(issue23_models["e5"])(short)["input_ids"]))
    truncated = await _post(client, "/embed", {"model": "e5", "inputs": [long], "truncate": True})
    assert truncated["usage"]["tokens"] == 512 and _cosines(truncated["embeddings"], want[:1])[0] < 0.9999
    await _post(client, "/embed", {"model": "e5", "inputs": [long], "truncate": False}, 413)
    plain = await _post(client, "/embed", {"model": "e5", "inputs": [short], "truncate": True})
    assert _cosines(plain["embeddings"], body["embeddings"][1:])[0] >= 0.99999


async def test_long_inputs_on_v1_embeddings_and_their_bound(client: httpx.AsyncClient,
                                                            issue23_models: dict[str, Path]) -> None:
    long = long_text(350, seed=7)
    body = await _post(client, "/v1/embeddings", {"model": "e5", "input": long, "truncate": "chunk",
                                                  "input_type": "query", "encoding_format": "float"})
    want = chunked_oracle(issue23_models["e5"], "query: " + long, 512)
    assert _cosines([body["data"][0]["embedding"]], [want])[0] >= 0.9999
    over = await _post(client, "/embed", {"model": "e5", "inputs": [long] * 8, "truncate": "chunk"}, 413)
    message = over["error"]["message"]
    assert "GATEWAY_MAX_CHUNKED_TOKENS" in message and f"{MAX_CHUNKED_TOKENS:,}" in message


@pytest.mark.parametrize("name", ["m3", pytest.param("mb", marks=pytest.mark.slow)])
async def test_late_chunking_at_several_thousand_tokens(client: httpx.AsyncClient, issue23_models: dict[str, Path],
                                                        name: str) -> None:
    """XLM-R (bge-m3 shape) and ModernBERT (slow), documents of 3,000-8,000 tokens with CJK in them."""
    text = long_text(900, seed=8) + " " + CJK * 10 + " " + long_text(300, seed=9)
    tokens = len(AutoTokenizer.from_pretrained(issue23_models[name])(text)["input_ids"])
    assert 3000 < tokens <= 8192
    spans = _spans(text, 37)
    body = await _post(client, "/embed", {"model": name, "inputs": text, "chunks": [spans]})
    assert body["usage"]["tokens"] == tokens
    want = late_chunking_oracle(issue23_models[name], text, spans)
    assert _cosines(body["embeddings"][0], want).min() >= 0.9999


@pytest.mark.slow
async def test_long_inputs_of_bge_m3_shape_past_8192_tokens(client: httpx.AsyncClient,
                                                            issue23_models: dict[str, Path]) -> None:
    text = long_text(2200, seed=10)  # some 9,500 tokens: two windows
    body = await _post(client, "/embed", {"model": "m3", "inputs": text, "truncate": "chunk"})
    assert _cosines(body["embeddings"], [chunked_oracle(issue23_models["m3"], text, 8192)])[0] >= 0.9999
