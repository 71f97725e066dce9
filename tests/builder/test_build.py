"""Builder output: layout, configs parsed back as ModelConfig, manifest, parity, idempotence, rebuilds."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from builder import onnx_parity
from builder.configs import read_config
from builder.errors import BuildError
from builder.manifest import MANIFEST_FILE, read_manifest
from tests.builder.helpers import staging_leftovers, tree_hash
from tests.fixtures.repository import PYTHON_CPU, TINY_LIMITS, build_repository
from tests.fixtures.tiny_models import LABELS

CLS_ENTRIES = ["tinycls_tokenizer", "tinycls_onnx", "tinycls_onnx_ensemble"]
EMB_ENTRIES = ["tinyemb_tokenizer", "tinyemb_onnx", "tinyemb_onnx_ensemble"]


def _models(cls_dir: Path, emb_dir: Path) -> list[dict[str, str]]:
    return [
        {"model": str(cls_dir), "task": "classify", "name": "tinycls"},
        {"model": str(emb_dir), "task": "embed", "name": "tinyemb"},
    ]


def _written(folder: Path) -> set[str]:
    """The names in a version folder that the builder wrote: a tritonserver that served this (shared) repository
    in an earlier test leaves the stub's `__pycache__` beside model.py."""
    return {p.name for p in folder.iterdir() if p.name != "__pycache__"}


def test_layout(python_repository: Path) -> None:
    names = sorted(p.name for p in python_repository.iterdir())
    assert names == sorted(CLS_ENTRIES + EMB_ENTRIES)
    for entry in CLS_ENTRIES + EMB_ENTRIES:
        assert (python_repository / entry / "config.pbtxt").is_file()
        assert (python_repository / entry / "1").is_dir()
        assert (python_repository / entry / MANIFEST_FILE).is_file()
    for name in ("tinycls", "tinyemb"):
        tokenizer_files = _written(python_repository / f"{name}_tokenizer" / "1")
        assert tokenizer_files == {"model.py", "tokenizer.json", "tokenization.py", "cancellation.py"}
        step_files = _written(python_repository / f"{name}_onnx" / "1")
        assert step_files == {"model.py", "model.onnx", "batching.py", "cancellation.py"}
    assert (python_repository / "tinycls_onnx_ensemble" / "labels.txt").read_text().splitlines() == LABELS
    assert not (python_repository / "tinyemb_onnx_ensemble" / "labels.txt").exists()
    assert staging_leftovers(python_repository) == []


def test_onnx_interface(python_repository: Path) -> None:
    for name, output, width in (("tinycls", "logits", 3), ("tinyemb", "embeddings", 32)):
        model = onnx.load(str(python_repository / f"{name}_onnx" / "1" / "model.onnx"))
        inputs = {i.name: i for i in model.graph.input}
        assert list(inputs) == ["input_ids", "attention_mask", "token_type_ids"]
        for tensor in inputs.values():
            assert tensor.type.tensor_type.elem_type == onnx.TensorProto.INT32
            dims = tensor.type.tensor_type.shape.dim
            assert [d.dim_param for d in dims] == ["batch", "sequence"]
        out, *per_token = model.graph.output  # embedders also return their last hidden state (/embed_all)
        assert out.name == output and out.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
        assert [o.name for o in per_token] == ([] if name == "tinycls" else ["token_embeddings"])
        session = ort.InferenceSession(str(python_repository / f"{name}_onnx" / "1" / "model.onnx"))
        for batch, seq in ((1, 3), (5, 40)):
            ones = np.ones((batch, seq), dtype=np.int32)
            result = session.run(None, {"input_ids": ones * 7, "attention_mask": ones, "token_type_ids": ones * 0})[0]
            assert result.shape == (batch, width)


