"""Embedders as sentence-transformers trained them (issue 10): Pooling (mean, CLS, last token), Normalize,
max_seq_length, prompts and matryoshka dimensions become the export and the ensemble's parameters; the
published graph (normalised when the model says so) equals `SentenceTransformer.encode`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from sentence_transformers import SentenceTransformer
from transformers import AutoTokenizer

from builder.configs import read_config
from builder.manifest import read_manifest
from contract import TOKEN_INPUTS
from devstack.tritonserver import TritonServer
from tests.fixtures.repository import PYTHON_CPU, build_repository
from tests.fixtures.tiny_models import (
    MAX_POSITIONS,
    write_tiny_embedder,
    write_tiny_st_embedder,
)
from tests.fixtures.triton import serving
from tests.gateway.conftest import running_gateway

TEXTS = ["good movie", "", "안녕하세요 영화 정말 좋아요", "the food was terrible " * 3, "a long text that goes on " * 20]
MODEL_PROMPTS = {"query": "query: ", "passage": "passage: "}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("st_models")
    plain = write_tiny_embedder(root / "plain")  # no modules.json: normalised, as before
    (plain / "modules.json").unlink()
    return {
        "mean": write_tiny_st_embedder(root / "mean", prompts=MODEL_PROMPTS, default_prompt_name="query",
                                       max_seq_length=40, matryoshka_dims=[8, 16]),
        "last": write_tiny_st_embedder(root / "last", seed=5, pooling="lasttoken", normalize=False),
        "cls": write_tiny_st_embedder(root / "cls", seed=6, pooling="cls", max_seq_length=500),
        "plain": plain,
    }


@pytest.fixture(scope="module")
def repository(models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("st_repository") / "model_repository"
    build_repository(repo, [
        # prompts from the model, one overridden and one added by the build
        {"model": str(models["mean"]), "task": "embed", "name": "mean",
         "prompts": {"passage": "doc: ", "code": "code: "}},
        {"model": str(models["last"]), "task": "embed", "name": "last", "matryoshka_dims": "4,16"},
        {"model": str(models["cls"]), "task": "embed", "name": "cls"},
        {"model": str(models["plain"]), "task": "embed", "name": "plain"},
    ], **PYTHON_CPU, max_batch_size=8)
    return repo


def _params(repository: Path, name: str) -> dict[str, str]:
    config = read_config(repository / f"{name}_onnx_ensemble" / "config.pbtxt")
    return {k: v.string_value for k, v in config.parameters.items()}


def test_parameters_follow_the_sentence_transformers_modules(repository: Path) -> None:
    mean = _params(repository, "mean")
    assert (mean["pooling"], mean["normalize"], mean["max_seq_len"]) == ("mean", "true", "40")
    assert json.loads(mean["prompts"]) == {"query": "query: ", "passage": "doc: ", "code": "code: "}
    assert mean["default_prompt_name"] == "query"
    assert mean["matryoshka_dims"] == "8,16,32"  # config.matryoshka_dimensions, plus the full width
    assert "pairs" not in mean and mean["embedding_dim"] == "32"
    last = _params(repository, "last")
    assert (last["pooling"], last["normalize"], last["matryoshka_dims"]) == ("lasttoken", "false", "4,16,32")
    assert last["prompts"] == "{}" and "default_prompt_name" not in last
    assert last["max_seq_len"] == str(MAX_POSITIONS)  # no sentence_bert_config max_seq_length: the model's limit
    cls = _params(repository, "cls")
    assert (cls["pooling"], cls["normalize"], cls["max_seq_len"]) == ("cls", "true", str(MAX_POSITIONS))  # 500 capped
    assert "matryoshka_dims" not in cls
    plain = _params(repository, "plain")
    assert (plain["pooling"], plain["normalize"], plain["prompts"]) == ("mean", "true", "{}")
    settings = read_manifest(repository / "mean_onnx").settings  # type: ignore[union-attr]
    assert settings.normalize and settings.matryoshka_dims == [8, 16, 32] and settings.default_prompt_name == "query"


def _onnx_embeddings(repository: Path, name: str, model_dir: Path, texts: list[str], max_seq_len: int) -> np.ndarray:
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    batch = tokenizer(texts, truncation=True, max_length=max_seq_len, padding=True, return_tensors="np",
                      return_token_type_ids=True)
    session = ort.InferenceSession(str(repository / f"{name}_onnx" / "1" / "model.onnx"))
    return np.asarray(session.run(None, {n: batch[n].astype(np.int32) for n in TOKEN_INPUTS})[0])


@pytest.mark.parametrize("name", ["mean", "last", "cls"])
def test_export_equals_sentence_transformers(repository: Path, models: dict[str, Path], name: str) -> None:
    """Pooling inside the graph, normalisation as published, truncation at the published max_seq_len."""
    params = _params(repository, name)
    model = SentenceTransformer(str(models[name]), device="cpu")
    # `cls` declares 500 tokens, more than its 128 positions: the build caps it, sentence-transformers does not
    assert min(model.max_seq_length or 0, MAX_POSITIONS) == int(params["max_seq_len"])
    model.max_seq_length = int(params["max_seq_len"])
    got = _onnx_embeddings(repository, name, models[name], TEXTS, int(params["max_seq_len"]))
    if params["normalize"] == "true":
        got = got / np.linalg.norm(got, axis=1, keepdims=True)
    expected = model.encode(TEXTS, prompt_name=None, prompt="")
    np.testing.assert_allclose(got, expected, atol=1e-5)
    assert np.abs(expected - expected[0]).max() > 0.05  # the tiny model's embeddings differ across texts


@pytest.mark.anyio
@pytest.mark.timeout(300)
async def test_gateway_embeddings_equal_sentence_transformers(
    repository: Path, models: dict[str, Path], tmp_path: Path
) -> None:
    """Through a real tritonserver and the gateway, with no request options: each model's pooling,
    Normalize module (or none), max_seq_length and default prompt, as `SentenceTransformer.encode` gives them."""
    texts = [t for t in TEXTS if t]  # the API takes no empty text
    with serving(TritonServer(repository=repository, log_path=tmp_path / "triton.log")) as server:
        gateway = running_gateway(server.grpc_url, triton_http_url=server.http_address, repository=str(repository), shm_prefix="gwstmodules")
        async with gateway as (_, client):
            for name in ("mean", "last", "cls", "plain"):
                model = SentenceTransformer(str(models[name]), device="cpu")
                model.max_seq_length = int(_params(repository, name)["max_seq_len"])  # `cls`: 500 capped at 128
                want = model.encode(texts, normalize_embeddings=name == "plain")  # plain: normalised, as before
                response = await client.post("/embed", json={"model": name, "inputs": texts})
                assert response.status_code == 200, response.text
                np.testing.assert_allclose(response.json()["embeddings"], want, atol=1e-5, err_msg=name)
    assert np.abs(np.linalg.norm(model.encode(texts), axis=1) - 1).max() > 1e-3  # plain has no Normalize module


def test_model_prompts_are_prefixes(repository: Path, models: dict[str, Path]) -> None:
    """The published prompts are sentence-transformers' prompts: the text prepended to the input."""
    prompts = json.loads(_params(repository, "mean")["prompts"])
    model = SentenceTransformer(str(models["mean"]), device="cpu")
    got = _onnx_embeddings(repository, "mean", models["mean"], [prompts["query"] + t for t in TEXTS], 40)
    got = got / np.linalg.norm(got, axis=1, keepdims=True)
    np.testing.assert_allclose(got, model.encode(TEXTS), atol=1e-5)  # its default prompt: query
    np.testing.assert_allclose(got, model.encode(TEXTS, prompt_name="query"), atol=1e-5)
    assert np.abs(got - model.encode(TEXTS, prompt="")).max() > 1e-3


def test_lasttoken_pooling_takes_each_rows_last_token(repository: Path, models: dict[str, Path]) -> None:
    """Rows of different lengths in one padded batch: each row pools its own last attended token."""
    alone = np.stack([_onnx_embeddings(repository, "last", models["last"], [t], MAX_POSITIONS)[0] for t in TEXTS])
    together = _onnx_embeddings(repository, "last", models["last"], TEXTS, MAX_POSITIONS)
    np.testing.assert_allclose(together, alone, atol=1e-5)


def test_explicit_pooling_wins_over_the_model(models: dict[str, Path], tmp_path: Path) -> None:
    source = tmp_path / "weighted"
    shutil.copytree(models["mean"], source)
    (source / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": "weightedmean"}))
    repo = tmp_path / "repo"
    build_repository(repo, [{"model": str(source), "task": "embed", "name": "w", "pooling": "cls"}], **PYTHON_CPU,
                     max_batch_size=4)
    assert _params(repo, "w")["pooling"] == "cls"
