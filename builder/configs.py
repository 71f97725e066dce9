"""Triton `ModelConfig` messages for every repository entry (docs/contract.md), and writing them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from builder.accelerators import add_accelerator
from builder.settings import Format, ResolvedSettings, effective_buckets
from builder.versions import set_policy
from contract import (
    ATTENTION_MASK,
    CU_SEQLENS,
    INPUT_IDS,
    LABELS_FILE,
    NUM_TOKENS,
    REPO_BACKEND,
    TEXT,
    TEXT_PAIR,
    TOKEN_INPUTS,
    TOKEN_TYPE_IDS,
    Param,
    ensemble_model,
    step_model,
    tokenizer_model,
)
from contract.ranges import encode_ranges


def model_names(name: str, formats: Sequence[Format]) -> dict[str, str]:
    """Repository entry names: tokenizer, and step + ensemble per format ("onnx", "trt")."""
    names = {"tokenizer": tokenizer_model(name)}
    for fmt in formats:
        names[fmt] = step_model(name, REPO_BACKEND[fmt])
        names[f"{fmt}_ensemble"] = ensemble_model(name, REPO_BACKEND[fmt])
    return names


def _batching(config: mc.ModelConfig, settings: ResolvedSettings, delay_us: int) -> None:
    """Dynamic batcher; with --queue-timeout-ms or --max-queue-size also a queue policy: a request over its
    timeout (its own, else the default) or one arriving at a full queue is rejected instead of executed
    late. Off by default: Triton 2.51 stalls with any queue policy (docs/contract.md, queue policy)."""
    if settings.dynamic_batching:
        batching = config.dynamic_batching
        batching.preferred_batch_size.extend(settings.preferred_batch_sizes)
        batching.max_queue_delay_microseconds = delay_us
        if settings.queue_timeout_ms or settings.max_queue_size:
            policy = batching.default_queue_policy
            policy.timeout_action = mc.ModelQueuePolicy.REJECT
            policy.default_timeout_microseconds = settings.queue_timeout_ms * 1000
            policy.allow_timeout_override = True
            policy.max_queue_size = settings.max_queue_size


def _kind(settings: ResolvedSettings) -> int:
    return mc.ModelInstanceGroup.KIND_GPU if settings.device == "gpu" else mc.ModelInstanceGroup.KIND_CPU


def _set_parameters(config: mc.ModelConfig, values: dict[str, str]) -> None:
    for key, value in values.items():
        config.parameters[key].string_value = value


def _text_inputs(config: mc.ModelConfig, settings: ResolvedSettings) -> None:
    """`text`, and `text_pair` for models built with pairs."""
    config.input.add(name=TEXT, data_type=mc.TYPE_STRING, dims=[1])
    if settings.pairs:
        config.input.add(name=TEXT_PAIR, data_type=mc.TYPE_STRING, dims=[1])


def tokenizer_config(settings: ResolvedSettings, pad_token_id: int, tokenizer_sha256: str) -> mc.ModelConfig:
    """Python-backend tokenizer: text (+ text_pair) -> INT32 token tensors + num_tokens (always on CPU).

    Its parameters also tell the gateway how to tokenize itself (max_seq_len, pad id, and the
    sha256 of tokenizer.json, so that it uses the file Triton serves and no other)."""
    config = mc.ModelConfig(name=tokenizer_model(settings.name), backend="python",
                            max_batch_size=settings.max_batch_size)
    _text_inputs(config, settings)
    for name in TOKEN_INPUTS:
        config.output.add(name=name, data_type=mc.TYPE_INT32, dims=[-1])
    config.output.add(name=NUM_TOKENS, data_type=mc.TYPE_INT32, dims=[1])
    config.instance_group.add(kind=mc.ModelInstanceGroup.KIND_CPU, count=settings.tokenizer_instances)
    _batching(config, settings, settings.tokenizer_queue_delay_us)
    _set_parameters(config, {
        Param.MAX_SEQ_LEN: str(settings.max_seq_len),
        Param.LENGTH_BUCKETS: ",".join(str(b) for b in effective_buckets(settings.length_buckets, settings.max_seq_len)),
        Param.PAD_TOKEN_ID: str(pad_token_id),
        Param.TOKENIZER_SHA256: tokenizer_sha256,
    })
    return config


def _step_io(config: mc.ModelConfig, settings: ResolvedSettings, width: int,
             token_dims: dict[str, list[int]] | None = None) -> None:
    """Token inputs; the per-text output [width], then the per-token outputs [-1 (tokens), *dims]."""
    for name in TOKEN_INPUTS:
        config.input.add(name=name, data_type=mc.TYPE_INT32, dims=[-1])
    config.output.add(name=settings.output_name, data_type=mc.TYPE_FP32, dims=[width])
    for name, dims in (token_dims or {}).items():
        config.output.add(name=name, data_type=mc.TYPE_FP32, dims=[-1, *dims])
    if settings.batch_widths:  # the shapes batches keep to (contract/batching.py): the gateway pads to them
        config.parameters[Param.BATCH_WIDTHS].string_value = ",".join(map(str, settings.batch_widths))
        config.parameters[Param.BATCH_ROWS].string_value = ",".join(map(str, settings.batch_rows))


def onnx_config(settings: ResolvedSettings, width: int, precision: str, build_id: str = "",
                token_dims: dict[str, list[int]] | None = None) -> mc.ModelConfig:
    """The ONNX step: onnxruntime backend (native) or the python-backend onnxruntime runner.

    A native GPU build also gets its execution accelerator (builder/accelerators.py; `build_id`, the build
    fingerprint, names the TensorRT provider's cached engines)."""
    name = step_model(settings.name, "onnx")
    if settings.runtime == "native":
        config = mc.ModelConfig(name=name, platform="onnxruntime_onnx", max_batch_size=settings.max_batch_size)
    else:
        config = mc.ModelConfig(name=name, backend="python", max_batch_size=settings.max_batch_size)
    _step_io(config, settings, width, token_dims)
    config.instance_group.add(kind=_kind(settings), count=settings.instances)
    _batching(config, settings, settings.step_queue_delay_us)
    config.parameters[Param.PRECISION].string_value = precision
    # the token budget of one call: the python runner cuts merged batches under it, the gateway's batches keep to it
    config.parameters[Param.MAX_BATCH_TOKENS].string_value = str(settings.max_batch_tokens)
    if settings.onnx_threads:
        # onnxruntime backend parameter / read by the python-backend runner
        key = "intra_op_thread_count" if settings.runtime == "native" else Param.INTRA_OP_THREADS
        config.parameters[key].string_value = str(settings.onnx_threads)
    if settings.layout == "packed":
        _packed_step(config, settings)
    if settings.merge_buckets:  # the runner sorts the merged rows by length and pads sub-batches itself
        for tensor in config.input:
            tensor.allow_ragged_batch = True
    add_accelerator(config, settings, build_id)
    return config


def _packed_step(config: mc.ModelConfig, settings: ResolvedSettings) -> None:
    """A `layout: packed` step (docs/contract.md): padded requests carry attention_mask, packed ones cu_seqlens
    ([1, rows + 1]; input_ids and token_type_ids [1, T]), so both are optional. Its batches have no padded shapes
    to keep to (no batch_widths/batch_rows); the runner refuses rows longer than max_seq_len."""
    for tensor in config.input:
        if tensor.name == ATTENTION_MASK:
            tensor.optional = True
    config.input.add(name=CU_SEQLENS, data_type=mc.TYPE_INT32, dims=[-1], optional=True)
    for key in (Param.BATCH_WIDTHS, Param.BATCH_ROWS):
        if key in config.parameters:
            del config.parameters[key]
    _set_parameters(config, {Param.LAYOUT: "packed", Param.MAX_SEQ_LEN: str(settings.max_seq_len)})


def set_vocabulary(config: mc.ModelConfig, vocab_size: int, type_vocab_size: int) -> None:
    """A packed step's `vocab_size` and `type_vocab_size`: the runner refuses ids outside the embedding tables."""
    _set_parameters(config, {Param.VOCAB_SIZE: str(vocab_size), Param.TYPE_VOCAB_SIZE: str(type_vocab_size)})


def trt_config(settings: ResolvedSettings, width: int, token_dims: dict[str, list[int]] | None = None) -> mc.ModelConfig:
    """The TensorRT FP16 step; its engine has one optimization profile (index 0)."""
    name = step_model(settings.name, "trt_fp16")
    config = mc.ModelConfig(name=name, platform="tensorrt_plan", max_batch_size=settings.max_batch_size)
    _step_io(config, settings, width, token_dims)
    config.parameters[Param.PRECISION].string_value = "fp16"
    config.parameters[Param.MAX_BATCH_TOKENS].string_value = str(settings.max_batch_tokens)
    config.instance_group.add(kind=mc.ModelInstanceGroup.KIND_GPU, count=settings.instances, profile=["0"])
    _batching(config, settings, settings.step_queue_delay_us)
    return config


def ensemble_config(settings: ResolvedSettings, fmt: Format, width: int,
                    ranges: Mapping[int, np.ndarray] | None = None) -> mc.ModelConfig:
    """text (+ text_pair) -> tokenizer -> step model, with the contract's parameters for the gateway."""
    names = model_names(settings.name, [fmt])
    output = settings.output_name
    config = mc.ModelConfig(name=names[f"{fmt}_ensemble"], platform="ensemble", max_batch_size=settings.max_batch_size)
    _text_inputs(config, settings)
    out = config.output.add(name=output, data_type=mc.TYPE_FP32, dims=[width])
    if settings.labels is not None:
        out.label_filename = LABELS_FILE
    config.output.add(name=NUM_TOKENS, data_type=mc.TYPE_INT32, dims=[1])
    tok = config.ensemble_scheduling.step.add(model_name=names["tokenizer"], model_version=-1)
    for tensor in config.input:
        tok.input_map[tensor.name] = tensor.name
    for name in TOKEN_INPUTS:
        tok.output_map[name] = f"_{name}"
    tok.output_map[NUM_TOKENS] = NUM_TOKENS
    step = config.ensemble_scheduling.step.add(model_name=names[fmt], model_version=-1)
    for name in TOKEN_INPUTS:
        step.input_map[name] = f"_{name}"
    step.output_map[output] = output
    _set_parameters(config, ensemble_parameters(settings, fmt, width, ranges))
    return config


def _flag(value: bool) -> str:
    return "true" if value else "false"


def ensemble_parameters(settings: ResolvedSettings, fmt: Format, width: int,
                        ranges: Mapping[int, np.ndarray] | None = None) -> dict[str, str]:
    """What the gateway reads (docs/contract.md): common keys, then the task's own (`ranges`: an embedder's
    calibrated int8 ranges by width)."""
    params = {
        Param.TASK: settings.task,
        Param.MODEL_NAME: settings.name,
        Param.BACKEND: REPO_BACKEND[fmt],
        Param.MAX_SEQ_LEN: str(settings.max_seq_len),
        Param.SOURCE: settings.model,
    }
    if settings.pairs:  # absent = single texts
        params[Param.PAIRS] = "true"
    if fmt == "onnx":
        params[Param.ONNX_ACCELERATOR] = settings.onnx_accelerator
    if settings.task == "sparse-embed":  # one weight per vocabulary entry
        params[Param.EMBEDDING_DIM] = str(width)
        params[Param.PROMPTS] = orjson.dumps(settings.prompts).decode()
        if settings.default_prompt_name:
            params[Param.DEFAULT_PROMPT] = settings.default_prompt_name
        return params
    if settings.task == "embed":
        params[Param.EMBEDDING_DIM] = str(width)
        if settings.sparse_skip_ids:
            params[Param.SPARSE_SKIP_IDS] = ",".join(map(str, settings.sparse_skip_ids))
        params[Param.POOLING] = settings.pooling or "mean"
        params[Param.NORMALIZE] = _flag(settings.normalize is not False)
        params[Param.PROMPTS] = orjson.dumps(settings.prompts).decode()
        if settings.default_prompt_name:
            params[Param.DEFAULT_PROMPT] = settings.default_prompt_name
        if settings.matryoshka_dims:
            params[Param.MATRYOSHKA_DIMS] = ",".join(map(str, settings.matryoshka_dims))
        if ranges:
            params[Param.QUANTIZATION_RANGES] = encode_ranges(ranges)
        return params
    params[Param.LABELS] = orjson.dumps(settings.labels or []).decode()
    if settings.task == "rerank":
        params[Param.SCORE_LABEL] = str(settings.score_label or 0)
    return params


# Warm-up (docs/contract.md "Warm-up"): Triton runs these samples through a model instance when it loads
# it, before the model is ready, so that the first real request does not pay for first-run allocations.
WARMUP_DIR = "warmup"  # Triton reads `input_data_file` from this folder of the model directory
WARMUP_SHORT_TOKENS = 16
WARMUP_TEXT = "Warm-up: a short sample sentence, tokenized once when the model loads."
WARMUP_TEXT_PAIR = "A second sentence, for models that take text pairs."


def string_tensor_file(values: Sequence[str]) -> bytes:
    """A TYPE_STRING warm-up file: each element as a 4-byte little-endian length and its UTF-8 bytes."""
    out = b""
    for value in values:
        data = value.encode("utf-8")
        out += len(data).to_bytes(4, "little") + data
    return out


def warmup_token_ids(tokenizer: Any, max_seq_len: int) -> tuple[list[int], list[int]]:
    """Real token ids of the warm-up samples: a short row (<= 16 tokens) and one of exactly max_seq_len.

    Ids from the model's own tokenizer: random ids could fall outside the embedding table."""
    short_len = min(WARMUP_SHORT_TOKENS, max_seq_len)
    short = list(tokenizer(WARMUP_TEXT, truncation=True, max_length=short_len)["input_ids"])
    long_text = " ".join([WARMUP_TEXT] * (max_seq_len // 4 + 1))
    long = list(tokenizer(long_text, truncation=True, max_length=max_seq_len)["input_ids"])
    pad = int(getattr(tokenizer, "pad_token_id", 0) or 0)
    return short, long + [pad] * (max_seq_len - len(long))  # a tokenizer without many tokens: padded out


def _int32_file(values: Sequence[int]) -> bytes:
    return np.asarray(values, dtype="<i4").tobytes()


def warmup_max_length_rows(settings: ResolvedSettings) -> int:
    """Rows of max_seq_len tokens in the `max_length` warm-up sample: as many as one call's token budget holds
    (at least 1, at most max_batch_size). The batches the model step is ever given are bounded by that budget
    (docs/contract.md), so a larger sample would only cost load time: 64 x 8,192 tokens took minutes and GBs."""
    return max(1, min(settings.max_batch_size, settings.max_batch_tokens // settings.max_seq_len))


def add_step_warmup(config: mc.ModelConfig, settings: ResolvedSettings, short_ids: Sequence[int],
                    long_ids: Sequence[int]) -> dict[str, bytes]:
    """Model step (onnx / trt): `short` (1 row of the short sample) and `max_length` (rows of max_seq_len tokens,
    every token attended, as many as the token budget holds). Returns the files to write under `warmup/`."""
    files: dict[str, bytes] = {}
    for sample, rows, ids in (("short", 1, short_ids), ("max_length", warmup_max_length_rows(settings), long_ids)):
        warmup = config.model_warmup.add(name=sample, batch_size=rows, count=1)
        dims = [len(ids)]
        for name in (INPUT_IDS, ATTENTION_MASK):
            file = f"{sample}_{name}"
            files[file] = _int32_file(ids if name == INPUT_IDS else [1] * len(ids))
            warmup.inputs[name].CopyFrom(mc.ModelWarmup.Input(data_type=mc.TYPE_INT32, dims=dims,
                                                              input_data_file=file))
        warmup.inputs[TOKEN_TYPE_IDS].CopyFrom(mc.ModelWarmup.Input(data_type=mc.TYPE_INT32, dims=dims,
                                                                    zero_data=True))
    return files


def add_tokenizer_warmup(config: mc.ModelConfig, settings: ResolvedSettings) -> dict[str, bytes]:
    """Tokenizer: one sample text (and text pair for pair models). Returns the files to write under `warmup/`."""
    warmup = config.model_warmup.add(name="sample_text", batch_size=1, count=1)
    files = {"sample_text": string_tensor_file([WARMUP_TEXT])}
    warmup.inputs[TEXT].CopyFrom(mc.ModelWarmup.Input(data_type=mc.TYPE_STRING, dims=[1], input_data_file="sample_text"))
    if settings.pairs:
        files["sample_text_pair"] = string_tensor_file([WARMUP_TEXT_PAIR])
        warmup.inputs[TEXT_PAIR].CopyFrom(mc.ModelWarmup.Input(data_type=mc.TYPE_STRING, dims=[1],
                                                               input_data_file="sample_text_pair"))
    return files


def write_warmup_files(directory: Path, files: dict[str, bytes]) -> None:
    """The `input_data_file`s of a config's warm-up samples, in `directory/warmup/`."""
    if files:
        (directory / WARMUP_DIR).mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            (directory / WARMUP_DIR / name).write_bytes(data)


def write_tokenizer_config(directory: Path, config: mc.ModelConfig, settings: ResolvedSettings) -> None:
    """`write_config`, with the tokenizer's warm-up sample unless the build has --no-warmup."""
    if settings.warmup:
        write_warmup_files(directory, add_tokenizer_warmup(config, settings))
    write_config(directory, config)


def write_step_config(directory: Path, config: mc.ModelConfig, settings: ResolvedSettings,
                      warmup_ids: tuple[Sequence[int], Sequence[int]]) -> None:
    """`write_config` for a model step, with its warm-up samples (short, max-length) unless --no-warmup."""
    if settings.warmup:
        write_warmup_files(directory, add_step_warmup(config, settings, *warmup_ids))
    write_config(directory, config)


def write_config(directory: Path, config: mc.ModelConfig) -> None:
    """Write `directory/config.pbtxt` (text format, version policy `latest: 1` unless it has one) and
    create the version directory `1/` (publication renumbers it: builder/versions.py)."""
    if not config.HasField("version_policy"):
        set_policy(config, None)
    (directory / "1").mkdir(parents=True, exist_ok=True)
    (directory / "config.pbtxt").write_text(text_format.MessageToString(config))


def read_config(path: Path) -> mc.ModelConfig:
    """Parse a config.pbtxt back into a ModelConfig."""
    return text_format.Parse(path.read_text(), mc.ModelConfig())
