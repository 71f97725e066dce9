"""int8, uint8, binary and ubinary embeddings on /embed and /v1/embeddings (the openai client's `extra_body`), served
by a real tritonserver from the builder's repository: the integers are sentence-transformers'
`quantize_embeddings(..., ranges=<the ranges the build stored>)` of the gateway's own float answer, and of
sentence-transformers' encode. Cohere's `embedding_types` are checked with the cohere client in test_peer_clients.py;
the real all-MiniLM-L6-v2 and its retrieval quality in test_int8_minilm.py (slow)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from sentence_transformers import SentenceTransformer
from sentence_transformers.quantization import quantize_embeddings

from devstack.tritonserver import TritonServer
from tests.fixtures.repository import PYTHON_CPU, build_repository, stored_ranges
from tests.fixtures.trained_models import all_minilm_l6_v2
from tests.fixtures.triton import serving
from tests.gateway.conftest import PEER_MATRYOSHKA, running_gateway

pytestmark = pytest.mark.anyio
TEXTS = ["the movie was great", "bad food", "hello world " * 12, "a", "안녕하세요 영화", "Поезд отправляется"]
TYPES = ("int8", "uint8", "binary", "ubinary")


def assert_buckets_of(got: np.ndarray, floats: np.ndarray, ranges: np.ndarray, precision: str) -> None:
    """`got` is quantize_embeddings of `floats` computed elsewhere (within 1e-5): equal, but where a float lies
    within that of a bucket's edge, where it may be the next bucket."""
    want = quantize_embeddings(floats, precision=precision, ranges=ranges)
    starts, steps = ranges[0], (ranges[1] - ranges[0]) / 255
    position = (floats - starts) / steps
    near_edge = np.abs(position - np.round(position)) * steps < 1e-5
    differ = got != want
    assert not (differ & ~near_edge).any(), np.argwhere(differ & ~near_edge)
    assert np.abs(got.astype(np.int16) - want.astype(np.int16)).max(initial=0) <= 1


async def test_embed_types_are_quantize_embeddings_on_the_stored_ranges(
    peer_server: TritonServer, peer_repository: Path, peer_models: dict[str, Path]
) -> None:
    ranges = stored_ranges(peer_repository, "st")
    assert sorted(ranges) == [*PEER_MATRYOSHKA, 32]  # one [min; max] per width a request may ask for
    oracle = SentenceTransformer(str(peer_models["st"]), device="cpu")
    async with running_gateway(peer_server.grpc_url, repository=str(peer_repository), shm_prefix="gwint8") as (
            _, client):
        card = (await client.get("/v1/models/st")).json()
        assert card["embedding_types"] == ["float", *TYPES]
        for width in (32, PEER_MATRYOSHKA[0]):
            dims = {} if width == 32 else {"dimensions": width}
            floats = np.asarray((await client.post("/embed", json={"inputs": TEXTS, **dims})).json()["embeddings"],
                                np.float32)
            encoded = oracle.encode(TEXTS, normalize_embeddings=True, truncate_dim=width, prompt_name="passage")
            for precision in TYPES:
                answer = (await client.post("/embed", json={"inputs": TEXTS, "embedding_type": precision, **dims})).json()
                assert answer["dimensions"] == width
                got = np.asarray(answer["embeddings"])
                want = quantize_embeddings(floats, precision=precision, ranges=ranges[width])
                assert got.shape == want.shape and (got == want).all(), (precision, width)
                if precision in ("int8", "uint8"):
                    assert_buckets_of(got, encoded, ranges[width], precision)
                else:
                    assert (got == quantize_embeddings(encoded, precision=precision)).all()


async def test_openai_client_sends_the_embedding_type_with_extra_body(
    peer_server: TritonServer, peer_repository: Path
) -> None:
    ranges = stored_ranges(peer_repository, "st")
    async with running_gateway(peer_server.grpc_url, repository=str(peer_repository), shm_prefix="gwint8oa") as (
            app, client):
        floats = (await client.post("/v1/embeddings", json={"model": "st", "input": TEXTS})).json()["data"]
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway/v1")
        oa = openai.AsyncOpenAI(base_url="http://gateway/v1", api_key="unused", max_retries=0, http_client=http)
        for precision in ("int8", "uint8"):
            answer = await oa.embeddings.create(model="st", input=TEXTS, encoding_format="float",
                                                extra_body={"embedding_type": precision})
            want = quantize_embeddings(np.asarray([d["embedding"] for d in floats], np.float32), precision=precision,
                                       ranges=ranges[32])
            assert [d.embedding for d in answer.data] == want.tolist()
        # the client's default, base64, would decode the bytes as float32: refused instead of garbled
        with pytest.raises(openai.BadRequestError, match="encoding_format"):
            await oa.embeddings.create(model="st", input="x", extra_body={"embedding_type": "int8"})
        await http.aclose()
        refused = await client.post("/embed", json={"inputs": "x", "embedding_type": "int8", "normalize": False})
        assert refused.status_code == 400 and refused.json()["error"]["type"] == "unsupported_option"


