"""Pair models (issue 10): task rerank (cross-encoders) and sentence-pair classifiers. Configs and parameters,
parity on pairs, and a real tritonserver whose tokenizer encodes pairs and truncates (right or left, longest
first) exactly like `transformers`, with `sentence_transformers.CrossEncoder` as the oracle of the scores."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import torch
import tritonclient.grpc as grpcclient
from sentence_transformers import CrossEncoder
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    BatchEncoding,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)
from tritonclient.utils import InferenceServerException

from builder.configs import read_config
from builder.manifest import read_manifest
from builder.parity import SENTENCES, parity_inputs
from contract import TEXT, TEXT_PAIR, TRUNCATION_PARAMETER
from devstack.tritonserver import TritonServer
from tests.fixtures.repository import PYTHON_CPU, build_repository
from tests.fixtures.tiny_models import (
    LABELS,
    MAX_POSITIONS,
    NLI_LABELS,
)
from tests.fixtures.triton import serving

SHORT_LEN = 24  # max_seq_len of the `short` models: most pairs below are cut
PAIRS = [
    ("good movie", "the film was great"),
    ("hello", ""),
    ("", "world"),
    ("안녕하세요 영화 정말 좋아요", "这个电影很好"),
    ("the food was terrible and the service slow " * 3, "short answer"),
    ("short question", "a very long text that goes beyond the limit " * 8),
    ("long " * 40, "longer text " * 30),  # both sides cut, longest first
]


@pytest.fixture(scope="module")
def models(pair_model_dirs: dict[str, Path]) -> dict[str, Path]:
    return pair_model_dirs


@pytest.fixture(scope="module")
def repository(models: dict[str, Path], tiny_classifier_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """rr: 1-logit reranker (max_seq_len = the model's 128, as CrossEncoder truncates); rr3: 3 logits scored by
    LABEL_2; nli: pair classifier; short: the reranker at max_seq_len 24; single: a single-text classifier."""
    repo = tmp_path_factory.mktemp("pair_repository") / "model_repository"
    build_repository(repo, [
        {"model": str(models["ce"]), "task": "rerank", "name": "rr"},
        {"model": str(models["ce3"]), "task": "rerank", "name": "rr3", "score_label": "label_2"},
        {"model": str(models["nli"]), "task": "classify", "name": "nli", "pairs": True},
        {"model": str(models["ce"]), "task": "rerank", "name": "short", "max_seq_len": SHORT_LEN},
        {"model": str(tiny_classifier_dir), "task": "classify", "name": "single", "max_seq_len": SHORT_LEN},
    ], **PYTHON_CPU, max_batch_size=8)
    return repo


@pytest.fixture(scope="module")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    with serving(TritonServer(repository=repository, log_path=tmp_path_factory.mktemp("pair_logs") / "triton.log")) as triton:
        yield triton


def _params(repository: Path, entry: str) -> dict[str, str]:
    return {k: v.string_value for k, v in read_config(repository / entry / "config.pbtxt").parameters.items()}


def test_pair_configs_and_parameters(repository: Path, models: dict[str, Path]) -> None:
    for name in ("rr", "rr3", "nli", "short"):
        for entry in (f"{name}_tokenizer", f"{name}_onnx_ensemble"):
            config = read_config(repository / entry / "config.pbtxt")
            assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
                (TEXT, 13, [1]), (TEXT_PAIR, 13, [1])], entry  # 13 = TYPE_STRING
        ensemble = read_config(repository / f"{name}_onnx_ensemble" / "config.pbtxt")
        tok_step = ensemble.ensemble_scheduling.step[0]
        assert dict(tok_step.input_map) == {TEXT: TEXT, TEXT_PAIR: TEXT_PAIR}
    rr = _params(repository, "rr_onnx_ensemble")
    assert rr == {"task": "rerank", "model_name": "rr", "backend": "onnx", "max_seq_len": str(MAX_POSITIONS),
                  "source": str(models["ce"]), "pairs": "true", "labels": '["LABEL_0"]', "score_label": "0",
                  "onnx_accelerator": "none"}
    assert read_config(repository / "rr_onnx_ensemble" / "config.pbtxt").output[0].name == "logits"
    assert (repository / "rr_onnx_ensemble" / "labels.txt").read_text() == "LABEL_0\n"
    rr3 = _params(repository, "rr3_onnx_ensemble")
    assert json.loads(rr3["labels"]) == ["LABEL_0", "LABEL_1", "LABEL_2"] and rr3["score_label"] == "2"
    nli = _params(repository, "nli_onnx_ensemble")
    assert nli["task"] == "classify" and nli["pairs"] == "true" and json.loads(nli["labels"]) == NLI_LABELS
    assert "score_label" not in nli
    single = _params(repository, "single_onnx_ensemble")  # single-text models: no `pairs` key (= false)
    assert "pairs" not in single and json.loads(single["labels"]) == LABELS
    assert [i.name for i in read_config(repository / "single_tokenizer" / "config.pbtxt").input] == [TEXT]
    assert read_manifest(repository / "rr_onnx").settings.pairs  # type: ignore[union-attr]


def test_parity_runs_on_pairs(repository: Path, models: dict[str, Path]) -> None:
    tokenizer = cast(PreTrainedTokenizerFast, AutoTokenizer.from_pretrained(models["ce"]))
    inputs = parity_inputs(tokenizer, SHORT_LEN, pairs=True)
    types = inputs["token_type_ids"]
    assert types.shape[0] == len(SENTENCES) and (types == 1).any(axis=1).sum() >= len(SENTENCES) - 1
    assert inputs["attention_mask"].sum(axis=1).max() == SHORT_LEN  # long pairs cut
    for name in ("rr", "rr3", "nli", "short"):
        (parity,) = read_manifest(repository / f"{name}_onnx").parity  # type: ignore[union-attr]
        assert parity.passed and parity.max_abs_diff <= 1e-4 and parity.argmax_agree, parity


def _infer(server: TritonServer, model: str, pairs: list[tuple[str, str]] | list[str], direction: str | None = None,
           outputs: tuple[str, ...] = ("logits", "num_tokens")) -> dict[str, np.ndarray]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    columns = [[p] if isinstance(p, str) else list(p) for p in pairs]
    inputs = []
    for index, name in enumerate((TEXT, TEXT_PAIR)[:len(columns[0])]):
        data = np.array([[c[index].encode()] for c in columns], dtype=object)
        tensor = grpcclient.InferInput(name, list(data.shape), "BYTES")
        tensor.set_data_from_numpy(data)
        inputs.append(tensor)
    parameters = None if direction is None else {TRUNCATION_PARAMETER: direction}
    result = client.infer(model, inputs, outputs=[grpcclient.InferRequestedOutput(o) for o in outputs],
                          parameters=parameters)
    return {o: result.as_numpy(o) for o in outputs}


@pytest.mark.timeout(300)
def test_rerank_scores_equal_cross_encoder(server: TritonServer, models: dict[str, Path]) -> None:
    result = _infer(server, "rr_onnx_ensemble", PAIRS)
    scores = 1 / (1 + np.exp(-result["logits"][:, 0].astype(np.float64)))  # what the gateway applies
    expected = CrossEncoder(str(models["ce"]), device="cpu").predict(PAIRS)
    np.testing.assert_allclose(scores, expected, atol=1e-5)
    assert np.ptp(expected) > 0.05  # the tiny model's scores differ across pairs
    tokenizer = AutoTokenizer.from_pretrained(models["ce"])
    assert result["num_tokens"][:, 0].tolist() == [len(ids) for ids in _hf(tokenizer, PAIRS)["input_ids"]]
    assert result["num_tokens"][-1, 0] > MAX_POSITIONS


@pytest.mark.timeout(300)
def test_pair_classifier_and_several_logits_equal_cross_encoder(server: TritonServer, models: dict[str, Path]) -> None:
    for name, model in (("nli", "nli"), ("rr3", "ce3")):
        logits = _infer(server, f"{name}_onnx_ensemble", PAIRS)["logits"]
        expected = CrossEncoder(str(models[model]), device="cpu").predict(PAIRS)  # identity activation
        np.testing.assert_allclose(logits, expected, atol=1e-4)


def _tokenize(server: TritonServer, model: str, items: list[tuple[str, str]] | list[str],
              direction: str | None) -> dict[str, np.ndarray]:
    return _infer(server, model, items, direction, ("input_ids", "attention_mask", "token_type_ids", "num_tokens"))


def _hf(tokenizer: PreTrainedTokenizerBase, items: list[tuple[str, str]] | list[str], **kwargs: object) -> BatchEncoding:
    """`transformers` on a batch (as CrossEncoder calls it: an empty second text stays a pair, which a single
    `tokenizer(a, "")` call would drop)."""
    if isinstance(items[0], str):
        return tokenizer(list(items), **kwargs)
    return tokenizer([a for a, _ in items], [b for _, b in items], **kwargs)


def _expected_tokens(model_dir: Path, item: tuple[str, str] | str, direction: str) -> dict[str, list[int]]:
    tokenizer = AutoTokenizer.from_pretrained(model_dir, truncation_side=direction)
    items: Any = [item]
    encoded = _hf(tokenizer, items, truncation=True, max_length=SHORT_LEN)
    return {"input_ids": encoded["input_ids"][0], "token_type_ids": encoded["token_type_ids"][0],
            "num_tokens": [len(_hf(tokenizer, items)["input_ids"][0])]}


def _assert_rows_equal(got: dict[str, np.ndarray], row: int, expected: dict[str, list[int]]) -> None:
    length = len(expected["input_ids"])
    assert got["attention_mask"][row].tolist() == [1] * length + [0] * (got["attention_mask"].shape[1] - length)
    assert got["input_ids"][row, :length].tolist() == expected["input_ids"]
    assert got["token_type_ids"][row, :length].tolist() == expected["token_type_ids"]
    assert got["num_tokens"][row].tolist() == expected["num_tokens"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("direction", [None, "right", "left"])
def test_tokenizer_truncates_pairs_like_transformers(
    server: TritonServer, models: dict[str, Path], tiny_classifier_dir: Path, direction: str | None
) -> None:
    side = direction or "right"
    got = _tokenize(server, "short_tokenizer", PAIRS, direction)
    for row, pair in enumerate(PAIRS):
        _assert_rows_equal(got, row, _expected_tokens(models["ce"], pair, side))
    texts = [a for a, _ in PAIRS]
    got = _tokenize(server, "single_tokenizer", texts, direction)
    for row, text in enumerate(texts):
        _assert_rows_equal(got, row, _expected_tokens(tiny_classifier_dir, text, side))


@pytest.mark.timeout(300)
def test_ensemble_forwards_truncation_direction(server: TritonServer, models: dict[str, Path]) -> None:
    """The ensemble passes its request parameter to the tokenizer: the logits are PyTorch's on left-cut tokens."""
    tokenizer = AutoTokenizer.from_pretrained(models["ce"], truncation_side="left")
    model = AutoModelForSequenceClassification.from_pretrained(models["ce"]).eval()
    left = _infer(server, "short_onnx_ensemble", PAIRS, "left")["logits"][:, 0]
    right = _infer(server, "short_onnx_ensemble", PAIRS, "right")["logits"][:, 0]
    for row, pair in enumerate(PAIRS):
        with torch.inference_mode():
            expected = model(**_hf(tokenizer, [pair], truncation=True, max_length=SHORT_LEN, return_tensors="pt")).logits
        assert left[row] == pytest.approx(float(expected[0, 0]), abs=1e-4)
    cut = [i for i, ids in enumerate(_hf(tokenizer, PAIRS)["input_ids"]) if len(ids) > SHORT_LEN]
    assert cut and any(abs(left[i] - right[i]) > 1e-3 for i in cut)  # the side really changed the result


@pytest.mark.timeout(300)
def test_unknown_truncation_direction_is_an_error(server: TritonServer) -> None:
    for model in ("short_tokenizer", "short_onnx_ensemble"):
        with pytest.raises(InferenceServerException, match="truncation_direction must be 'right' or 'left'"):
            _infer(server, model, PAIRS[:2], "middle", ("num_tokens",))


@pytest.mark.timeout(300)
def test_concurrent_requests_of_both_directions(server: TritonServer, models: dict[str, Path]) -> None:
    """Requests of both sides batched into one execute() are grouped by side: each gets its own tokens."""
    jobs = [(PAIRS[i % len(PAIRS)], ("left", "right", None)[i % 3]) for i in range(24)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        results = list(pool.map(lambda job: _tokenize(server, "short_tokenizer", [job[0]], job[1]), jobs))
    for (pair, direction), got in zip(jobs, results):
        _assert_rows_equal(got, 0, _expected_tokens(models["ce"], pair, direction or "right"))
