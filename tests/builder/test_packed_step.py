"""`--layout packed` end to end: the builder's CPU packed build served by a real tritonserver answers packed
requests (input_ids/token_type_ids [1, T] + cu_seqlens) and padded ones (direct, and through the ensemble) as
PyTorch fp32 does, merged requests as each alone; a request that breaks the layout gets an error of its own.
Also the option's defaults and refusals, and a GPU build made on this CPU machine."""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import torch
import tritonclient.grpc as grpcclient
from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer

from builder.build import plan
from builder.cli import main
from builder.configs import read_config, write_config
from builder.errors import BuildError
from builder.export import RepositoryModel, load_repository_model
from builder.manifest import read_manifest
from builder.parity import compare
from builder.settings import BuildRequest
from contract import (
    ATTENTION_MASK,
    COLBERT_VECTORS,
    CU_SEQLENS,
    INPUT_IDS,
    TOKEN_EMBEDDINGS,
    TOKEN_TYPE_IDS,
    TOKEN_WEIGHTS,
    Param,
)
from contract.packing import pack_padded
from devstack.tritonserver import TritonServer
from tests.fixtures.repository import PYTHON_CPU, TINY_LIMITS, build_repository
from tests.fixtures.tiny_models import vocab_tokens, write_tiny_splade, write_tiny_xlmr
from tests.fixtures.triton import serving
from tests.fixtures.waiting import until, wait_until
from tests.gateway.conftest import running_gateway

MAX_SEQ_LEN = TINY_LIMITS["max_seq_len"]
TEXTS = ["good", "the movie was really good , i would see it again", "안녕하세요 영화 정말 좋아요", "这个电影很好",
         "", "a very long text that goes beyond the limit " * 20]
SECOND = ["is it good ?", "bad", "hello world", "", "fine", "the end"]
# name -> (fixture key, task, pooling); `burst` is the embedder again, with a batcher that waits for 8 rows
MODELS = {"emb": ("bert", "embed", "mean"), "rr": ("bert-rerank", "rerank", None),
          "xr": ("xlmr-rerank", "rerank", None), "m3": ("bge-m3", "embed", None), "burst": ("bert", "embed", "mean")}
FILLED = ("rr", "m3")  # steps whose runs are filled up to a few token counts (contract/packing.py), as a GPU's are


