"""One small request must not make a huge answer, and a large answer must not stall the worker (issue 51, findings 1
and 6), with the builder's XLM-R models (issue 23's repository: e5 with per-token hidden states, m3 with ColBERT
vectors) on a real tritonserver:

- GATEWAY_MAX_TOKEN_VALUES bounds the floats of a per-token answer (/embed_all, /embed_multi_vector, /encode, TEI's
  /embed_all): over it, 413 `answer_too_large` naming the bound and how to stay under it, and Triton ran nothing;
  under it (counted exactly, not by max_seq_len), the answer;
- GATEWAY_MAX_TOKENIZE_TOKENS bounds the tokens of a /tokenize answer (also TEI's);
- an answer over the off-loop size is encoded in a worker thread: /healthz answers while it is being encoded (the
  encoder is held until /healthz has answered; on the event loop that could never happen).
"""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from devstack.tritonserver import TritonServer
from gateway.api import responses
from tests.fixtures.tiny_models import HIDDEN_SIZE, long_text
from tests.fixtures.waiting import until
from tests.gateway.conftest import running_gateway

pytestmark = pytest.mark.anyio
TOKENS = 40  # the per-token bound of the bounded gateway, in tokens of the 32-wide models
SHORT = ["deep learning", "a b"]


def inferences(triton: TritonServer, family: str) -> int:
    """Triton's count of the requests the family's models executed."""
    stats = grpcclient.InferenceServerClient(triton.grpc_url).get_inference_statistics("", as_json=True)
    return sum(int(m["inference_stats"]["success"].get("count", 0)) for m in stats.get("model_stats", [])
               if m["name"].startswith(f"{family}_"))


def refused(body: dict[str, Any], setting: str) -> str:
    assert body["error"]["type"] == "answer_too_large", body
    message: str = body["error"]["message"]
    assert setting in message, message
    return message


async def test_per_token_answers_and_tokenize_answers_are_bounded(issue23_server: TritonServer,
                                                                  issue23_repository: Path) -> None:
    limit = TOKENS * HIDDEN_SIZE
    async with running_gateway(issue23_server.grpc_url, triton_http_url=issue23_server.http_address,
                               repository=str(issue23_repository), shm_prefix="gwbound", max_token_values=limit,
                               max_tokenize_tokens=TOKENS) as (_, client):
        # under the bound, though 2 inputs of max_seq_len tokens would not be: counted exactly
        fits = await client.post("/embed_all", json={"model": "e5", "inputs": SHORT})
        assert fits.status_code == 200, fits.text
        assert sum(len(rows) for rows in fits.json()) * HIDDEN_SIZE <= limit
        many = [f"sentence number {i} about deep learning" for i in range(12)]
        for route, model in (("/embed_all", "e5"), ("/embed_multi_vector", "m3"), ("/encode", "m3")):
            before = inferences(issue23_server, model)
            r = await client.post(route, json={"model": model, "inputs": many})
            assert r.status_code == 413, r.text
            message = refused(r.json(), "GATEWAY_MAX_TOKEN_VALUES")
            assert f"{limit:,}" in message and f"at most {TOKENS:,} tokens per request" in message, message
            assert inferences(issue23_server, model) == before, f"{route}: Triton ran the refused request"
        tei = await client.post("/tei/e5/embed_all", json={"inputs": many})
        assert tei.status_code == 413 and tei.json()["error_type"] == "Validation", tei.text
        assert "GATEWAY_MAX_TOKEN_VALUES" in tei.json()["error"]

        tokens = await client.post("/tokenize", json={"model": "e5", "inputs": SHORT})
        assert tokens.status_code == 200 and sum(map(len, tokens.json())) <= TOKENS, tokens.text
        for route, body in (("/tokenize", {"model": "e5", "inputs": many}), ("/tei/e5/tokenize", {"inputs": many})):
            r = await client.post(route, json=body)
            assert r.status_code == 413, r.text
            message = r.json()["error"]["message"] if route == "/tokenize" else r.json()["error"]
            assert "GATEWAY_MAX_TOKENIZE_TOKENS" in message and f"{TOKENS:,}" in message, message


async def test_a_large_answer_is_encoded_while_the_loop_serves(issue23_server: TritonServer, issue23_repository: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    texts = [long_text(600, seed=i) for i in range(8)]  # 8 x 512 tokens x 32 floats: over the off-loop size
    encoding, order = threading.Event(), []
    release = threading.Event()
    dumps = responses._dumps

    def held(content: Any) -> bytes:
        if isinstance(content, list) and content and isinstance(content[0], np.ndarray):  # the per-token answer
            encoding.set()
            release.wait(timeout=30)  # on the loop, /healthz could not answer before this gives up
            order.append("encoded")
        return dumps(content)

    monkeypatch.setattr(responses, "_dumps", held)
    async with running_gateway(issue23_server.grpc_url, triton_http_url=issue23_server.http_address,
                               repository=str(issue23_repository), shm_prefix="gwbig") as (_, client):
        answer = asyncio.create_task(client.post("/embed_all", json={"model": "e5", "inputs": texts}))
        await until(encoding.is_set, "the answer being encoded")
        health = await client.get("/healthz")
        order.append("healthz")
        release.set()
        r = await answer
    assert health.status_code == 200 and order == ["healthz", "encoded"], order
    assert r.status_code == 200 and [len(rows) for rows in r.json()] == [512] * len(texts)
    assert sum(len(rows) for rows in r.json()) * HIDDEN_SIZE * responses.FLOAT_BYTES > responses.OFF_LOOP_BYTES
