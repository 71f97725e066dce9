"""int8, uint8, binary and ubinary embeddings on /embed and /v1/embeddings (the openai client's `extra_body`), served
by a real tritonserver from the builder's repository: the integers are sentence-transformers'
`quantize_embeddings(..., ranges=<the ranges the build stored>)` of the gateway's own float answer, and of
sentence-transformers' encode. Cohere's `embedding_types` are checked with the cohere client in test_peer_clients.py;
the real all-MiniLM-L6-v2 and its retrieval quality in test_int8_minilm.py (slow)."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from sentence_transformers import SentenceTransformer
from sentence_transformers.quantization import quantize_embeddings

from devstack.tritonserver import TritonServer
from tests.fixtures.repository import stored_ranges
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
