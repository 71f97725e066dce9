"""Build settings: what the CLI options and spec-file entries hold, before and after defaults."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from contract import COLBERT_VECTORS, TOKEN_EMBEDDINGS, TOKEN_WEIGHTS, Layout, OnnxAccelerator, Task, output_name

Format = Literal["onnx", "trt"]
Device = Literal["gpu", "cpu"]
Runtime = Literal["native", "python"]
Pooling = Literal["mean", "cls", "lasttoken"]
Precision = Literal["fp32", "fp16"]

DEFAULT_LENGTH_BUCKETS = (16, 32, 64, 128, 256, 512)
# Tasks the packed layout serves (builder/packing.py): pooling (and per-token outputs) or a classifier head on
# each row's first token. A SPLADE row (sparse-embed: a max over each row's MLM logits) has no packed form.
PACKED_TASKS: tuple[Task, ...] = ("embed", "classify", "rerank")
DEFAULT_MAX_BATCH_TOKENS = 16384
DEFAULT_SPARSE_MAX_BATCH_TOKENS = 4096  # a SPLADE call holds tokens x vocabulary logits (x 4 bytes)
# Queue policy of every dynamic batcher (docs/contract.md): no request waits longer than this in a
# model's queue (a caller's own timeout can only shorten it); a queue holds this many full batches.
# No queue policy by default: Triton 2.51's dynamic batcher with any `default_queue_policy` stalls
# now and then (docs/contract.md "Queue policy"; upstream: triton-inference-server/server#8870). The gateway
# sheds load and cancels what it abandons instead.
DEFAULT_QUEUE_TIMEOUT_MS = 0
# Dynamic batcher delays. The tokenizer waits a little to merge an ensemble's texts into batches; a model step
# runs at once: its callers (the gateway's scheduler, the tokenizer) send it batches already, and a wait would
# only lengthen each batch's round trip.
DEFAULT_TOKENIZER_QUEUE_DELAY_US = 100
DEFAULT_STEP_QUEUE_DELAY_US = 0
# Where Triton's onnxruntime backend keeps the engines ONNX Runtime's TensorRT provider compiles
# (--onnx-accelerator tensorrt): a path inside the Triton container, on a writable volume (compose:
# `ort_trt_cache`), so that a restart loads them instead of compiling again.
DEFAULT_ONNX_TRT_CACHE = "/cache/ort-trt"


def _split_commas(value: Any) -> Any:
    """Accept "a,b,c" (CLI, environment) as well as a list (YAML)."""
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [value]
    return value


CommaList = BeforeValidator(_split_commas)
# `score_label: 1` in YAML is an index given as an int
_IntAsText = BeforeValidator(lambda v: str(v) if isinstance(v, int) and not isinstance(v, bool) else v)


class BuildRequest(BaseModel):
    """One model to build, as the user gave it (None = take the default from the model)."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str = Field(min_length=1, description="hub id or local directory")
    task: Task = Field(description="classify, embed, rerank or sparse-embed")
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_\-]*$", description="NAME of the repository entries")
    revision: str | None = None
    formats: Annotated[list[Format] | None, CommaList] = None
    max_seq_len: int | None = Field(default=None, gt=0)
    max_batch_size: int = Field(default=64, gt=0)
    device: Device = "gpu"
    runtime: Runtime = "native"
    pooling: Pooling | None = None
    labels: Annotated[list[str] | None, CommaList] = None
    pairs: bool | None = Field(default=None, description="classify: the model takes sentence pairs (text, text_pair); "
                               "rerank always does")
    score_label: Annotated[str | None, _IntAsText] = Field(
        default=None, description="rerank: the label (name or index) whose logit scores relevance")
    prompts: dict[str, str] | None = Field(
        default=None, description="embed: prompt name -> text prepended to the input; extends and overrides the "
        "model's config_sentence_transformers.json prompts")
    default_prompt_name: str | None = Field(default=None, min_length=1,
                                            description="embed: the prompt used when a request names none")
    matryoshka_dims: Annotated[list[int] | None, CommaList] = Field(
        default=None, description="embed: dimensions a request may truncate embeddings to (default: the config's "
        "matryoshka_dimensions)")
    calibration_texts: str | None = Field(
        default=None, min_length=1,
        description="embed: a UTF-8 file of texts, one per line, that calibrate the int8/uint8 ranges (default: the "
        "builder's multilingual set, builder/calibration_texts.txt)")
    length_buckets: Annotated[list[int], CommaList] = Field(default_factory=lambda: list(DEFAULT_LENGTH_BUCKETS))
    dynamic_batching: bool = True
    max_queue_delay_us: int | None = Field(
        default=None, ge=0,
        description="dynamic batcher queue delay of every model, in microseconds (default: 100 for the tokenizer, "
        "which merges an ensemble's texts; 0 for model steps, whose callers send them batches already)")
    preferred_batch_sizes: Annotated[list[int] | None, CommaList] = None
    queue_timeout_ms: int = Field(
        default=DEFAULT_QUEUE_TIMEOUT_MS, ge=0,
        description="dynamic batcher queue policy: a request still queued after this long is rejected (a "
        "request's own timeout may shorten it, never extend it); 0 = none. Off by default (Triton bug)",
    )
    max_queue_size: int = Field(
        default=0, ge=0,
        description="dynamic batcher queue policy: requests a model holds queued before it rejects new ones "
        "at once; 0 = unbounded. Off by default (Triton bug)",
    )
    instances: int | None = Field(
        default=None, gt=0, description="instances of the model step (onnx / trt); default: 4 for the python "
        "runtime on a GPU (each call's fixed cost overlaps with the others'), "
        "2 for the native runtime on a GPU, 1 on a CPU")
    tokenizer_instances: int | None = Field(
        default=None, gt=0, description="instances of the tokenizer (the ensembles'); default: 4 on a GPU "
        "build, 1 on a CPU")
    onnx_threads: int = Field(default=0, ge=0, description="onnxruntime intra-op threads per instance (0: its default)")
    opset: int = Field(default=17, ge=14)
    onnx_optimize: bool | None = Field(
        default=None,
        description="publish onnxruntime's transformer-optimizer output (fused ops) instead of the plain export. "
        "Default: on, except with --onnx-accelerator tensorrt (TensorRT fuses the plain export itself)",
    )
    onnx_precision: Precision | None = Field(
        default=None,
        description="precision of the published model.onnx: fp16 (onnxruntime's float16 conversion of the "
        "optimized graph, inputs and outputs stay int32/fp32) or fp32. Default: fp16 for --device gpu, fp32 on CPU "
        "and with --onnx-accelerator tensorrt (TensorRT computes in fp16 itself: precision_mode FP16)",
    )
    onnx_accelerator: OnnxAccelerator | None = Field(
        default=None,
        description="native runtime, GPU: how Triton's onnxruntime backend runs the onnx step (builder/accelerators.py): "
        "tensorrt (ONNX Runtime's TensorRT provider; engines compiled at load, cached in onnx_trt_cache), cuda (the "
        "CUDA provider with tuned options) or none. Default: cuda with --device gpu --runtime native, else none "
        "(the only choice on CPU and with --runtime python)",
    )
    onnx_trt_cache: str = Field(
        default=DEFAULT_ONNX_TRT_CACHE, pattern=r"^/",
        description="--onnx-accelerator tensorrt: absolute directory, in the Triton container, of the TensorRT "
        "provider's engine cache (a writable volume)",
    )
    max_batch_tokens: int | None = Field(
        default=None, gt=0,
        description="token budget of one model call (default 16384; sparse-embed 4096: its MLM head holds "
        "tokens x vocabulary logits). The python runner cuts merged batches under it; the gateway keeps its "
        "batches under it; the max-length warm-up sample takes max(1, budget // max-seq-len) rows",
    )
    batch_widths: Annotated[list[int] | None, CommaList] = Field(
        default=None,
        description="padded widths the model step's batches take (warmed at load by the python runner, padded to "
        "by the gateway). Default with --device gpu: 8,16,...,64,80,...,128,160,...,256,320,...,512 capped at "
        "max-seq-len; on CPU none (each batch padded to its longest row)",
    )
    batch_rows: Annotated[list[int] | None, CommaList] = Field(
        default=None,
        description="row counts the model step's batches take. Default with --device gpu: powers of two up to "
        "max-batch-size; on CPU none",
    )
    merge_buckets: bool | None = Field(
        default=None,
        description="python runtime: let the dynamic batcher merge requests of different widths (ragged "
        "batching); the runner sorts the merged rows by length and pads each sub-batch to its own longest. "
        "Default: on for --runtime python --device gpu",
    )
    layout: Layout | None = Field(
        default=None,
        description="the onnx model step's layout (docs/contract.md): packed = its graph computes real tokens only "
        "(rows back to back, cu_seqlens) and it takes packed requests as well as padded ones; padded = rows padded "
        "to a width. Default: packed with --runtime python --device gpu for BERT/RoBERTa/XLM-R models, else padded. "
        "--runtime python only; TensorRT steps stay padded",
    )
    trt_opt_batch_size: int | None = Field(default=None, gt=0)
    trt_workspace_mib: int = Field(default=4096, gt=0)
    trt_timing_cache: str | None = None
    skip_parity: bool = False
    warmup: bool = Field(
        default=True,
        description="write model_warmup samples into the tokenizer's and model steps' configs (Triton runs them at "
        "load, before the model is ready); false = none",
    )