async def test_a_model_built_without_ranges_refuses_int8_and_says_how_to_add_them(fake_triton: TritonServer) -> None:
    async with running_gateway(fake_triton.grpc_url, shm_prefix="gwint8fake") as (_, client):
        card = (await client.get("/v1/models/fakeemb")).json()
        assert card["embedding_types"] == ["float", "binary", "ubinary"]
        for body, path in (({"model": "fakeemb", "inputs": "x", "embedding_type": "uint8"}, "/embed"),
                           ({"model": "fakeemb", "input": "x", "embedding_type": "int8", "encoding_format": "float"},
                            "/v1/embeddings"),
                           ({"model": "fakeemb", "texts": ["x"], "embedding_types": ["float", "int8"]}, "/v2/embed")):
            response = await client.post(path, json=body)
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["type"] == "not_calibrated" and "--calibration-texts" in error["message"]
        ubinary = await client.post("/embed", json={"model": "fakeemb", "inputs": "x", "embedding_type": "ubinary"})
        assert ubinary.status_code == 200 and len(ubinary.json()["embeddings"][0]) == 1  # 8 bits in one byte


# --- the real all-MiniLM-L6-v2 (slow: a build of a 22M-parameter model) -----------------------------
RETRIEVAL_SET = Path(__file__).resolve().parents[1] / "fixtures" / "retrieval_set.json"


def recall_at(k: int, queries: np.ndarray, passages: np.ndarray, relevant: list[list[int]]) -> float:
    """Mean over queries of the share of their relevant passages among the k best by dot product."""
    scores = queries.astype(np.float64) @ passages.astype(np.float64).T
    top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return float(np.mean([len(set(best) & set(rel)) / len(rel) for best, rel in zip(top.tolist(), relevant)]))


@pytest.fixture(scope="module")
def minilm_repository(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """all-MiniLM-L6-v2 (from PyPI) built as `minilm`, calibrated on the builder's default set."""
    model = all_minilm_l6_v2()
    repository = tmp_path_factory.mktemp("minilm") / "model_repository"
    build_repository(repository, [{"model": str(model), "task": "embed", "name": "minilm", "calibration_texts": None}],
                     **PYTHON_CPU, max_batch_size=32, max_seq_len=128)
    return model, repository


@pytest.mark.slow
async def test_minilm_int8_keeps_recall_and_equals_sentence_transformers(
    minilm_repository: tuple[Path, Path], tmp_path: Path
) -> None:
    model, repository = minilm_repository
    ranges = stored_ranges(repository, "minilm")[384]
    data = json.loads(RETRIEVAL_SET.read_text())
    passages, queries = data["passages"], [q["text"] for q in data["queries"]]
    relevant = [q["relevant"] for q in data["queries"]]
    with serving(TritonServer(repository=repository, log_path=tmp_path / "triton.log")) as server:
        async with running_gateway(server.grpc_url, repository=str(repository), shm_prefix="gwminilm") as (_, client):
            async def embed(texts: list[str], embedding_type: str) -> np.ndarray:
                answer = await client.post("/embed", json={"inputs": texts, "embedding_type": embedding_type})
                assert answer.status_code == 200, answer.text
                return np.asarray(answer.json()["embeddings"], np.float32 if embedding_type == "float" else np.int8)

            floats = {"p": await embed(passages, "float"), "q": await embed(queries, "float")}
            int8 = {"p": await embed(passages, "int8"), "q": await embed(queries, "int8")}
    oracle = SentenceTransformer(str(model), device="cpu")
    encoded = oracle.encode(passages)
    np.testing.assert_allclose(floats["p"], encoded, atol=1e-5)
    assert (int8["p"] == quantize_embeddings(floats["p"], precision="int8", ranges=ranges)).all()
    assert_buckets_of(int8["p"], encoded, ranges, "int8")
    float_recall = recall_at(10, floats["q"], floats["p"], relevant)
    int8_recall = recall_at(10, int8["q"], int8["p"], relevant)  # integer dot products, as an int8 index scores
    assert float_recall > 0.9, float_recall  # the set is one a real model answers
    assert int8_recall >= 0.97 * float_recall, (int8_recall, float_recall)