@pytest.fixture(scope="module")
def model_dirs(tiny_embedder_dir: Path, pair_model_dirs: dict[str, Path], tiny_roberta_dirs: dict[str, Path],
               tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    m3 = write_tiny_xlmr(tmp_path_factory.mktemp("packed_m3") / "m3", "bge-m3")  # per-token outputs: all three
    return {"bert": tiny_embedder_dir, "bert-rerank": pair_model_dirs["ce"], "xlmr-rerank": tiny_roberta_dirs["rerank"],
            "bge-m3": m3}


@pytest.fixture(scope="module")
def repository(model_dirs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    repository = tmp_path_factory.mktemp("packed_repository") / "model_repository"
    models: list[dict[str, Any]] = [{"model": str(model_dirs[key]), "task": task, "name": name}
                                    for name, (key, task, _) in MODELS.items()]
    models[-1].update(max_queue_delay_us=2_000_000, preferred_batch_sizes="8")
    build_repository(repository, models, **PYTHON_CPU, **TINY_LIMITS, layout="packed")
    for name in FILLED:  # filled runs, as on a GPU: their answers below must not change
        config = read_config(repository / f"{name}_onnx" / "config.pbtxt")
        config.parameters[Param.FILL_TOKENS].string_value = "true"
        write_config(repository / f"{name}_onnx", config)
    return repository


@pytest.fixture(scope="module")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    with serving(TritonServer(repository, log_path=tmp_path_factory.mktemp("packed_logs") / "tritonserver.log")) as triton:
        yield triton


def _reference(path: Path, task: str, pooling: str | None, tensors: dict[str, np.ndarray]) -> np.ndarray:
    loader = AutoModel if task == "embed" else AutoModelForSequenceClassification
    model = RepositoryModel(loader.from_pretrained(path, attn_implementation="eager").eval(), task, pooling).eval()
    with torch.inference_mode():
        return model(*(torch.from_numpy(tensors[n]) for n in (INPUT_IDS, ATTENTION_MASK, TOKEN_TYPE_IDS))).numpy()


def _tokens(path: Path, pairs: bool) -> dict[str, np.ndarray]:
    batch = AutoTokenizer.from_pretrained(path)(TEXTS, SECOND if pairs else None, truncation=True,
                                                max_length=MAX_SEQ_LEN, padding="longest", return_tensors="np")
    ids = np.asarray(batch[INPUT_IDS], np.int32)  # XLM-R tokenizers give no token types: all 0
    types = np.asarray(batch[TOKEN_TYPE_IDS], np.int32) if TOKEN_TYPE_IDS in batch else np.zeros_like(ids)
    return {INPUT_IDS: ids, ATTENTION_MASK: np.asarray(batch[ATTENTION_MASK], np.int32), TOKEN_TYPE_IDS: types}


def _infer(server: TritonServer, model: str, tensors: dict[str, np.ndarray], output: str) -> np.ndarray:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    inputs = []
    for name, array in tensors.items():
        tensor = grpcclient.InferInput(name, list(array.shape), "BYTES" if array.dtype == object else "INT32")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    try:
        return client.infer(model, inputs, outputs=[grpcclient.InferRequestedOutput(output)]).as_numpy(output)
    finally:
        client.close()


def _packed(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    rows = pack_padded(tensors[INPUT_IDS], tensors[ATTENTION_MASK], tensors[TOKEN_TYPE_IDS])
    return {INPUT_IDS: rows.input_ids[None], TOKEN_TYPE_IDS: rows.token_type_ids[None], CU_SEQLENS: rows.cu_seqlens[None]}


@pytest.mark.slow  # the packed repository built and served: `scripts/test -m slow`
def test_packed_build_config_and_manifest(repository: Path) -> None:
    config = read_config(repository / "emb_onnx" / "config.pbtxt")
    inputs = {i.name: (i.optional, i.allow_ragged_batch) for i in config.input}
    assert inputs == {INPUT_IDS: (False, True), ATTENTION_MASK: (True, True), TOKEN_TYPE_IDS: (False, True),
                      CU_SEQLENS: (True, True)}
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert params[Param.LAYOUT] == "packed" and params[Param.MAX_SEQ_LEN] == str(MAX_SEQ_LEN)
    assert (params[Param.VOCAB_SIZE], params[Param.TYPE_VOCAB_SIZE]) == (str(len(vocab_tokens())), "2")
    assert Param.BATCH_WIDTHS not in params
    assert {"packing.py", "packed_runner.py", "batching.py"} <= {p.name for p in (repository / "emb_onnx" / "1").iterdir()}
    manifest = read_manifest(repository / "emb_onnx")
    assert manifest is not None and manifest.settings.layout == "packed"
    assert (manifest.onnx.layout, manifest.onnx.packed_form) == ("packed", "cpu")
    assert manifest.onnx.fused_ops["MultiHeadAttention"] == 2 and manifest.onnx.fused_ops["EmbedLayerNormalization"] == 1
    assert [p.output for p in manifest.parity] == ["", TOKEN_EMBEDDINGS]  # the pooled output, the per-token one
    assert all(p.passed and p.layout == "packed" and p.ran_on == "CPUExecutionProvider" for p in manifest.parity)


@pytest.mark.slow  # the packed repository built and served: `scripts/test -m slow`
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["emb", "rr", "xr"])
def test_packed_and_padded_requests_match_pytorch(server: TritonServer, model_dirs: dict[str, Path], name: str) -> None:
    key, task, pooling = MODELS[name]
    tensors = _tokens(model_dirs[key], pairs=task == "rerank")
    assert tensors[ATTENTION_MASK][:, -1].any() and (tensors[ATTENTION_MASK].sum(1) < MAX_SEQ_LEN).any()
    want = _reference(model_dirs[key], task, pooling, tensors)
    output = "embeddings" if task == "embed" else "logits"
    texts = {"text": np.array([[t.encode()] for t in TEXTS], dtype=object)}
    if task == "rerank":
        texts["text_pair"] = np.array([[t.encode()] for t in SECOND], dtype=object)
    answers = {"packed": _infer(server, f"{name}_onnx", _packed(tensors), output),
               "padded": _infer(server, f"{name}_onnx", tensors, output),
               "ensemble": _infer(server, f"{name}_onnx_ensemble", texts, output)}
    for kind, got in answers.items():
        assert got.shape == want.shape, kind
        result = compare("onnx", task, want, got, MAX_SEQ_LEN)
        assert result.passed, (kind, result.summary())


@pytest.mark.slow  # the packed repository built and served: `scripts/test -m slow`
@pytest.mark.timeout(300)
def test_per_token_outputs_packed_and_padded(server: TritonServer, repository: Path, model_dirs: dict[str, Path]
                                             ) -> None:
    """bge-m3's per-token outputs (last hidden state, lexical weights, ColBERT vectors): a packed request gets its
    tokens back to back [T, ...], a padded one [rows, width, ...] with zeros after each row, as a padded step
    returns them; both equal PyTorch fp32 on every real token."""
    manifest = read_manifest(repository / "m3_onnx")
    assert manifest is not None and manifest.settings.layout == "packed"
    names = manifest.settings.output_names
    assert names[1:] == [TOKEN_EMBEDDINGS, TOKEN_WEIGHTS, COLBERT_VECTORS]
    assert all(p.passed and p.layout == "packed" for p in manifest.parity) and len(manifest.parity) == 4
    tensors = _tokens(model_dirs["bge-m3"], pairs=False)
    mask = tensors[ATTENTION_MASK].astype(bool)
    model = load_repository_model(model_dirs["bge-m3"], manifest.settings)
    with torch.inference_mode():
        want = [o.numpy() for o in model(*(torch.from_numpy(tensors[n]) for n in (INPUT_IDS, ATTENTION_MASK,
                                                                                 TOKEN_TYPE_IDS)))]
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        for feed in (_packed(tensors), tensors):
            inputs = []
            for name, array in feed.items():
                inputs.append(grpcclient.InferInput(name, list(array.shape), "INT32"))
                inputs[-1].set_data_from_numpy(array)
            result = client.infer("m3_onnx", inputs, outputs=[grpcclient.InferRequestedOutput(n) for n in names])
            for name, expected in zip(names, want):
                got = result.as_numpy(name)
                if name == names[0]:
                    assert compare("onnx", "embed", expected, got, MAX_SEQ_LEN).passed, name
                    continue
                if CU_SEQLENS in feed:  # packed: [T, ...]
                    assert got.shape == (int(mask.sum()), *expected.shape[2:]), (name, got.shape)
                    tokens = got
                else:  # padded: the request's own [rows, width, ...]
                    assert got.shape == expected.shape, (name, got.shape)
                    assert not got[~mask].any(), name  # zeros after each row
                    tokens = got[mask]
                result_ = compare("onnx", "embed", expected[mask].reshape(len(tokens), -1),
                                  tokens.reshape(len(tokens), -1), MAX_SEQ_LEN)
                assert result_.passed, (name, result_.summary())
    finally:
        client.close()


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def gateway(repository: Path, server: TritonServer) -> AsyncIterator[httpx.AsyncClient]:
    """The gateway (scheduler pipeline: it sends packed batches to steps whose config says layout: packed)."""
    async with running_gateway(server.grpc_url, triton_http_url=server.http_address, repository=str(repository), shm_prefix="gw20packed") as (_, http):
        yield http


@pytest.mark.slow  # the packed repository built and served: `scripts/test -m slow`
@pytest.mark.anyio
async def test_gateway_packed_batches_answer_as_pytorch(gateway: httpx.AsyncClient, server: TritonServer,
                                                        model_dirs: dict[str, Path]) -> None:
    """The gateway's packed batches (its scheduler, contract/packing.py's layout) through the packed steps: /embed,
    /rerank (text pairs with both token types) and /embed_all (a per-token output, [T, hidden] per batch) as
    PyTorch fp32 answers them."""
    picks = [0, 1, 2, 3, 5]  # not the empty text: the gateway refuses it
    texts = [TEXTS[i] for i in picks]
    _, before = _stats(server, "emb_onnx")
    response = await gateway.post("/embed", json={"model": "emb", "inputs": texts})
    assert response.status_code == 200, response.text
    # five texts in one packed request (batch 1 for Triton); Triton counts a request once it is released, which
    # can come after its response reached the gateway
    await until(lambda: _stats(server, "emb_onnx")[1] > before, "Triton counted the request")
    assert _stats(server, "emb_onnx")[1] - before == 1
    tensors = _tokens(model_dirs["bert"], pairs=False)
    want = _reference(model_dirs["bert"], "embed", "mean", tensors)[picks]
    assert compare("onnx", "embed", want, np.asarray(response.json()["embeddings"]), MAX_SEQ_LEN).passed
    response = await gateway.post("/rerank", json={"model": "rr", "query": "is it good ?", "texts": texts,
                                                   "raw_scores": True})
    assert response.status_code == 200, response.text
    scores = {item["index"]: item["score"] for item in response.json()}
    batch = AutoTokenizer.from_pretrained(model_dirs["bert-rerank"])(["is it good ?"] * 5, texts, truncation=True,
                                                                     max_length=MAX_SEQ_LEN, padding="longest",
                                                                     return_tensors="np")
    logits = _reference(model_dirs["bert-rerank"], "rerank", None,
                        {n: np.asarray(batch[n], np.int32) for n in (INPUT_IDS, ATTENTION_MASK, TOKEN_TYPE_IDS)})
    np.testing.assert_allclose([scores[i] for i in range(5)], logits[:, 0], atol=1e-4)
    response = await gateway.post("/embed_all", json={"model": "m3", "inputs": texts})
    assert response.status_code == 200, response.text
    tokenizer = AutoTokenizer.from_pretrained(model_dirs["bge-m3"])
    model = AutoModel.from_pretrained(model_dirs["bge-m3"]).eval()
    for got, text in zip(response.json(), texts):
        with torch.inference_mode():
            hidden = model(**tokenizer([text], truncation=True, max_length=MAX_SEQ_LEN,
                                       return_tensors="pt")).last_hidden_state[0].numpy()
        assert np.asarray(got).shape == hidden.shape
        assert compare("onnx", "embed", hidden, np.asarray(got), MAX_SEQ_LEN).min_cosine >= 0.9999


def _stats(server: TritonServer, model: str) -> tuple[int, int]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    finally:
        client.close()
    return int(stats.get("execution_count", 0)), int(stats.get("inference_count", 0))


def _burst(server: TritonServer, calls: list[tuple[str, dict[str, np.ndarray]]]) -> tuple[int, list[np.ndarray | str]]:
    """Send `calls` (model, inputs) at once; the burst model's executions meanwhile, and each answer or error."""
    before, counted = _stats(server, "burst_onnx")

    def call(item: tuple[str, dict[str, np.ndarray]]) -> np.ndarray | str:
        try:
            return _infer(server, item[0], item[1], "embeddings")
        except grpcclient.InferenceServerException as exc:
            return f"{exc.status()} {exc.message()}"

    with ThreadPoolExecutor(len(calls)) as pool:
        answers = list(pool.map(call, calls))
    served = sum(not isinstance(a, str) for a in answers)  # Triton counts a request once released: may lag the answer
    wait_until(lambda: _stats(server, "burst_onnx")[1] - counted >= served, "Triton counted the served requests")
    return _stats(server, "burst_onnx")[0] - before, answers


@pytest.mark.slow  # the packed repository built and served: `scripts/test -m slow`
@pytest.mark.timeout(300)
def test_merged_requests_run_together_and_answer_alone(server: TritonServer, model_dirs: dict[str, Path]) -> None:
    """The batcher of `burst` waits for 8 batch rows (a packed request counts 1, whatever its rows). Eight packed
    requests of different sizes, one of them breaking the layout, share one execute(): the bad one gets its error,
    every other its own rows. Padded requests of several widths share another."""
    tensors = _tokens(model_dirs["bert"], pairs=False)
    want = _reference(model_dirs["bert"], "embed", "mean", tensors)
    parts = [slice(0, 2), slice(2, 3), slice(3, 6), slice(5, 6), slice(0, 6), slice(1, 4), slice(4, 5)]
    packed = [("burst_onnx", _packed({n: a[part] for n, a in tensors.items()})) for part in parts]
    bad = ("burst_onnx", _packed({n: a[:2] for n, a in tensors.items()}) | {CU_SEQLENS: np.array([[0, 3]], np.int32)})
    executions, answers = _burst(server, [*packed[:3], bad, *packed[3:]])
    assert executions == 1, "the packed requests were not merged into one execute()"
    assert isinstance(answers[3], str) and "INVALID_ARG" in answers[3] and "must end at the token count" in answers[3]
    for part, got in zip(parts, answers[:3] + answers[4:]):
        assert not isinstance(got, str), got
        assert compare("onnx", "embed", want[part], got, MAX_SEQ_LEN).passed, part

    lengths = tensors[ATTENTION_MASK].sum(1)
    rows = [slice(0, 4), slice(4, 6), slice(1, 2), slice(3, 4)]  # each request padded to its own longest row
    padded = [("burst_onnx", {n: a[part, :int(lengths[part].max())] for n, a in tensors.items()}) for part in rows]
    assert len({feed[INPUT_IDS].shape[1] for _, feed in padded}) >= 3
    executions, answers = _burst(server, padded)
    assert executions == 1, "the padded requests were not merged into one execute()"
    for part, got in zip(rows, answers):
        assert not isinstance(got, str), got
        assert compare("onnx", "embed", want[part], got, MAX_SEQ_LEN).passed, part


@pytest.mark.slow  # the packed repository built and served: `scripts/test -m slow`
@pytest.mark.timeout(300)
def test_padded_and_packed_requests_do_not_share_an_execution(server: TritonServer, model_dirs: dict[str, Path]) -> None:
    """Triton's batcher merges only requests with the same set of inputs when a model has optional ones (Triton
    core's RequiredEqualInputs), so a padded and a packed request never share an execute() (docs/contract.md);
    arriving together, both are still answered right."""
    tensors = _tokens(model_dirs["bert"], pairs=False)
    want = _reference(model_dirs["bert"], "embed", "mean", tensors)
    first, rest = {n: a[:4] for n, a in tensors.items()}, {n: a[4:] for n, a in tensors.items()}
    executions, answers = _burst(server, [("burst_onnx", _packed(first)), ("burst_onnx", rest)] * 2)
    assert executions >= 2
    for expected, got in zip([want[:4], want[4:]] * 2, answers):
        assert not isinstance(got, str), got
        assert compare("onnx", "embed", expected, got, MAX_SEQ_LEN).passed


BAD_REQUESTS = {
    "cu_seqlens not from 0": ({CU_SEQLENS: [[1, 4]]}, "must start at 0"),
    "cu_seqlens short of T": ({CU_SEQLENS: [[0, 3]]}, "must end at the token count 4"),
    "empty row": ({CU_SEQLENS: [[0, 0, 4]]}, "strictly increasing"),
    "both layouts": ({CU_SEQLENS: [[0, 4]], ATTENTION_MASK: [[1, 1, 1, 1]]}, "exactly one of"),
    "neither layout": ({}, "exactly one of"),
    "packed batch of 2": ({INPUT_IDS: [[2, 5, 6, 3], [2, 5, 6, 3]], TOKEN_TYPE_IDS: [[0] * 4] * 2,
                          CU_SEQLENS: [[0, 4], [0, 4]]}, "batch 1"),
    "row over max_seq_len": ({INPUT_IDS: [[5] * 65], TOKEN_TYPE_IDS: [[0] * 65], CU_SEQLENS: [[0, 65]]},
                             "more than max_seq_len 64"),
    "left-padded mask": ({INPUT_IDS: [[0, 2, 5, 3]], ATTENTION_MASK: [[0, 1, 1, 1]]}, "right padding"),
    "id outside the vocabulary": ({INPUT_IDS: [[2, 5, 100_000, 3]], CU_SEQLENS: [[0, 4]]}, "input_ids must be in 0.."),
    "token type 2": ({TOKEN_TYPE_IDS: [[0, 0, 2, 2]], CU_SEQLENS: [[0, 4]]}, "token_type_ids must be in 0..1"),
}


@pytest.mark.slow  # the packed repository built and served: `scripts/test -m slow`
@pytest.mark.timeout(300)
def test_requests_that_break_the_layout_get_clear_errors(server: TritonServer) -> None:
    for case, (changes, message) in BAD_REQUESTS.items():
        feed = {INPUT_IDS: [[2, 5, 6, 3]], TOKEN_TYPE_IDS: [[0, 0, 0, 0]], **changes}
        with pytest.raises(grpcclient.InferenceServerException, match=message) as error:
            _infer(server, "emb_onnx", {n: np.array(v, np.int32) for n, v in feed.items()}, "embeddings")
        assert error.value.status() == "StatusCode.INVALID_ARGUMENT", case
    good = {INPUT_IDS: np.array([[2, 5, 6, 3]], np.int32), TOKEN_TYPE_IDS: np.zeros((1, 4), np.int32),
            CU_SEQLENS: np.array([[0, 1, 4]], np.int32)}
    assert _infer(server, "emb_onnx", good, "embeddings").shape == (2, 32)  # one request, two rows out


def _settings(model: Path, **options: object) -> tuple[str, list[str]]:
    notices: list[str] = []
    request = BuildRequest.model_validate({"model": str(model), "task": "embed", "name": "m", **options})
    return plan(request, notices).settings.layout, notices


def test_layout_defaults(tiny_embedder_dir: Path, tiny_roberta_dirs: dict[str, Path], tmp_path: Path) -> None:
    assert _settings(tiny_embedder_dir, runtime="python", device="gpu")[0] == "packed"
    assert _settings(tiny_roberta_dirs["embed"], runtime="python", device="gpu")[0] == "packed"
    assert _settings(tiny_embedder_dir, runtime="python", device="cpu")[0] == "padded"
    assert _settings(tiny_embedder_dir, runtime="native", device="gpu", formats="onnx")[0] == "padded"
    assert _settings(tiny_embedder_dir, runtime="python", device="gpu", merge_buckets=False)[0] == "padded"
    assert _settings(tiny_embedder_dir, runtime="python", device="gpu", onnx_optimize=False)[0] == "padded"
    splade = write_tiny_splade(tmp_path / "splade", "st6")  # a SPLADE row has no packed form: padded
    assert _settings(splade, runtime="python", device="gpu", task="sparse-embed")[0] == "padded"
    other = shutil.copytree(tiny_embedder_dir, tmp_path / "electra")  # a family the rewrite does not know
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**config, "model_type": "electra", "embedding_size": 32}))
    layout, notices = _settings(other, runtime="python", device="gpu")
    assert layout == "padded" and any("'electra' models keep the padded layout" in n for n in notices)
    with pytest.raises(BuildError, match="--layout packed supports the bert, camembert, roberta, xlm-roberta"):
        _settings(other, runtime="python", device="gpu", layout="packed")


