"""TensorRT: profile shapes and configs run everywhere; engine building needs the `tensorrt` package."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc import model_config_pb2 as mc

from builder import configs
from builder.parity import compare, parity_inputs
from builder.settings import ResolvedSettings
from builder.tensorrt_engine import (
    build_engine,
    profile_shapes,
    run_engine,
    tensorrt_available,
)


def _settings(**overrides: object) -> ResolvedSettings:
    values: dict[str, object] = {
        "model": "org/model", "revision": "abc", "task": "classify", "name": "m", "formats": ["onnx", "trt"],
        "max_seq_len": 300, "max_batch_size": 64, "device": "gpu", "runtime": "native", "pooling": None,
        "labels": ["a", "b", "c"], "length_buckets": [16, 32, 64, 128, 256, 512], "dynamic_batching": True,
        "tokenizer_queue_delay_us": 100, "preferred_batch_sizes": [4, 8, 16, 32, 64], "queue_timeout_ms": 5000,
        "max_queue_size": 512, "instances": 2, "tokenizer_instances": 1, "onnx_threads": 0, "opset": 17,
        "trt_opt_batch_size": 8, "trt_workspace_mib": 4096, "skip_parity": False, "onnx_optimize": True,
        "merge_buckets": False, "onnx_precision": "fp16", "max_batch_tokens": 16384, "batch_widths": [16, 300],
        "batch_rows": [8, 64],
    }
    values.update(overrides)
    return ResolvedSettings.model_validate(values)


def test_profile_shapes_follow_settings() -> None:
    shapes = profile_shapes(_settings())
    assert shapes.min == (1, 1) and shapes.opt == (8, 128) and shapes.max == (64, 300)
    small = profile_shapes(_settings(max_seq_len=64, max_batch_size=4, trt_opt_batch_size=8))
    assert small.min == (1, 1) and small.opt == (4, 64) and small.max == (4, 64)
    padded = profile_shapes(_settings(length_buckets=[512], max_seq_len=512, trt_opt_batch_size=16))
    assert padded.opt == (16, 512) and padded.max == (64, 512)


def test_trt_configs() -> None:
    s = _settings()
    config = configs.trt_config(s, width=3)
    assert config.name == "m_trt_fp16" and config.platform == "tensorrt_plan" and config.max_batch_size == 64
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        (n, mc.TYPE_INT32, [-1]) for n in ("input_ids", "attention_mask", "token_type_ids")]
    assert [(o.name, list(o.dims)) for o in config.output] == [("logits", [3])]
    (group,) = config.instance_group
    assert group.kind == mc.ModelInstanceGroup.KIND_GPU and group.count == 2 and list(group.profile) == ["0"]
    assert list(config.dynamic_batching.preferred_batch_size) == [4, 8, 16, 32, 64]
    policy = config.dynamic_batching.default_queue_policy  # the TensorRT step queues like the others
    assert (policy.timeout_action, policy.default_timeout_microseconds, policy.allow_timeout_override,
            policy.max_queue_size) == (mc.ModelQueuePolicy.REJECT, 5_000_000, True, 512)
    ensemble = configs.ensemble_config(s, "trt", width=3)
    assert not ensemble.HasField("dynamic_batching")
    assert ensemble.name == "m_trt_fp16_ensemble"
    assert [st.model_name for st in ensemble.ensemble_scheduling.step] == ["m_tokenizer", "m_trt_fp16"]
    assert ensemble.parameters["backend"].string_value == "trt_fp16"
    assert configs.model_names("m", ["onnx", "trt"]) == {
        "tokenizer": "m_tokenizer", "onnx": "m_onnx", "onnx_ensemble": "m_onnx_ensemble",
        "trt": "m_trt_fp16", "trt_ensemble": "m_trt_fp16_ensemble"}


def test_trt_parity_thresholds() -> None:
    reference = np.array([[1.0, 2.0, 3.0], [3.0, 1.0, 0.0]], dtype=np.float32)
    close = reference + np.float32(0.01)
    assert compare("trt_fp16", "classify", reference, close, 64).passed
    flipped = reference.copy()
    flipped[0] = [3.0, 2.0, 1.0]
    result = compare("trt_fp16", "classify", reference, flipped, 64)
    assert not result.passed and result.argmax_agree is False
    assert not compare("trt_fp16", "embed", reference, -reference, 64).passed


@pytest.mark.tensorrt
@pytest.mark.skipif(not tensorrt_available(), reason="the `tensorrt` Python package is not installed "
                    "(TensorRT cannot be obtained on this machine; runs in the NGC TensorRT image)")
def test_engine_build_and_parity(python_repository: Path, tiny_classifier_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    from builder.export import load_repository_model
    from builder.parity import torch_reference

    s = _settings(model=str(tiny_classifier_dir), max_seq_len=64, max_batch_size=8)
    plan = tmp_path / "model.plan"
    cache = tmp_path / "timing.cache"
    build_engine(python_repository / "tinycls_onnx" / "1" / "model.onnx", plan, profile_shapes(s), cache, 1024)
    assert plan.stat().st_size > 0 and cache.stat().st_size > 0
    inputs = parity_inputs(AutoTokenizer.from_pretrained(tiny_classifier_dir), 64)
    reference = torch_reference(load_repository_model(tiny_classifier_dir, s), inputs)
    assert compare("trt_fp16", "classify", reference, run_engine(plan, inputs, "logits"), 64).passed
    mtime = cache.stat().st_mtime_ns
    build_engine(python_repository / "tinycls_onnx" / "1" / "model.onnx", tmp_path / "again.plan", profile_shapes(s), cache, 1024)
    assert cache.stat().st_mtime_ns >= mtime  # the cache was read and written back
