"""The gateway on the builder's tiny BERT repository (--runtime python): results equal PyTorch's,
through both pipelines (the gateway's scheduler calling the model step, and Triton's ensemble)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer

from devstack.tritonserver import TritonServer
from tests.gateway.conftest import running_gateway

pytestmark = pytest.mark.anyio
PIPELINES = ["scheduler", "ensemble"]


def pipeline_settings(pipeline: str, repository: Path) -> dict[str, str]:
    """Gateway settings for a pipeline: the scheduler reads tokenizer.json from the repository."""
    return {"pipeline": pipeline, "repository": str(repository) if pipeline == "scheduler" else ""}

TEXTS = [
    "the movie was great",
    "terrible plot and bad acting",
    "it was fine i guess",
    " ",  # whitespace only: no word tokens, just the special ones
    "hello world " * 40,  # over max_seq_len: truncated
    "a",
    "one more sentence to make seven",
]


def reference(model_dir: Path, texts: list[str], max_len: int, task: str, pooling: str = "mean") -> np.ndarray:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    enc = tokenizer(texts, padding=True, truncation=True, max_length=max_len, return_tensors="pt")
    with torch.no_grad():
        if task == "classify":
            logits = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()(**enc).logits
            return torch.softmax(logits, dim=-1).numpy()
        hidden = AutoModel.from_pretrained(model_dir).eval()(**enc).last_hidden_state
    if pooling == "cls":
        return hidden[:, 0].numpy()
    mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    return ((hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)).numpy()


def centered_logits(probs: np.ndarray) -> np.ndarray:
    logp = np.log(probs.astype(np.float64))
    return logp - logp.mean(axis=1, keepdims=True)


def assert_same_logits(got: np.ndarray, want: np.ndarray) -> None:
    """Compare in logit space: the random tiny classifier's probabilities differ across inputs by
    only ~1e-5, so an order mix-up hides under a probability tolerance but not here."""
    g, w = centered_logits(got), centered_logits(want)
    spread = w.std(axis=0).max()
    assert spread > 2e-5, spread  # the inputs really give different logits
    np.testing.assert_allclose(g, w, atol=spread / 10)


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("shm", ["system", "none"])
async def test_classify_matches_pytorch(
    triton_server: TritonServer, python_repository: Path, tiny_classifier_dir: Path, shm: str, pipeline: str
) -> None:
    settings = pipeline_settings(pipeline, python_repository)
    async with running_gateway(triton_server.grpc_url, triton_http_url=triton_server.http_address, shm=shm, shm_prefix=f"gwbertc{shm}", **settings) as (_, client):
        card = next(m for m in (await client.get("/v1/models")).json()["data"] if m["id"] == "tinycls")
        r = await client.post("/classify", json={"model": "tinycls", "inputs": TEXTS})
    assert r.status_code == 200, r.text
    assert card["pipeline"] == pipeline and card["onnx_accelerator"] == "none"  # a CPU build
    labels = card["labels"]
    assert labels == ["negative", "neutral", "positive"]
    got = np.array([[p["scores"][label] for label in labels] for p in r.json()["predictions"]])
    want = reference(tiny_classifier_dir, TEXTS, card["max_tokens"], "classify")
    np.testing.assert_allclose(got, want, atol=1e-4)
    assert_same_logits(got, want)
    assert [p["label"] for p in r.json()["predictions"]] == [labels[i] for i in want.argmax(1)]


@pytest.mark.parametrize("pipeline", PIPELINES)
@pytest.mark.parametrize("shm", ["system", "none"])
async def test_embed_matches_pytorch(
    triton_server: TritonServer, python_repository: Path, tiny_embedder_dir: Path, shm: str, pipeline: str
) -> None:
    settings = pipeline_settings(pipeline, python_repository)
    async with running_gateway(triton_server.grpc_url, triton_http_url=triton_server.http_address, shm=shm, shm_prefix=f"gwberte{shm}", **settings) as (_, client):
        card = next(m for m in (await client.get("/v1/models")).json()["data"] if m["id"] == "tinyemb")
        raw = await client.post("/embed", json={"model": "tinyemb", "inputs": TEXTS, "normalize": False})
        unit = await client.post("/embed", json={"model": "tinyemb", "inputs": TEXTS, "normalize": True})
        default = await client.post("/embed", json={"model": "tinyemb", "inputs": TEXTS})
    assert raw.status_code == unit.status_code == default.status_code == 200, raw.text
    # its modules.json has no Normalize module: by default it is not normalized, as sentence-transformers does
    assert card["normalize"] is False and default.json()["embeddings"] == raw.json()["embeddings"]
    want = reference(tiny_embedder_dir, TEXTS, card["max_tokens"], "embed", card["pooling"])
    assert raw.json()["dimensions"] == card["dimensions"] == want.shape[1]
    assert want.std(axis=0).max() > 1e-2
    np.testing.assert_allclose(np.array(raw.json()["embeddings"]), want, atol=1e-4)
    np.testing.assert_allclose(
        np.array(unit.json()["embeddings"]), want / np.linalg.norm(want, axis=1, keepdims=True), atol=1e-4
    )


@pytest.mark.parametrize("pipeline", PIPELINES)
async def test_order_for_300_inputs_and_truncate_false(
    triton_server: TritonServer, python_repository: Path, tiny_classifier_dir: Path, pipeline: str
) -> None:
    texts = [f"sentence {i} " + "word " * (i % 13) for i in range(300)]
    settings = pipeline_settings(pipeline, python_repository)
    async with running_gateway(triton_server.grpc_url, triton_http_url=triton_server.http_address, shm_prefix="gwbert300", **settings) as (_, client):
        many = await client.post("/classify", json={"model": "tinycls", "inputs": texts})
        one_by_one = [
            (await client.post("/classify", json={"model": "tinycls", "inputs": t})).json()["predictions"][0]
            for t in texts[:: 37]
        ]
        too_long = await client.post("/classify", json={"model": "tinycls", "inputs": ["ok", "word " * 200], "truncate": False})
    assert many.status_code == 200 and len(many.json()["predictions"]) == 300
    for i, single in zip(range(0, 300, 37), one_by_one):
        np.testing.assert_allclose(
            list(many.json()["predictions"][i]["scores"].values()), list(single["scores"].values()), atol=1e-5
        )
    want = reference(tiny_classifier_dir, texts, 64, "classify")
    got = np.array([list(p["scores"].values()) for p in many.json()["predictions"]])
    assert_same_logits(got, want)
    assert too_long.status_code == 413 and too_long.json()["error"]["type"] == "input_too_long"
