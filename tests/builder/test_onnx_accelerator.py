"""--onnx-accelerator (issue 12, part 1): the execution accelerators a native GPU build writes into the onnx
step's config for Triton's onnxruntime backend (tensorrt: ONNX Runtime's TensorRT provider; cuda: its CUDA
provider with tuned options), that CPU and python-runtime builds write none, how the default resolves, and
the ensemble parameter the gateway's registry reads.

Configs only: no TensorRT and no onnxruntime backend exist on these machines, so no Triton here loads
these configs. The keys are checked against the ones the backend accepts (src/onnxruntime.cc, r24.12)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from builder import accelerators, configs
from builder.build import plan
from builder.cli import main
from builder.configs import read_config
from builder.errors import UsageError
from builder.manifest import read_manifest
from builder.settings import DEFAULT_ONNX_TRT_CACHE, BuildRequest, ResolvedSettings
from builder.spec import load_spec
from contract import ONNX_ACCELERATORS, Param
from gateway.service.registry import parse_ensemble

BUILD_ID = "0123456789abcdef" * 4  # a fingerprint (sha256 hex)

# The documented blocks (builder/README.md), written out in full: a change here is a contract change.
TENSORRT = {
    "precision_mode": "FP16",
    "max_workspace_size_bytes": "4294967296",  # --trt-workspace-mib 4096
    "trt_engine_cache_enable": "1",
    "trt_engine_cache_path": "/cache/ort-trt",
    "trt_engine_cache_prefix": "m_onnx_0123456789abcdef",
    "trt_profile_min_shapes": "input_ids:1x1,attention_mask:1x1,token_type_ids:1x1",
    "trt_profile_opt_shapes": "input_ids:8x128,attention_mask:8x128,token_type_ids:8x128",
    "trt_profile_max_shapes": "input_ids:64x300,attention_mask:64x300,token_type_ids:64x300",
}
CUDA = {"cudnn_conv_algo_search": "HEURISTIC", "arena_extend_strategy": "kSameAsRequested"}
CUDA_PARAMETERS = {"cudnn_conv_algo_search": "1", "arena_extend_strategy": "1"}  # the same, as model parameters
# What the r24.12 onnxruntime backend accepts for `name: "tensorrt"` (any other key fails the load).
BACKEND_TRT_KEYS = {
    "precision_mode", "max_workspace_size_bytes", "trt_max_partition_iterations", "trt_min_subgraph_size",
    "int8_calibration_table_name", "int8_use_native_calibration_table", "trt_dla_enable", "trt_dla_core",
    "trt_engine_cache_enable", "trt_engine_cache_path", "trt_engine_cache_prefix", "trt_dump_subgraphs",
    "trt_force_sequential_engine_build", "trt_context_memory_sharing_enable", "trt_layer_norm_fp32_fallback",
    "trt_timing_cache_enable", "trt_timing_cache_path", "trt_force_timing_cache", "trt_detailed_build_log",
    "trt_build_heuristics_enable", "trt_sparsity_enable", "trt_builder_optimization_level", "trt_auxiliary_streams",
    "trt_tactic_sources", "trt_extra_plugin_lib_paths", "trt_profile_min_shapes", "trt_profile_max_shapes",
    "trt_profile_opt_shapes", "trt_cuda_graph_enable", "trt_dump_ep_context_model", "trt_ep_context_file_path",
    "trt_ep_context_embed_mode",
}


def _settings(**overrides: Any) -> ResolvedSettings:
    values: dict[str, Any] = {
        "model": "org/model", "revision": "abc", "task": "classify", "name": "m", "formats": ["onnx"],
        "max_seq_len": 300, "max_batch_size": 64, "device": "gpu", "runtime": "native", "pooling": None,
        "labels": ["a", "b", "c"], "length_buckets": [16, 32, 64, 128, 256, 512], "dynamic_batching": True,
        "tokenizer_queue_delay_us": 100, "preferred_batch_sizes": [4, 8, 16, 32, 64], "instances": 1,
        "tokenizer_instances": 1, "onnx_threads": 0, "opset": 17, "trt_opt_batch_size": 8, "trt_workspace_mib": 4096,
        "skip_parity": False, "onnx_optimize": False, "merge_buckets": False, "onnx_precision": "fp32",
        "max_batch_tokens": 16384, "batch_widths": [16, 300], "batch_rows": [8, 64],
        "onnx_accelerator": "tensorrt", "onnx_trt_cache": DEFAULT_ONNX_TRT_CACHE,
    }
    values.update(overrides)
    return ResolvedSettings.model_validate(values)


def _reparsed(config: mc.ModelConfig) -> mc.ModelConfig:
    """The config as Triton reads it: written in text format, parsed back with model_config_pb2."""
    return text_format.Parse(text_format.MessageToString(config), mc.ModelConfig())


def _accelerators(config: mc.ModelConfig) -> list[tuple[str, dict[str, str]]]:
    return [(a.name, dict(a.parameters)) for a in config.optimization.execution_accelerators.gpu_execution_accelerator]


def _model_parameters(config: mc.ModelConfig) -> dict[str, str]:
    return {k: v.string_value for k, v in config.parameters.items()}


def test_tensorrt_block() -> None:
    config = _reparsed(configs.onnx_config(_settings(), 3, "fp32", BUILD_ID))
    assert config.platform == "onnxruntime_onnx" and config.instance_group[0].kind == mc.ModelInstanceGroup.KIND_GPU
    assert _accelerators(config) == [("tensorrt", TENSORRT), ("cuda", CUDA)]
    assert set(TENSORRT) == set(accelerators.TENSORRT_KEYS) and set(TENSORRT) <= BACKEND_TRT_KEYS
    assert TENSORRT["precision_mode"] in ("FP32", "FP16", "INT8")  # the values the backend accepts
    assert not config.optimization.execution_accelerators.cpu_execution_accelerator
    parameters = _model_parameters(config)
    assert {k: parameters[k] for k in CUDA_PARAMETERS} == CUDA_PARAMETERS and parameters["precision"] == "fp32"
    # the workspace and cache directory follow their settings; a build without a fingerprint keeps the entry name
    other = _reparsed(configs.onnx_config(_settings(trt_workspace_mib=1024, onnx_trt_cache="/data/ort"), 3, "fp32"))
    trt = dict(_accelerators(other)[0][1])
    assert (trt["max_workspace_size_bytes"], trt["trt_engine_cache_path"], trt["trt_engine_cache_prefix"]) == (
        str(1 << 30), "/data/ort", "m_onnx")


def test_cuda_block() -> None:
    config = _reparsed(configs.onnx_config(_settings(onnx_accelerator="cuda", onnx_trt_cache=""), 3, "fp16", BUILD_ID))
    assert _accelerators(config) == [("cuda", CUDA)]
    assert {k: v for k, v in _model_parameters(config).items() if k in CUDA_PARAMETERS} == CUDA_PARAMETERS
    # ONNX Runtime's spellings of the same choices (CUDA provider options) and the backend's numbers for them
    assert CUDA["cudnn_conv_algo_search"] == ("EXHAUSTIVE", "HEURISTIC", "DEFAULT")[int(CUDA_PARAMETERS["cudnn_conv_algo_search"])]
    assert CUDA["arena_extend_strategy"] == ("kNextPowerOfTwo", "kSameAsRequested")[int(CUDA_PARAMETERS["arena_extend_strategy"])]


@pytest.mark.parametrize("overrides", [
    {"onnx_accelerator": "none"},
    {"device": "cpu", "onnx_accelerator": "none"},
    {"runtime": "python", "onnx_accelerator": "none"},
    # settings resolved elsewhere (loadtest/model_step.py) with an accelerator but a CPU or python step: nothing
    {"device": "cpu"},
    {"runtime": "python"},
], ids=["none", "cpu", "python", "cpu-tensorrt", "python-tensorrt"])
def test_no_block_without_a_native_gpu_step(overrides: dict[str, Any]) -> None:
    config = _reparsed(configs.onnx_config(_settings(**overrides), 3, "fp32", BUILD_ID))
    assert not config.HasField("optimization")
    assert not set(CUDA_PARAMETERS) & set(config.parameters)


def test_cpu_build_leaves_it_out(python_repository: Path) -> None:
    """The session's real CPU build (--runtime python --device cpu): no accelerator, `none` on the ensemble."""
    for name in ("tinycls", "tinyemb"):
        step = read_config(python_repository / f"{name}_onnx" / "config.pbtxt")
        assert not step.HasField("optimization") and not set(CUDA_PARAMETERS) & set(step.parameters)
        ensemble = read_config(python_repository / f"{name}_onnx_ensemble" / "config.pbtxt")
        assert ensemble.parameters[Param.ONNX_ACCELERATOR].string_value == "none"
        manifest = read_manifest(python_repository / f"{name}_onnx")
        assert manifest is not None and manifest.settings.onnx_accelerator == "none"


