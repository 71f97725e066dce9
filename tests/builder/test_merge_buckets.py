"""--merge-buckets: the dynamic batcher merges requests of different length buckets into one
model-step execution, and the results stay those of each text alone (real tritonserver)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from builder.errors import BuildError
from devstack.tritonserver import TritonServer
from tests.fixtures.repository import PYTHON_CPU, TINY_LIMITS, build_repository
from tests.fixtures.triton import serving

SHORT = "good movie"  # bucket 16
LONG = "the food was terrible and the service slow " * 4  # bucket 64


def _embed(url: str, text: str) -> np.ndarray:
    client = grpcclient.InferenceServerClient(url)
    inp = grpcclient.InferInput("text", [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[text.encode()]], dtype=object))
    return client.infer("m_onnx_ensemble", [inp]).as_numpy("embeddings")[0]


def _step_counts(url: str) -> tuple[int, int]:
    stats = grpcclient.InferenceServerClient(url).get_inference_statistics("m_onnx", as_json=True)
    model = stats["model_stats"][0]
    return int(model.get("inference_count", 0)), int(model.get("execution_count", 0))


@pytest.mark.slow  # a repository built and served for merged buckets: `scripts/test -m slow`
@pytest.mark.timeout(300)
def test_merged_buckets_batch_together_and_match_single_requests(tiny_embedder_dir: Path, tmp_path: Path) -> None:
    repository = tmp_path / "repo"
    # A long queue delay and one preferred size (the max batch, 8) make the batcher wait for the
    # whole burst of 8, so one execution means the two buckets were merged.
    build_repository(repository, [{"model": str(tiny_embedder_dir), "task": "embed", "name": "m"}],
                     **PYTHON_CPU, **TINY_LIMITS, merge_buckets=True, max_queue_delay_us=500_000,
                     preferred_batch_sizes="8")
    config = text_format.Parse((repository / "m_onnx" / "config.pbtxt").read_text(), mc.ModelConfig())
    assert all(i.allow_ragged_batch for i in config.input)

    with serving(TritonServer(repository, log_path=tmp_path / "triton.log")) as server:
        alone = {t: _embed(server.grpc_url, t) for t in (SHORT, LONG)}
        before_inferences, before_executions = _step_counts(server.grpc_url)
        texts = [SHORT, LONG] * 4
        with ThreadPoolExecutor(len(texts)) as pool:
            burst = list(pool.map(lambda t: _embed(server.grpc_url, t), texts))
        inferences, executions = _step_counts(server.grpc_url)

    assert inferences - before_inferences == len(texts)
    # Without ragged batching the two buckets could never share an execution: at least 2.
    assert executions - before_executions == 1, (executions - before_executions)
    for text, got in zip(texts, burst):
        np.testing.assert_allclose(got, alone[text], atol=1e-5)


def test_merge_buckets_needs_the_python_runtime(tiny_embedder_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="--merge-buckets needs --runtime python"):
        build_repository(tmp_path / "repo", [{"model": str(tiny_embedder_dir), "task": "embed", "name": "m"}],
                         formats="onnx", device="cpu", merge_buckets=True)
    assert not (tmp_path / "repo").exists()


def test_merge_buckets_defaults_to_on_for_gpu_python_runtime_only(tiny_embedder_dir: Path) -> None:
    from builder.build import plan
    from builder.settings import BuildRequest

    def merged(**options: object) -> bool:
        request = BuildRequest.model_validate({"model": str(tiny_embedder_dir), "task": "embed", "name": "m", **options})
        return plan(request, []).settings.merge_buckets

    assert merged(runtime="python", device="gpu") is True
    assert merged(runtime="python", device="cpu") is False
    assert merged(runtime="python", device="gpu", merge_buckets=False) is False
    assert merged(runtime="native", device="gpu", formats="onnx") is False


@pytest.mark.slow  # a repository built and served for merged buckets: `scripts/test -m slow`
@pytest.mark.timeout(300)
def test_declared_shapes_are_warmed_at_load_and_kept_to(tiny_embedder_dir: Path, tmp_path: Path) -> None:
    """--batch-widths/--batch-rows: the runner runs every declared shape once at load, then cuts merged
    batches to declared shapes (dummy rows or split rows), and every text still gets its own result."""
    repository = tmp_path / "repo"
    build_repository(repository, [{"model": str(tiny_embedder_dir), "task": "embed", "name": "m"}],
                     **PYTHON_CPU, **TINY_LIMITS, merge_buckets=True, max_queue_delay_us=500_000,
                     preferred_batch_sizes="8", batch_widths="16,32,64", batch_rows="1,2,4,8")
    config = text_format.Parse((repository / "m_onnx" / "config.pbtxt").read_text(), mc.ModelConfig())
    assert config.parameters["batch_widths"].string_value == "16,32,64"
    assert config.parameters["batch_rows"].string_value == "1,2,4,8"
    log = tmp_path / "triton.log"
    with serving(TritonServer(repository, log_path=log)) as server:
        alone = {t: _embed(server.grpc_url, t) for t in (SHORT, LONG)}
        texts = [SHORT, LONG, SHORT, SHORT, SHORT, LONG, SHORT]  # 7 texts of two widths in one execution
        with ThreadPoolExecutor(len(texts)) as pool:
            burst = list(pool.map(lambda t: _embed(server.grpc_url, t), texts))
    assert "12 shapes warmed" in log.read_text()  # 3 widths x 4 row counts
    for text, got in zip(texts, burst):
        np.testing.assert_allclose(got, alone[text], atol=1e-5)


def test_declared_shapes_must_end_with_the_limits(tiny_embedder_dir: Path, tmp_path: Path) -> None:
    model = [{"model": str(tiny_embedder_dir), "task": "embed", "name": "m"}]
    with pytest.raises(BuildError, match="--batch-widths must be positive and end with max-seq-len"):
        build_repository(tmp_path / "r", model, **PYTHON_CPU, **TINY_LIMITS, batch_widths="16,32", batch_rows="8")
    with pytest.raises(BuildError, match="together"):
        build_repository(tmp_path / "r", model, **PYTHON_CPU, **TINY_LIMITS, batch_widths="16,64")


def test_declared_shapes_default_on_gpu_only(tiny_embedder_dir: Path) -> None:
    from builder.build import plan
    from builder.settings import BuildRequest

    def shapes(**options: object) -> tuple[list[int], list[int]]:
        request = BuildRequest.model_validate({"model": str(tiny_embedder_dir), "task": "embed", "name": "m", **options})
        settings = plan(request, []).settings
        return settings.batch_widths, settings.batch_rows

    widths, rows = shapes(runtime="python", device="gpu", max_batch_size=48)  # the tiny model's limit: 128
    assert widths == [8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128] and rows == [1, 2, 4, 8, 16, 32, 48]
    assert shapes(runtime="python", device="cpu") == ([], [])


@pytest.mark.timeout(300)
def test_merged_requests_get_the_outputs_each_asked_for(tiny_embedder_dir: Path, tmp_path: Path) -> None:
    """Issue 23: requests of different widths merged into one execution, some asking for the per-token
    `token_embeddings`, others for the pooled `embeddings`: each gets its own output, at its own width, equal
    to onnxruntime on that request alone."""
    import onnxruntime as ort

    repository = tmp_path / "repo"
    build_repository(repository, [{"model": str(tiny_embedder_dir), "task": "embed", "name": "m"}],
                     **PYTHON_CPU, **TINY_LIMITS, merge_buckets=True, max_queue_delay_us=500_000,
                     preferred_batch_sizes="8")
    rng = np.random.default_rng(0)
    requests = []
    for k, width in enumerate((5, 23, 9, 40, 5, 17, 31, 12)):
        ids = rng.integers(5, 100, size=(1, width), dtype=np.int32)
        mask = np.ones((1, width), np.int32)
        mask[0, width - k % 3:] = 0  # some right padding inside the request, as the tokenizer pads to buckets
        requests.append(({"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)},
                         "token_embeddings" if k % 2 else "embeddings"))
    session = ort.InferenceSession(str(repository / "m_onnx" / "1" / "model.onnx"))
    want = [session.run([name], feed)[0] for feed, name in requests]

    def infer(url: str, feed: dict[str, np.ndarray], name: str) -> np.ndarray:
        inputs = []
        for key, value in feed.items():
            inputs.append(grpcclient.InferInput(key, list(value.shape), "INT32"))
            inputs[-1].set_data_from_numpy(value)
        result = grpcclient.InferenceServerClient(url).infer("m_onnx", inputs,
                                                             outputs=[grpcclient.InferRequestedOutput(name)])
        assert result.as_numpy("embeddings" if name == "token_embeddings" else "token_embeddings") is None
        return result.as_numpy(name)

    with serving(TritonServer(repository, log_path=tmp_path / "triton.log")) as server:
        before = _step_counts(server.grpc_url)[1]
        with ThreadPoolExecutor(len(requests)) as pool:
            got = list(pool.map(lambda r: infer(server.grpc_url, *r), requests))
        executions = _step_counts(server.grpc_url)[1] - before
    assert executions == 1  # merged
    for (feed, name), g, w in zip(requests, got, want):
        assert g.shape == w.shape, name
        if name == "token_embeddings":  # the request's own tokens; its padding positions are anyone's
            real = feed["attention_mask"][0].astype(bool)
            g, w = g[0][real], w[0][real]
        np.testing.assert_allclose(g, w, atol=1e-5)
