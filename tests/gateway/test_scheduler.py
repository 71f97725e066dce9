"""The scheduler pipeline against a real tritonserver on the builder's tiny BERT repository:
the gateway tokenizes like the builder's tokenizer and Triton's, batches by length into fewer,
fuller batches (Triton's own execution counts, the padding metric), refuses `truncate: false`
before any compute, and falls back to the ensemble when it cannot read the tokenizer."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from transformers import AutoTokenizer

from devstack.tritonserver import TritonServer
from loadtest.corpus import CorpusSpec, make_corpus
from tests.fixtures.metrics import metric
from tests.gateway.conftest import running_gateway
from tests.gateway.test_bert import reference

pytestmark = pytest.mark.anyio

MULTILINGUAL = [
    "",
    "a",
    "안녕하세요 영화 정말 좋아요",
    "中国语 文本 测试 很好",
    "Ça marche très bien — naïve café, émojis 😀👍",
    "Москва данные поиск",
    "the movie was great " * 30,  # over max_seq_len (64): truncated, trailing [SEP] kept
    "mixed 한국어 and 中文 and english, with punctuation!?",
]


def step_counts(url: str, model: str) -> tuple[int, int]:
    """(inference_count, execution_count) of a Triton model."""
    stats = grpcclient.InferenceServerClient(url).get_inference_statistics(model, as_json=True)
    entry = stats["model_stats"][0]
    return int(entry.get("inference_count", 0)), int(entry.get("execution_count", 0))


async def test_gateway_tokenizer_matches_the_builders_and_tritons(
    triton_server: TritonServer, python_repository: Path, tiny_embedder_dir: Path
) -> None:
    texts = MULTILINGUAL + make_corpus(CorpusSpec(size=200, seed=7, non_ascii_share=0.5))
    async with running_gateway(triton_server.grpc_url, triton_http_url=triton_server.http_address, repository=str(python_repository)) as (app, _):
        encoder = app.state.runtime.inference.scheduled.pipelines["tinyemb_onnx"].tokenizer.encoder
        encoded = encoder.encode(texts)
        single = [encoder.encode([t]) for t in texts[:20]]
    hf = AutoTokenizer.from_pretrained(tiny_embedder_dir)
    want = hf(texts, truncation=True, max_length=64)["input_ids"]
    want_counts = [len(ids) for ids in hf(texts, truncation=False)["input_ids"]]
    assert [ids.tolist() for ids in encoded.ids] == want
    assert encoded.num_tokens.tolist() == want_counts
    assert max(want_counts) > 64  # truncation was exercised
    for one, ids in zip(single, want):
        assert one.ids[0].tolist() == ids
    # Triton's tokenizer model (the ensemble path) gives the same ids.
    client = grpcclient.InferenceServerClient(triton_server.grpc_url)
    for start in range(0, len(texts), 8):
        chunk = texts[start : start + 8]
        inp = grpcclient.InferInput("text", [len(chunk), 1], "BYTES")
        inp.set_data_from_numpy(np.array([[t.encode()] for t in chunk], dtype=np.object_))
        result = client.infer("tinyemb_tokenizer", [inp])
        ids, mask = result.as_numpy("input_ids"), result.as_numpy("attention_mask")
        got = [row[: int(m.sum())].tolist() for row, m in zip(ids, mask)]
        assert got == want[start : start + 8]
        assert result.as_numpy("num_tokens").reshape(-1).tolist() == want_counts[start : start + 8]


async def test_length_aware_batches_are_fewer_and_fuller(
    triton_server: TritonServer, python_repository: Path, tiny_embedder_dir: Path
) -> None:
    short = ["good movie", "bad food", "okay", "great film"]
    long = ["the service was really slow and the food was cold but the people were very friendly " * 2]
    texts = [(short[i % 4] if i % 2 else long[0] + f" {i}") for i in range(48)]  # short and long interleaved
    hf = AutoTokenizer.from_pretrained(tiny_embedder_dir)
    lengths = [len(ids) for ids in hf(texts, truncation=True, max_length=64)["input_ids"]]
    fifo_ratio = len(texts) * max(lengths) / sum(lengths)  # one arrival-order batch padded to its longest
    settings = {"repository": str(python_repository), "max_batches_in_flight": 1, "shm_prefix": "gwsched"}
    async with running_gateway(triton_server.grpc_url, triton_http_url=triton_server.http_address, **settings) as (_, client):
        before = step_counts(triton_server.grpc_url, "tinyemb_onnx")
        metrics_before = (await client.get("/metrics")).text
        answers = await asyncio.gather(*(
            client.post("/embed", json={"model": "tinyemb", "inputs": t, "normalize": False}) for t in texts
        ))
        after = step_counts(triton_server.grpc_url, "tinyemb_onnx")
        metrics_after = (await client.get("/metrics")).text
    assert all(a.status_code == 200 for a in answers)
    got = np.array([a.json()["embeddings"][0] for a in answers])
    np.testing.assert_allclose(got, reference(tiny_embedder_dir, texts, 64, "embed"), atol=1e-4)
    inferences, executions = after[0] - before[0], after[1] - before[1]
    assert inferences == len(texts)
    # 48 single-text requests: one goes at once, the other 47 queue behind it and leave in full,
    # length-sorted batches of the step's max batch size, 8 (Triton counts each batch as one
    # execution of the model step): 1 + ceil(47 / 8) = 7.
    assert executions == 7, executions
    batches = metric(metrics_after, "gateway_batch_size_count", model="tinyemb") - metric(
        metrics_before, "gateway_batch_size_count", model="tinyemb")
    assert batches == executions
    real = metric(metrics_after, "gateway_scheduled_tokens_total", model="tinyemb", kind="real") - metric(
        metrics_before, "gateway_scheduled_tokens_total", model="tinyemb", kind="real")
    computed = metric(metrics_after, "gateway_scheduled_tokens_total", model="tinyemb", kind="computed") - metric(
        metrics_before, "gateway_scheduled_tokens_total", model="tinyemb", kind="computed")
    assert real == sum(lengths)
    assert fifo_ratio > 1.8  # what padding in arrival order would cost on these texts
    assert computed / real <= 1.1, (computed, real)


async def test_truncate_false_is_refused_before_any_inference(
    triton_server: TritonServer, python_repository: Path
) -> None:
    async with running_gateway(triton_server.grpc_url, triton_http_url=triton_server.http_address, repository=str(python_repository)) as (_, client):
        before = step_counts(triton_server.grpc_url, "tinycls_onnx")
        r = await client.post("/classify", json={"model": "tinycls", "inputs": ["ok", "good " * 200], "truncate": False})
        after = step_counts(triton_server.grpc_url, "tinycls_onnx")
        ok = await client.post("/classify", json={"model": "tinycls", "inputs": ["ok", "good " * 200]})
    assert r.status_code == 413 and r.json()["error"]["type"] == "input_too_long"
    assert "input 1 has 202 tokens" in r.json()["error"]["message"]
    assert after == before  # nothing reached the model
    assert ok.status_code == 200 and ok.json()["usage"]["tokens"] == 4 + 64  # [CLS] o ##k [SEP], then 64 of 202


async def test_without_a_readable_tokenizer_the_ensemble_serves(
    triton_server: TritonServer, python_repository: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    stale = tmp_path / "stale_repository"
    shutil.copytree(python_repository, stale)
    path = stale / "tinyemb_tokenizer" / "1" / "tokenizer.json"
    path.write_text(path.read_text().replace('"[UNK]"', '"[UNKNOWN]"'))  # not the file Triton serves
    for repository in ("", str(stale)):
        async with running_gateway(triton_server.grpc_url, triton_http_url=triton_server.http_address, repository=repository) as (app, client):
            cards = {m["id"]: m for m in (await client.get("/v1/models")).json()["data"]}
            r = await client.post("/embed", json={"model": "tinyemb", "inputs": ["still served"]})
        assert r.status_code == 200
        assert cards["tinyemb"]["pipeline"] == "ensemble"
        assert cards["tinycls"]["pipeline"] == ("ensemble" if repository == "" else "scheduler")
    assert "sha256 mismatch" in caplog.text and "GATEWAY_REPOSITORY is not set" in caplog.text


@pytest.mark.anyio
@pytest.mark.slow  # ~6 s of the default run (its own tritonserver of three instances): scripts/test -m slow
async def test_batches_in_flight_follow_the_instances_triton_runs(python_repository: Path, tmp_path: Path) -> None:
    """GATEWAY_MAX_BATCHES_IN_FLIGHT is per instance of the step, shared by the workers: a step Triton runs
    with 3 instances gets three times the batches in flight of one with 1 (on a GPU host, every GPU's)."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    from tests.fixtures.triton import serving

    seen = {}
    for instances in (1, 3):
        repo = tmp_path / f"repo{instances}"
        shutil.copytree(python_repository, repo)
        config_path = repo / "tinyemb_onnx" / "config.pbtxt"
        config = text_format.Parse(config_path.read_text(), mc.ModelConfig())
        config.instance_group[0].count = instances
        config_path.write_text(text_format.MessageToString(config))
        with serving(TritonServer(repository=repo, log_path=tmp_path / f"triton{instances}.log")) as server:
            served = grpcclient.InferenceServerClient(server.grpc_url).get_model_config("tinyemb_onnx").config
            assert sum(g.count for g in served.instance_group) == instances  # what Triton runs
            async with running_gateway(server.grpc_url, triton_http_url=server.http_address, repository=str(repo), workers=1) as (app, client):
                assert (await client.post("/embed", json={"model": "tinyemb", "inputs": ["x"]})).status_code == 200
                model = app.state.runtime.registry.resolve("tinyemb", "embed")
                endpoint = model.endpoint(None)
                assert endpoint.step_instances == instances
                seen[instances] = app.state.runtime.inference.scheduled.pipelines[endpoint.step_model].scheduler.policy.max_in_flight
    assert seen == {1: 1, 3: 3}  # `auto` on a CPU step: 1 per instance, one worker