def _plan(model: Path, **options: Any) -> ResolvedSettings:
    request = BuildRequest.model_validate({"model": str(model), "task": "embed", "name": "m", "formats": "onnx",
                                           **options})
    return plan(request, []).settings


def test_defaults(tiny_embedder_dir: Path) -> None:
    """cuda for a native GPU build (fp16 optimized graph), none on CPU and with the python runtime; tensorrt
    publishes the plain fp32 export (TensorRT fuses it and picks fp16 itself) unless fp16 is asked for."""
    def facts(s: ResolvedSettings) -> tuple[str, bool, str, str]:
        return s.onnx_accelerator, s.onnx_optimize, s.onnx_precision, s.onnx_trt_cache

    assert facts(_plan(tiny_embedder_dir)) == ("cuda", True, "fp16", "")
    assert facts(_plan(tiny_embedder_dir, device="cpu")) == ("none", True, "fp32", "")
    assert facts(_plan(tiny_embedder_dir, runtime="python")) == ("none", True, "fp16", "")
    assert facts(_plan(tiny_embedder_dir, onnx_accelerator="none")) == ("none", True, "fp16", "")
    assert facts(_plan(tiny_embedder_dir, onnx_accelerator="tensorrt")) == ("tensorrt", False, "fp32", "/cache/ort-trt")
    assert facts(_plan(tiny_embedder_dir, onnx_accelerator="tensorrt", onnx_precision="fp16",
                       onnx_trt_cache="/data/ort")) == ("tensorrt", True, "fp16", "/data/ort")
    assert facts(_plan(tiny_embedder_dir, onnx_accelerator="tensorrt", onnx_optimize=True)) == (
        "tensorrt", True, "fp32", "/cache/ort-trt")