class ResolvedSettings(BaseModel):
    """Every setting with its default filled in from the model; the manifest records these."""

    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str
    revision: str | None
    task: Task
    name: str
    formats: list[Format]
    max_seq_len: int
    max_batch_size: int
    device: Device
    runtime: Runtime
    pooling: Pooling | None
    labels: list[str] | None
    length_buckets: list[int]
    dynamic_batching: bool
    tokenizer_queue_delay_us: int
    preferred_batch_sizes: list[int]
    # defaults for callers that resolve settings themselves (loadtest/model_step.py)
    step_queue_delay_us: int = DEFAULT_STEP_QUEUE_DELAY_US
    queue_timeout_ms: int = DEFAULT_QUEUE_TIMEOUT_MS
    max_queue_size: int = 0
    instances: int
    tokenizer_instances: int
    onnx_threads: int
    opset: int
    onnx_optimize: bool
    onnx_precision: Precision
    max_batch_tokens: int
    batch_widths: list[int]
    batch_rows: list[int]
    merge_buckets: bool
    trt_opt_batch_size: int
    trt_workspace_mib: int
    skip_parity: bool
    # defaults: what a build before these settings meant (callers resolving settings themselves leave them out)
    pairs: bool = False  # tokenizer and ensemble take `text_pair` too
    normalize: bool | None = None  # embed: what the model was trained with
    prompts: dict[str, str] = Field(default_factory=dict)  # embed
    default_prompt_name: str | None = None  # embed
    matryoshka_dims: list[int] = Field(default_factory=list)  # embed: ascending, ending with the full dim; [] = none
    # embed: the int8/uint8 calibration set ("" = the builder's default) and its sha256 ("" = not calibrated)
    calibration_texts: str = ""
    calibration_sha256: str = ""
    score_label: int | None = None  # rerank: index of the scoring logit
    warmup: bool = True  # model_warmup samples in the tokenizer's and model steps' configs
    onnx_accelerator: OnnxAccelerator = "none"  # onnx step, native runtime: builder/accelerators.py
    onnx_trt_cache: str = ""  # engine cache directory of onnx_accelerator tensorrt ("" otherwise)
    # sparse-embed: the SpladePooling config (builder/source.py SpladeConfig)
    splade_pooling: str | None = None
    splade_activation: str | None = None
    # embed: FlagEmbedding bge-m3 heads exported next to the encoder ("sparse", "colbert"), and the token ids
    # whose lexical weight FlagEmbedding drops (cls, eos, pad, unk)
    flag_heads: list[str] = Field(default_factory=list)
    sparse_skip_ids: list[int] = Field(default_factory=list)
    layout: Layout = "padded"  # the onnx step's layout (builder/packing.py); TensorRT steps are always padded

    @property
    def output_name(self) -> str:
        return output_name(self.task)

    @property
    def token_outputs(self) -> list[str]:
        """Per-token outputs of the model step (docs/contract.md): every embedder's last hidden state, and
        bge-m3's lexical weights and ColBERT vectors where the model ships those heads."""
        if self.task != "embed":
            return []
        heads = {"sparse": TOKEN_WEIGHTS, "colbert": COLBERT_VECTORS}
        return [TOKEN_EMBEDDINGS, *(heads[h] for h in self.flag_heads)]

    @property
    def output_names(self) -> list[str]:
        """Every output of the model step: the pooled (or per-text) one first, then the per-token ones."""
        return [self.output_name, *self.token_outputs]


def effective_buckets(buckets: list[int], max_seq_len: int) -> list[int]:
    """The bucket list capped at max_seq_len, always ending with max_seq_len."""
    return sorted({min(b, max_seq_len) for b in buckets if b > 0} | {max_seq_len})


def default_instances(device: str, runtime: str) -> tuple[int, int]:
    """(model-step instances, tokenizer instances) of a build that names none."""
    if device != "gpu":
        return 1, 1
    return (4 if runtime == "python" else 2), 4


def default_preferred_batch_sizes(max_batch_size: int) -> list[int]:
    """Powers of two from 4 up to max_batch_size, plus max_batch_size itself."""
    sizes = [s for s in (4, 8, 16, 32, 64, 128, 256) if s < max_batch_size]
    return sizes + [max_batch_size]

