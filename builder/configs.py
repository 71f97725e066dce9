"""Triton `ModelConfig` messages for every repository entry (docs/contract.md), and writing them."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import orjson
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from builder.settings import ResolvedSettings, effective_buckets

TOKEN_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
LABELS_FILE = "labels.txt"


def model_names(name: str, formats: Sequence[str]) -> dict[str, str]:
    """Repository entry names: tokenizer, and step + ensemble per format ("onnx", "trt")."""
    names = {"tokenizer": f"{name}_tokenizer"}
    for fmt in formats:
        step = f"{name}_onnx" if fmt == "onnx" else f"{name}_trt_fp16"
        names[fmt] = step
        names[f"{fmt}_ensemble"] = f"{step}_ensemble"
    return names


def _batching(config: mc.ModelConfig, settings: ResolvedSettings) -> None:
    if settings.dynamic_batching:
        config.dynamic_batching.preferred_batch_size.extend(settings.preferred_batch_sizes)
        config.dynamic_batching.max_queue_delay_microseconds = settings.max_queue_delay_us


def _kind(settings: ResolvedSettings) -> int:
    return mc.ModelInstanceGroup.KIND_GPU if settings.device == "gpu" else mc.ModelInstanceGroup.KIND_CPU


def _set_parameters(config: mc.ModelConfig, values: dict[str, str]) -> None:
    for key, value in values.items():
        config.parameters[key].string_value = value


def tokenizer_config(settings: ResolvedSettings, pad_token_id: int) -> mc.ModelConfig:
    """Python-backend tokenizer: text -> INT32 token tensors + num_tokens (always on CPU)."""
    config = mc.ModelConfig(name=model_names(settings.name, [])["tokenizer"], backend="python",
                            max_batch_size=settings.max_batch_size)
    config.input.add(name="text", data_type=mc.TYPE_STRING, dims=[1])
    for name in TOKEN_INPUTS:
        config.output.add(name=name, data_type=mc.TYPE_INT32, dims=[-1])
    config.output.add(name="num_tokens", data_type=mc.TYPE_INT32, dims=[1])
    config.instance_group.add(kind=mc.ModelInstanceGroup.KIND_CPU, count=settings.tokenizer_instances)
    _batching(config, settings)
    _set_parameters(config, {
        "max_seq_len": str(settings.max_seq_len),
        "length_buckets": ",".join(str(b) for b in effective_buckets(settings.length_buckets, settings.max_seq_len)),
        "pad_token_id": str(pad_token_id),
    })
    return config


def _step_io(config: mc.ModelConfig, settings: ResolvedSettings, width: int) -> None:
    for name in TOKEN_INPUTS:
        config.input.add(name=name, data_type=mc.TYPE_INT32, dims=[-1])
    config.output.add(name=settings.output_name, data_type=mc.TYPE_FP32, dims=[width])


def onnx_config(settings: ResolvedSettings, width: int) -> mc.ModelConfig:
    """The ONNX step: onnxruntime backend (native) or the python-backend onnxruntime runner."""
    name = model_names(settings.name, ["onnx"])["onnx"]
    if settings.runtime == "native":
        config = mc.ModelConfig(name=name, platform="onnxruntime_onnx", max_batch_size=settings.max_batch_size)
    else:
        config = mc.ModelConfig(name=name, backend="python", max_batch_size=settings.max_batch_size)
    _step_io(config, settings, width)
    config.instance_group.add(kind=_kind(settings), count=settings.instances)
    _batching(config, settings)
    if settings.onnx_threads:
        # onnxruntime backend parameter / read by the python-backend runner
        key = "intra_op_thread_count" if settings.runtime == "native" else "intra_op_num_threads"
        config.parameters[key].string_value = str(settings.onnx_threads)
    if settings.merge_buckets:  # the runner pads the merged requests itself
        for tensor in config.input:
            tensor.allow_ragged_batch = True
        config.parameters["merge_buckets"].string_value = "1"
    return config


def trt_config(settings: ResolvedSettings, width: int) -> mc.ModelConfig:
    """The TensorRT FP16 step; its engine has one optimization profile (index 0)."""
    name = model_names(settings.name, ["trt"])["trt"]
    config = mc.ModelConfig(name=name, platform="tensorrt_plan", max_batch_size=settings.max_batch_size)
    _step_io(config, settings, width)
    config.instance_group.add(kind=mc.ModelInstanceGroup.KIND_GPU, count=settings.instances, profile=["0"])
    _batching(config, settings)
    return config


def ensemble_config(settings: ResolvedSettings, fmt: str, width: int) -> mc.ModelConfig:
    """text -> tokenizer -> step model, with the contract's parameters for the gateway."""
    names = model_names(settings.name, [fmt])
    output = settings.output_name
    config = mc.ModelConfig(name=names[f"{fmt}_ensemble"], platform="ensemble", max_batch_size=settings.max_batch_size)
    config.input.add(name="text", data_type=mc.TYPE_STRING, dims=[1])
    out = config.output.add(name=output, data_type=mc.TYPE_FP32, dims=[width])
    if settings.task == "classify":
        out.label_filename = LABELS_FILE
    config.output.add(name="num_tokens", data_type=mc.TYPE_INT32, dims=[1])
    tok = config.ensemble_scheduling.step.add(model_name=names["tokenizer"], model_version=-1)
    tok.input_map["text"] = "text"
    for name in TOKEN_INPUTS:
        tok.output_map[name] = f"_{name}"
    tok.output_map["num_tokens"] = "num_tokens"
    step = config.ensemble_scheduling.step.add(model_name=names[fmt], model_version=-1)
    for name in TOKEN_INPUTS:
        step.input_map[name] = f"_{name}"
    step.output_map[output] = output
    params = {
        "task": settings.task,
        "model_name": settings.name,
        "backend": "onnx" if fmt == "onnx" else "trt_fp16",
        "max_seq_len": str(settings.max_seq_len),
        "source": settings.model,
    }
    if settings.task == "classify":
        params["labels"] = orjson.dumps(settings.labels or []).decode()
    else:
        params["embedding_dim"] = str(width)
        params["pooling"] = settings.pooling or "mean"
    _set_parameters(config, params)
    return config


def write_config(directory: Path, config: mc.ModelConfig) -> None:
    """Write `directory/config.pbtxt` (text format) and create the version directory `1/`."""
    (directory / "1").mkdir(parents=True, exist_ok=True)
    (directory / "config.pbtxt").write_text(text_format.MessageToString(config))


def read_config(path: Path) -> mc.ModelConfig:
    """Parse a config.pbtxt back into a ModelConfig."""
    return text_format.Parse(path.read_text(), mc.ModelConfig())