@pytest.mark.parametrize(("options", "message"), [
    ({"device": "cpu", "onnx_accelerator": "tensorrt"}, "--onnx-accelerator tensorrt needs --device gpu"),
    ({"device": "cpu", "onnx_accelerator": "cuda"}, "--onnx-accelerator cuda needs --device gpu"),
    ({"runtime": "python", "onnx_accelerator": "tensorrt"}, "--onnx-accelerator tensorrt needs --runtime native"),
    ({"runtime": "python", "onnx_accelerator": "cuda"}, "--onnx-accelerator cuda needs --runtime native"),
])
def test_contradictions_are_usage_errors(tiny_embedder_dir: Path, options: dict[str, Any], message: str) -> None:
    with pytest.raises(UsageError, match=message):
        _plan(tiny_embedder_dir, **options)


def test_spec_keys(tmp_path: Path) -> None:
    spec = tmp_path / "models.yaml"
    spec.write_text("defaults: {onnx-accelerator: tensorrt, onnx_trt_cache: /data/ort}\n"
                    "models:\n  - {name: a, model: org/a, task: embed}\n"
                    "  - {name: b, model: org/b, task: embed, onnx_accelerator: cuda}\n")
    a, b = load_spec(spec)
    assert (a.onnx_accelerator, a.onnx_trt_cache, b.onnx_accelerator) == ("tensorrt", "/data/ort", "cuda")
    for bad in ("onnx_accelerator: openvino", "onnx_trt_cache: relative/dir"):
        spec.write_text(f"models:\n  - {{name: a, model: org/a, task: embed, {bad}}}\n")
        with pytest.raises(UsageError, match="invalid onnx-"):
            load_spec(spec)


