"""Warm-up (issue 11): the builder writes `model_warmup` samples into the tokenizer's and the model steps'
configs (not the ensembles', which cannot have any), and Triton runs them when it loads the model. Proved
from Triton's own statistics of a freshly started server, before any request: Triton 2.51 counts warm-up
executions there like any other (success count, and one `batch_stats` entry per sample's batch size).
`--no-warmup` (spec `warmup: false`) writes none, and the same statistics stay at zero."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from transformers import AutoTokenizer

from builder.configs import WARMUP_DIR, WARMUP_TEXT, WARMUP_TEXT_PAIR, read_config
from builder.settings import BuildRequest
from contract import TEXT, TEXT_PAIR
from devstack.tritonserver import TritonServer
from tests.fixtures.repository import PYTHON_CPU, TINY_LIMITS, build_repository
from tests.fixtures.tiny_models import write_tiny_pair_classifier
from tests.fixtures.triton import serving

MAX_SEQ_LEN, MAX_BATCH = TINY_LIMITS["max_seq_len"], TINY_LIMITS["max_batch_size"]


@pytest.fixture(scope="module")
def pair_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_pair_classifier(tmp_path_factory.mktemp("warmup_pair_model"))


@pytest.fixture(scope="module")
def repository(pair_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same pair classifier twice: `warm` (default: warm-up) and `cold` (warmup: false, as a spec gives it)."""
    repository = tmp_path_factory.mktemp("warmup_repository") / "model_repository"
    build_repository(repository, [
        {"model": str(pair_model), "task": "classify", "pairs": True, "name": "warm"},
        {"model": str(pair_model), "task": "classify", "pairs": True, "name": "cold", "warmup": False},
    ], **PYTHON_CPU, **TINY_LIMITS)
    return repository


@pytest.fixture(scope="module")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    log = tmp_path_factory.mktemp("warmup_logs") / "tritonserver.log"
    with serving(TritonServer(repository=repository, log_path=log)) as triton:
        yield triton


def _stats(server: TritonServer, model: str) -> dict[str, Any]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        (stats,) = client.get_inference_statistics(model, as_json=True)["model_stats"]
    finally:
        client.close()
    return dict(stats)


def _batches(stats: dict[str, Any]) -> dict[int, int]:
    """batch size -> executions of that size."""
    return {int(b["batch_size"]): int(b["compute_infer"]["count"]) for b in stats.get("batch_stats", [])}


def _strings(data: bytes) -> list[str]:
    """Triton's serialized TYPE_STRING tensor: 4-byte little-endian length + bytes, per element."""
    out, at = [], 0
    while at < len(data):
        size = int.from_bytes(data[at:at + 4], "little")
        out.append(data[at + 4:at + 4 + size].decode())
        at += 4 + size
    return out


def test_configs_and_files(repository: Path, pair_model: Path) -> None:
    tokenizer_config = read_config(repository / "warm_tokenizer" / "config.pbtxt")
    (sample,) = tokenizer_config.model_warmup
    assert sample.batch_size == 1 and set(sample.inputs) == {TEXT, TEXT_PAIR}
    files = repository / "warm_tokenizer" / WARMUP_DIR
    assert _strings((files / sample.inputs[TEXT].input_data_file).read_bytes()) == [WARMUP_TEXT]
    assert _strings((files / sample.inputs[TEXT_PAIR].input_data_file).read_bytes()) == [WARMUP_TEXT_PAIR]

    step = read_config(repository / "warm_onnx" / "config.pbtxt")
    short, longest = step.model_warmup
    assert (short.batch_size, list(short.inputs["input_ids"].dims)) == (1, [16])
    assert (longest.batch_size, list(longest.inputs["input_ids"].dims)) == (MAX_BATCH, [MAX_SEQ_LEN])
    vocab = AutoTokenizer.from_pretrained(pair_model).vocab_size
    for warmup in (short, longest):
        width = warmup.inputs["input_ids"].dims[0]
        ids = np.fromfile(repository / "warm_onnx" / WARMUP_DIR / warmup.inputs["input_ids"].input_data_file, "<i4")
        mask = np.fromfile(repository / "warm_onnx" / WARMUP_DIR / warmup.inputs["attention_mask"].input_data_file,
                           "<i4")
        assert len(ids) == len(mask) == width and 0 <= ids.min() and ids.max() < vocab  # real token ids
        assert (mask == 1).all() and warmup.inputs["token_type_ids"].zero_data

    assert not read_config(repository / "warm_onnx_ensemble" / "config.pbtxt").model_warmup
    for entry in ("cold_tokenizer", "cold_onnx"):
        assert not read_config(repository / entry / "config.pbtxt").model_warmup
        assert not (repository / entry / WARMUP_DIR).exists()
    assert BuildRequest.model_validate({"model": "m", "task": "embed", "name": "n"}).warmup is True


def test_warmup_ran_at_load(server: TritonServer) -> None:
    """Before any request: the tokenizer ran its sample once, the model step its short sample (1 row) and its
    max-length batch (MAX_BATCH rows) in one execution each, every one successful."""
    tokenizer = _stats(server, "warm_tokenizer")
    assert tokenizer["inference_stats"]["success"].get("count") == "1"
    assert not tokenizer["inference_stats"]["fail"] and _batches(tokenizer) == {1: 1}
    step = _stats(server, "warm_onnx")
    assert step["inference_stats"]["success"].get("count") == str(1 + MAX_BATCH)
    assert not step["inference_stats"]["fail"] and step["execution_count"] == "2"
    assert _batches(step) == {1: 1, MAX_BATCH: 1}
    for model in ("cold_tokenizer", "cold_onnx", "warm_onnx_ensemble"):  # nothing ran in these
        stats = _stats(server, model)
        assert not stats["inference_stats"]["success"] and not _batches(stats), model


def test_warm_model_answers(server: TritonServer) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        inputs = []
        for name, text in ((TEXT, "a good movie"), (TEXT_PAIR, "it was great")):
            tensor = grpcclient.InferInput(name, [1, 1], "BYTES")
            tensor.set_data_from_numpy(np.array([[text.encode()]], dtype=object))
            inputs.append(tensor)
        result = client.infer("warm_onnx_ensemble", inputs)
    finally:
        client.close()
    assert result.as_numpy("logits").shape[0] == 1
    assert _stats(server, "warm_onnx")["inference_stats"]["success"]["count"] == str(2 + MAX_BATCH)
