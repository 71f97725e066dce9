"""Planning a build: each request resolved against its checkpoint (formats, layout, accelerator, every default),
and whether the repository already holds it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from builder import configs, tensorrt_engine
from builder.calibration import read_texts, texts_digest
from builder.checks import check_options
from builder.errors import BuildError
from builder.logs import Log
from builder.manifest import fingerprint, read_manifest
from builder.packing import PACKED_FAMILIES
from builder.settings import (
    DEFAULT_MAX_BATCH_TOKENS,
    DEFAULT_SPARSE_MAX_BATCH_TOKENS,
    DEFAULT_STEP_QUEUE_DELAY_US,
    DEFAULT_TOKENIZER_QUEUE_DELAY_US,
    PACKED_TASKS,
    BuildRequest,
    Format,
    ResolvedSettings,
    default_instances,
    default_preferred_batch_sizes,
)
from builder.source import (
    ModelSource,
    has_classification_head,
    model_max_seq_len,
    read_sentence_transformers,
    resolve_source,
)
from builder.tasks import task_settings
from contract import Layout, OnnxAccelerator
from contract.batching import default_rows, default_widths


@dataclass
class PlannedBuild:
    """One model after its settings were resolved against the checkpoint."""

    source: ModelSource
    settings: ResolvedSettings
    fingerprint: str
    entries: dict[str, str]  # role -> entry name
    timing_cache: Path


def resolve_formats(request: BuildRequest, log: Log) -> list[Format]:
    """Explicit formats are checked; the default is onnx,trt where TensorRT is importable, else onnx."""
    available = tensorrt_engine.tensorrt_available()
    if request.formats is None:
        if available and request.device == "gpu":
            return ["onnx", "trt"]
        log(f"notice: {request.name}: building onnx only (TensorRT is "
            f"{'not installed' if not available else 'GPU-only and --device is cpu'}); pass --formats to choose")
        return ["onnx"]
    formats = list(dict.fromkeys(request.formats))
    if "trt" in formats and not available:
        raise BuildError(f"{request.name}: --formats trt needs TensorRT, and the `tensorrt` Python package is not installed")
    return formats


def resolve_settings(request: BuildRequest, source: ModelSource, formats: list[Format]) -> ResolvedSettings:
    """Fill every default from the model and reject settings the model cannot honour."""
    task = request.task
    st = read_sentence_transformers(source.path)
    limit = model_max_seq_len(source)
    max_seq_len = request.max_seq_len or min(limit, st.max_seq_length or 512)
    if max_seq_len > limit:
        raise BuildError(f"{request.name}: --max-seq-len {max_seq_len} is above the model's limit of {limit} tokens")
    for_task = task_settings(request, source, task, st)
    # On a GPU, where each call has a fixed cost, one merged batch serves more than a batch per length bucket; on a
    # CPU the padding of merged batches to the widest request costs more than the calls it saves.
    merge_buckets = request.merge_buckets
    if merge_buckets is None:
        merge_buckets = request.runtime == "python" and request.device == "gpu"
    if any(b <= 0 for b in request.length_buckets):
        raise BuildError(f"{request.name}: --length-buckets must be positive integers")
    preferred = request.preferred_batch_sizes or default_preferred_batch_sizes(request.max_batch_size)
    if any(p <= 0 or p > request.max_batch_size for p in preferred):
        raise BuildError(f"{request.name}: preferred batch sizes must be within 1..{request.max_batch_size}")
    gpu = request.device == "gpu"
    accelerator = resolve_accelerator(request)
    # TensorRT parses the plain fp32 export and picks fp16 kernels itself (precision_mode FP16); the
    # optimizer's fused com.microsoft ops are no TensorRT layers and would split its graph (builder/accelerators.py).
    onnx_optimize = request.onnx_optimize
    if onnx_optimize is None:
        onnx_optimize = accelerator != "tensorrt" or request.onnx_precision == "fp16"
    layout = resolve_layout(request, source, formats, onnx_optimize)
    merge_buckets = merge_buckets or layout == "packed"  # a packed step's inputs are ragged: any shapes merge
    precision = request.onnx_precision or ("fp16" if gpu and onnx_optimize and accelerator != "tensorrt" else "fp32")
    widths = sorted(set(request.batch_widths)) if request.batch_widths is not None else (
        list(default_widths(max_seq_len)) if gpu else [])
    rows = sorted(set(request.batch_rows)) if request.batch_rows is not None else (
        list(default_rows(request.max_batch_size)) if gpu else [])
    if widths and (widths[0] <= 0 or widths[-1] != max_seq_len):
        raise BuildError(f"{request.name}: --batch-widths must be positive and end with max-seq-len ({max_seq_len})")
    if rows and (rows[0] <= 0 or rows[-1] != request.max_batch_size):
        raise BuildError(f"{request.name}: --batch-rows must be positive and end with max-batch-size "
                         f"({request.max_batch_size})")
    if bool(widths) != bool(rows):
        raise BuildError(f"{request.name}: give --batch-widths and --batch-rows together")
    instances, tokenizer_instances = default_instances(request.device, request.runtime)
    delay = request.max_queue_delay_us  # one value for every model, else each kind's default
    max_batch_tokens = request.max_batch_tokens or (
        DEFAULT_SPARSE_MAX_BATCH_TOKENS if task == "sparse-embed" else DEFAULT_MAX_BATCH_TOKENS)
    return ResolvedSettings(
        model=request.model, revision=source.revision, task=task, name=request.name, formats=formats,
        max_seq_len=max_seq_len, max_batch_size=request.max_batch_size, device=request.device, runtime=request.runtime,
        pooling=for_task.pooling, labels=for_task.labels, length_buckets=sorted(set(request.length_buckets)),
        dynamic_batching=request.dynamic_batching,
        tokenizer_queue_delay_us=DEFAULT_TOKENIZER_QUEUE_DELAY_US if delay is None else delay,
        step_queue_delay_us=DEFAULT_STEP_QUEUE_DELAY_US if delay is None else delay,
        preferred_batch_sizes=sorted(set(preferred)), instances=request.instances or instances,
        queue_timeout_ms=request.queue_timeout_ms, max_queue_size=request.max_queue_size,
        tokenizer_instances=request.tokenizer_instances or tokenizer_instances, onnx_threads=request.onnx_threads, opset=request.opset,
        onnx_optimize=onnx_optimize, onnx_precision=precision, max_batch_tokens=max_batch_tokens,
        batch_widths=widths, batch_rows=rows,
        merge_buckets=merge_buckets,
        trt_opt_batch_size=request.trt_opt_batch_size or min(8, request.max_batch_size),
        trt_workspace_mib=request.trt_workspace_mib, skip_parity=request.skip_parity,
        pairs=for_task.pairs, normalize=for_task.normalize, prompts=for_task.prompts,
        default_prompt_name=for_task.default_prompt_name, matryoshka_dims=for_task.matryoshka_dims,
        calibration_texts=request.calibration_texts or "",
        calibration_sha256=texts_digest(read_texts(request.calibration_texts)) if task == "embed" else "",
        score_label=for_task.score_label, warmup=request.warmup, onnx_accelerator=accelerator,
        onnx_trt_cache=request.onnx_trt_cache if accelerator == "tensorrt" else "",
        splade_pooling=for_task.splade.pooling if for_task.splade else None,
        splade_activation=for_task.splade.activation if for_task.splade else None,
        flag_heads=for_task.flag_heads, sparse_skip_ids=for_task.sparse_skip_ids, layout=layout,
    )


def resolve_layout(request: BuildRequest, source: ModelSource, formats: list[Format], onnx_optimize: bool) -> Layout:
    """--layout; by default packed for a python-runtime GPU onnx step of a family the rewrite knows
    (builder/packing.py), else padded (check_options refused the impossible combinations)."""
    family = source.config.model_type
    if request.layout == "packed" and family not in PACKED_FAMILIES:
        raise BuildError(f"{request.name}: --layout packed supports the {', '.join(sorted(PACKED_FAMILIES))} model "
                         f"families; {request.model!r} is {family!r}: build it with --layout padded")
    if request.layout is not None:
        return request.layout
    packable = (request.runtime == "python" and request.device == "gpu" and "onnx" in formats and onnx_optimize
                and request.merge_buckets is not False and family in PACKED_FAMILIES and request.task in PACKED_TASKS)
    return "packed" if packable else "padded"


def resolve_accelerator(request: BuildRequest) -> OnnxAccelerator:
    """--onnx-accelerator, default cuda for a native GPU build, else none (check_options refuses the rest)."""
    if request.onnx_accelerator is not None:
        return request.onnx_accelerator
    return "cuda" if request.device == "gpu" and request.runtime == "native" else "none"


def plan(request: BuildRequest, notices: list[str]) -> PlannedBuild:
    """Resolve one request against its checkpoint; problems raise BuildError, remarks go to `notices`."""
    check_options(request)
    source = resolve_source(request.model, request.revision)
    formats = resolve_formats(request, notices.append)
    settings = resolve_settings(request, source, formats)
    if (request.layout is None and settings.layout == "padded" and request.runtime == "python"
            and request.device == "gpu" and source.config.model_type not in PACKED_FAMILIES):
        notices.append(f"notice: {settings.name}: {source.config.model_type!r} models keep the padded layout (the "
                       f"packed rewrite knows {', '.join(sorted(PACKED_FAMILIES))})")
    if settings.task == "classify" and not has_classification_head(source.config):
        notices.append(f"notice: {settings.name}: {settings.model!r} has no trained classification head; "
                       f"its {len(settings.labels or [])}-label head is randomly initialised (seed 0)")
    cache = Path(request.trt_timing_cache) if request.trt_timing_cache else tensorrt_engine.default_timing_cache()
    return PlannedBuild(source, settings, fingerprint(source.identity(), settings),
                        configs.model_names(settings.name, formats), cache)


def is_up_to_date(planned: PlannedBuild, repository: Path) -> bool:
    """True when every entry exists with a manifest of the same fingerprint."""
    for entry in planned.entries.values():
        manifest = read_manifest(repository / entry)
        if manifest is None or manifest.fingerprint != planned.fingerprint:
            return False
    return True