def test_configs_parse_back(python_repository: Path) -> None:
    tok = read_config(python_repository / "tinycls_tokenizer" / "config.pbtxt")
    assert tok.backend == "python" and tok.max_batch_size == 8
    assert [(i.name, i.data_type, list(i.dims)) for i in tok.input] == [("text", mc.TYPE_STRING, [1])]
    assert [(o.name, o.data_type, list(o.dims)) for o in tok.output] == [
        ("input_ids", mc.TYPE_INT32, [-1]), ("attention_mask", mc.TYPE_INT32, [-1]),
        ("token_type_ids", mc.TYPE_INT32, [-1]), ("num_tokens", mc.TYPE_INT32, [1])]
    assert tok.parameters["length_buckets"].string_value == "16,32,64"
    assert tok.parameters["max_seq_len"].string_value == "64"
    assert tok.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU

    step = read_config(python_repository / "tinycls_onnx" / "config.pbtxt")
    assert step.backend == "python" and step.platform == ""
    assert [i.name for i in step.input] == ["input_ids", "attention_mask", "token_type_ids"]
    assert all(i.data_type == mc.TYPE_INT32 and list(i.dims) == [-1] for i in step.input)
    assert [(o.name, list(o.dims)) for o in step.output] == [("logits", [3])]
    assert step.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU and step.instance_group[0].count == 1
    assert list(step.dynamic_batching.preferred_batch_size) == [4, 8]
    assert step.dynamic_batching.max_queue_delay_microseconds == 0  # its callers batch; the tokenizer waits 100 us
    tokenizer = read_config(python_repository / "tinycls_tokenizer" / "config.pbtxt")
    assert tokenizer.dynamic_batching.max_queue_delay_microseconds == 100

    ens = read_config(python_repository / "tinycls_onnx_ensemble" / "config.pbtxt")
    assert ens.platform == "ensemble" and ens.max_batch_size == 8
    assert [(o.name, o.label_filename) for o in ens.output] == [("logits", "labels.txt"), ("num_tokens", "")]
    assert [s.model_name for s in ens.ensemble_scheduling.step] == ["tinycls_tokenizer", "tinycls_onnx"]
    params = {k: v.string_value for k, v in ens.parameters.items()}
    assert params == {"task": "classify", "model_name": "tinycls", "backend": "onnx", "max_seq_len": "64",
                      "labels": json.dumps(LABELS, separators=(",", ":")), "source": params["source"],
                      "onnx_accelerator": "none"}
    assert Path(params["source"]).is_dir()

    emb = read_config(python_repository / "tinyemb_onnx_ensemble" / "config.pbtxt")
    params = {k: v.string_value for k, v in emb.parameters.items()}
    assert params["task"] == "embed" and params["embedding_dim"] == "32" and params["pooling"] == "mean"
    assert [(o.name, list(o.dims)) for o in emb.output] == [("embeddings", [32]), ("num_tokens", [1])]


def test_manifest(python_repository: Path, tiny_classifier_dir: Path) -> None:
    manifest = read_manifest(python_repository / "tinycls_onnx")
    assert manifest is not None
    assert manifest.source["path"] == str(tiny_classifier_dir.resolve())
    assert set(manifest.source["files"]) >= {"config.json", "model.safetensors", "tokenizer.json"}
    assert all(len(h) == 64 for h in manifest.source["files"].values())
    assert manifest.settings.max_seq_len == 64 and manifest.settings.runtime == "python"
    assert manifest.settings.labels == LABELS and manifest.settings.formats == ["onnx"]
    assert {"torch", "transformers", "onnx", "onnxruntime", "tokenizers"} <= set(manifest.versions)
    assert manifest.gpu is None  # no engine built
    (parity,) = manifest.parity
    assert parity.artifact == "onnx" and parity.passed and parity.max_abs_diff <= 1e-4 and parity.argmax_agree
    assert parity.sentences >= 6
    assert manifest.onnx.optimized and manifest.onnx.fused_ops["Attention"] == 2 and manifest.onnx.ops["Attention"] == 2
    emb = read_manifest(python_repository / "tinyemb_onnx_ensemble")
    assert emb is not None and emb.settings.pooling == "mean" and emb.parity[0].min_cosine >= 0.99999
    # every entry of one model carries the same manifest
    assert read_manifest(python_repository / "tinycls_tokenizer") == manifest


