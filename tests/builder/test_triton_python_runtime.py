"""The --runtime python repository served by a real tritonserver matches PyTorch over gRPC."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer

from devstack.tritonserver import TritonServer

TEXTS = [
    "good movie",
    "",
    "안녕하세요 영화 정말 좋아요",
    "这个电影很好",
    "the food was terrible and the service slow " * 3,
    "a very long text that goes beyond the limit " * 20,  # > 64 tokens: truncated
]
MAX_SEQ_LEN = 64


def _infer(server: TritonServer, model: str, output: str, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    data = np.array([[t.encode()] for t in texts], dtype=object)
    inp = grpcclient.InferInput("text", list(data.shape), "BYTES")
    inp.set_data_from_numpy(data)
    result = client.infer(model, [inp], outputs=[grpcclient.InferRequestedOutput(output),
                                                 grpcclient.InferRequestedOutput("num_tokens")])
    return result.as_numpy(output), result.as_numpy("num_tokens")


def _tokens(model_dir: Path, text: str) -> dict[str, torch.Tensor]:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return tokenizer([text], truncation=True, max_length=MAX_SEQ_LEN, return_tensors="pt")


def _full_length(model_dir: Path, text: str) -> int:
    return len(AutoTokenizer.from_pretrained(model_dir)(text)["input_ids"])


@pytest.mark.timeout(300)
def test_classifier_ensemble_matches_pytorch(triton_server: TritonServer, tiny_classifier_dir: Path) -> None:
    logits, num_tokens = _infer(triton_server, "tinycls_onnx_ensemble", "logits", TEXTS)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_classifier_dir).eval()
    assert logits.shape == (len(TEXTS), 3)
    for row, text in enumerate(TEXTS):  # one text at a time: PyTorch sees no padding at all
        with torch.inference_mode():
            expected = model(**_tokens(tiny_classifier_dir, text)).logits[0].numpy()
        np.testing.assert_allclose(logits[row], expected, atol=1e-4)
        assert num_tokens[row, 0] == _full_length(tiny_classifier_dir, text)
    assert num_tokens[-1, 0] > MAX_SEQ_LEN


@pytest.mark.timeout(300)
def test_embedder_ensemble_matches_pytorch(triton_server: TritonServer, tiny_embedder_dir: Path) -> None:
    embeddings, num_tokens = _infer(triton_server, "tinyemb_onnx_ensemble", "embeddings", TEXTS)
    model = AutoModel.from_pretrained(tiny_embedder_dir).eval()
    assert embeddings.shape == (len(TEXTS), 32)
    for row, text in enumerate(TEXTS):
        tokens = _tokens(tiny_embedder_dir, text)
        with torch.inference_mode():
            hidden = model(**tokens).last_hidden_state[0]
        expected = hidden.mean(dim=0).numpy()  # no padding: the mean over the mask is the plain mean
        cosine = float(np.dot(embeddings[row], expected) / (np.linalg.norm(embeddings[row]) * np.linalg.norm(expected)))
        assert cosine >= 0.99999, (text, cosine)
        np.testing.assert_allclose(embeddings[row], expected, atol=1e-4)
        assert num_tokens[row, 0] == _full_length(tiny_embedder_dir, text)


def _tokenize(server: TritonServer, texts: list[str]) -> dict[str, np.ndarray]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    data = np.array([[t.encode()] for t in texts], dtype=object)
    inp = grpcclient.InferInput("text", list(data.shape), "BYTES")
    inp.set_data_from_numpy(data)
    result = client.infer("tinycls_tokenizer", [inp])
    return {n: result.as_numpy(n) for n in ("input_ids", "attention_mask", "token_type_ids", "num_tokens")}


@pytest.mark.timeout(300)
def test_tokenizer_buckets_and_truncation(triton_server: TritonServer, tiny_classifier_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_classifier_dir)
    assert _tokenize(triton_server, [""])["input_ids"].shape == (1, 16)
    short = _tokenize(triton_server, ["good movie", "hello"])
    assert short["input_ids"].shape == (2, 16) and short["input_ids"].dtype == np.int32
    expected = tokenizer(["good movie", "hello"], padding="max_length", max_length=16)
    np.testing.assert_array_equal(short["input_ids"], expected["input_ids"])
    np.testing.assert_array_equal(short["attention_mask"], expected["attention_mask"])
    text = "the movie " * 12  # 26 tokens -> bucket 32
    assert _tokenize(triton_server, [text])["input_ids"].shape == (1, 32)
    long = _tokenize(triton_server, ["a " * 200, "b"])  # 202 tokens -> truncated to max_seq_len 64
    assert long["input_ids"].shape == (2, 64)
    truncated = tokenizer(["a " * 200], truncation=True, max_length=64)["input_ids"][0]
    assert long["input_ids"][0].tolist() == truncated  # ends with [SEP], like the HF tokenizer
    assert long["num_tokens"][:, 0].tolist() == [202, 3]


@pytest.mark.timeout(300)
def test_concurrent_requests_of_mixed_lengths(triton_server: TritonServer) -> None:
    """Many requests at once (the dynamic batcher merges them, the runner groups by length): same answers."""
    texts = ["good", "the food was bad " * 4, "안녕하세요", "a " * 100, "", "这个电影很好 " * 3] * 3
    alone = [_infer(triton_server, "tinyemb_onnx_ensemble", "embeddings", [t])[0][0] for t in texts[:6]]
    with ThreadPoolExecutor(max_workers=len(texts)) as pool:
        together = list(pool.map(lambda t: _infer(triton_server, "tinyemb_onnx_ensemble", "embeddings", [t])[0][0], texts))
    for index, vector in enumerate(together):
        np.testing.assert_allclose(vector, alone[index % 6], atol=1e-5)