def test_registry_reads_the_ensemble_parameter() -> None:
    """The builder's onnx ensemble carries the accelerator; the gateway's registry reads it (absent: none)."""
    for accelerator in ONNX_ACCELERATORS:
        ensemble = _reparsed(configs.ensemble_config(_settings(onnx_accelerator=accelerator), "onnx", 3))
        assert ensemble.parameters[Param.ONNX_ACCELERATOR].string_value == accelerator
        parsed = parse_ensemble(ensemble)
        assert parsed is not None and parsed[1].backend == "onnx" and parsed[1].accelerator == accelerator
    older = configs.ensemble_config(_settings(), "onnx", 3)
    del older.parameters[Param.ONNX_ACCELERATOR]  # a repository built before the parameter
    assert parse_ensemble(older)[1].accelerator == "none"  # type: ignore[index]
    older.parameters[Param.ONNX_ACCELERATOR].string_value = "openvino"
    with pytest.raises(ValueError, match="onnx_accelerator must be one of tensorrt, cuda, none"):
        parse_ensemble(older)
    trt = configs.ensemble_config(_settings(formats=["onnx", "trt"]), "trt", 3)
    assert Param.ONNX_ACCELERATOR not in trt.parameters and parse_ensemble(trt)[1].accelerator == "none"  # type: ignore[index]


def test_real_gpu_builds(tiny_embedder_dir: Path, tmp_path: Path) -> None:
    """The CLI builds native GPU repositories here too (export, parity on the CPU provider), without loading
    them: tensorrt and the default (cuda) as the builder writes them to disk, the engine prefix from the fingerprint."""
    spec = tmp_path / "models.yaml"
    spec.write_text(f"defaults: {{model: {tiny_embedder_dir}, task: embed, device: gpu, runtime: native, formats: onnx,"
                    " max_seq_len: 64, max_batch_size: 8}\n"
                    "models:\n  - {name: trt, onnx_accelerator: tensorrt}\n  - {name: cu}\n")
    repository = tmp_path / "model_repository"
    assert main(["build", "--spec", str(spec), "--repository", str(repository)]) == 0
    for name, accelerator in (("trt", "tensorrt"), ("cu", "cuda")):
        step = read_config(repository / f"{name}_onnx" / "config.pbtxt")
        manifest = read_manifest(repository / f"{name}_onnx")
        assert manifest is not None and manifest.settings.onnx_accelerator == accelerator
        written = _accelerators(step)
        assert [n for n, _ in written] == (["tensorrt", "cuda"] if accelerator == "tensorrt" else ["cuda"])
        assert written[-1][1] == CUDA
        ensemble = read_config(repository / f"{name}_onnx_ensemble" / "config.pbtxt")
        assert ensemble.parameters[Param.ONNX_ACCELERATOR].string_value == accelerator
    trt = dict(_accelerators(read_config(repository / "trt_onnx" / "config.pbtxt"))[0][1])
    manifest = read_manifest(repository / "trt_onnx")
    assert manifest is not None and trt["trt_engine_cache_prefix"] == f"trt_onnx_{manifest.fingerprint[:16]}"
    assert trt["trt_profile_max_shapes"] == "input_ids:8x64,attention_mask:8x64,token_type_ids:8x64"
    assert (manifest.settings.onnx_precision, manifest.onnx.optimized) == ("fp32", False)  # the plain export
    cu = read_manifest(repository / "cu_onnx")
    assert cu is not None and (cu.settings.onnx_precision, cu.onnx.optimized) == ("fp16", True)