@pytest.mark.parametrize(("options", "message"), [
    (["--runtime", "native", "--device", "gpu", "--formats", "onnx"], "--layout packed needs --runtime python"),
    (["--runtime", "python", "--no-onnx-optimize"], "needs onnxruntime's optimizer"),
    (["--runtime", "python", "--no-merge-buckets"], "drop --no-merge-buckets"),
    (["--runtime", "python", "--task", "sparse-embed"], "--layout packed is for --task embed, classify or rerank"),
])
def test_packed_layout_refusals(tiny_embedder_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                options: list[str], message: str) -> None:
    task = [] if "--task" in options else ["--task", "embed"]
    argv = ["build", "--model", str(tiny_embedder_dir), *task, "--name", "m", "--repository",
            str(tmp_path / "repo"), "--layout", "packed", *options]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "repo").exists()


@pytest.mark.timeout(300)
def test_gpu_build_here_publishes_the_gpu_form_checked_through_its_cpu_form(tiny_classifier_dir: Path,
                                                                            model_dirs: dict[str, Path],
                                                                            tmp_path: Path) -> None:
    """The default --runtime python --device gpu build on a machine without CUDA: fp16 PackedMultiHeadAttention
    graph, KIND_GPU packed step, parity (every output, bge-m3's per-token ones too) run on the CPU form of the very
    graph published, and the manifest says so."""
    repository = tmp_path / "repo"
    build_repository(repository, [{"model": str(tiny_classifier_dir), "task": "classify", "name": "g"},
                                  {"model": str(model_dirs["bge-m3"]), "task": "embed", "name": "m3"}],
                     runtime="python", device="gpu", formats="onnx", **TINY_LIMITS)
    for name, outputs in (("g", 1), ("m3", 4)):
        manifest = read_manifest(repository / f"{name}_onnx")
        assert manifest is not None and manifest.settings.layout == "packed" and manifest.settings.merge_buckets
        assert (manifest.onnx.layout, manifest.onnx.packed_form, manifest.onnx.precision) == ("packed", "gpu", "fp16")
        assert manifest.onnx.fused_ops["PackedMultiHeadAttention"] == 2
        assert "MultiHeadAttention" not in manifest.onnx.fused_ops
        assert len(manifest.parity) == outputs
        assert all(p.passed and p.layout == "packed" and "CPU form" in p.ran_on for p in manifest.parity)
        config = read_config(repository / f"{name}_onnx" / "config.pbtxt")
        assert config.parameters[Param.LAYOUT].string_value == "packed" and config.instance_group[0].kind == 1  # GPU
        with pytest.raises(Exception, match="PackedMultiHeadAttention"):
            ort.InferenceSession(str(repository / f"{name}_onnx" / "1" / "model.onnx"),
                                 providers=["CPUExecutionProvider"])