def test_idempotent_then_rebuild_on_change(tiny_classifier_dir: Path, tiny_embedder_dir: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    models = _models(tiny_classifier_dir, tiny_embedder_dir)
    first = build_repository(repo, models, **PYTHON_CPU, **TINY_LIMITS)
    assert [o.skipped for o in first] == [False, False]
    before = tree_hash(repo)
    again = build_repository(repo, models, **PYTHON_CPU, **TINY_LIMITS)
    assert [o.skipped for o in again] == [True, True]
    assert tree_hash(repo) == before
    # one changed setting rebuilds that model only
    changed = build_repository(repo, models, **PYTHON_CPU, **TINY_LIMITS, max_queue_delay_us=500)
    assert [o.skipped for o in changed] == [False, False]
    step = read_config(repo / "tinyemb_onnx" / "config.pbtxt")
    assert step.dynamic_batching.max_queue_delay_microseconds == 500
    only_emb = build_repository(repo, [{**models[0]}, {**models[1], "length_buckets": "64"}], **PYTHON_CPU, **TINY_LIMITS,
                                max_queue_delay_us=500)
    assert [o.skipped for o in only_emb] == [True, False]
    assert read_config(repo / "tinyemb_tokenizer" / "config.pbtxt").parameters["length_buckets"].string_value == "64"
    assert staging_leftovers(repo) == []


def test_changed_source_rebuilds(tiny_embedder_dir: Path, tmp_path: Path) -> None:
    source = tmp_path / "model"
    shutil.copytree(tiny_embedder_dir, source)
    repo = tmp_path / "repo"
    model = [{"model": str(source), "task": "embed", "name": "e"}]
    assert not build_repository(repo, model, **PYTHON_CPU, **TINY_LIMITS)[0].skipped
    assert build_repository(repo, model, **PYTHON_CPU, **TINY_LIMITS)[0].skipped
    config = json.loads((source / "config.json").read_text())
    config["layer_norm_eps"] = 1e-6
    (source / "config.json").write_text(json.dumps(config))
    assert not build_repository(repo, model, **PYTHON_CPU, **TINY_LIMITS)[0].skipped


def test_no_dynamic_batching_and_instances(tiny_embedder_dir: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    build_repository(repo, [{"model": str(tiny_embedder_dir), "task": "embed", "name": "e", "pooling": "cls"}],
                     runtime="native", formats="onnx", device="gpu", max_batch_size=32, dynamic_batching=False,
                     instances=3, tokenizer_instances=2, length_buckets="512", onnx_optimize=False, onnx_threads=2)
    facts = read_manifest(repo / "e_onnx").onnx  # type: ignore[union-attr]
    assert not facts.optimized and facts.fused_ops == {} and "Attention" not in facts.ops and facts.ops["Softmax"] == 2
    step = read_config(repo / "e_onnx" / "config.pbtxt")
    assert step.platform == "onnxruntime_onnx" and step.backend == ""
    assert not step.HasField("dynamic_batching")
    assert step.instance_group[0].kind == mc.ModelInstanceGroup.KIND_GPU and step.instance_group[0].count == 3
    # no GPU list: Triton puts the instances on every GPU it sees (compose gives it every GPU of the host)
    assert all(not group.gpus for group in step.instance_group)
    assert not (repo / "e_onnx" / "1" / "model.py").exists()
    assert step.parameters["intra_op_thread_count"].string_value == "2"
    tok = read_config(repo / "e_tokenizer" / "config.pbtxt")
    assert tok.instance_group[0].count == 2 and tok.instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU
    # model limit is 128 positions: one bucket of 512 caps to max_seq_len = pad everything to 128
    assert tok.parameters["length_buckets"].string_value == "128"
    ens = read_config(repo / "e_onnx_ensemble" / "config.pbtxt")
    assert ens.parameters["pooling"].string_value == "cls" and ens.parameters["max_seq_len"].string_value == "128"


def test_base_checkpoint_classify_needs_labels(tiny_embedder_dir: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    model = {"model": str(tiny_embedder_dir), "task": "classify", "name": "c"}
    with pytest.raises(BuildError, match="no sequence-classification head"):
        build_repository(repo, [model], **PYTHON_CPU, **TINY_LIMITS)
    assert not repo.exists()
    messages: list[str] = []
    build_repository(repo, [{**model, "labels": "a,b"}], log=messages.append, **PYTHON_CPU, **TINY_LIMITS)
    assert any("randomly initialised" in m for m in messages)
    assert (repo / "c_onnx_ensemble" / "labels.txt").read_text() == "a\nb\n"
    assert read_manifest(repo / "c_onnx").parity[0].passed  # type: ignore[union-attr]


def test_parity_failure_publishes_nothing(
    python_repository: Path, tiny_classifier_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(python_repository, repo)
    before = tree_hash(repo)
    real = onnx_parity.onnx_outputs

    def skewed(path: Path, inputs: dict[str, np.ndarray], output: str, device: str, runtime: str) -> np.ndarray:
        return real(path, inputs, output, device, runtime) + np.float32(1e-3)  # a real run, off by more than 1e-4

    monkeypatch.setattr(onnx_parity, "onnx_outputs", skewed)
    model = [{"model": str(tiny_classifier_dir), "task": "classify", "name": "tinycls", "max_queue_delay_us": 7}]
    with pytest.raises(BuildError, match=r"parity failed.*max_abs_diff=0\.001"):
        build_repository(repo, model, **PYTHON_CPU, **TINY_LIMITS)
    assert tree_hash(repo) == before
    assert staging_leftovers(repo) == []
