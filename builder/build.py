"""Orchestration: resolve settings, skip unchanged models, build into staging, check parity, publish."""

from __future__ import annotations

import hashlib
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import cast

import numpy as np
import onnx
import onnxruntime as ort
from transformers import PretrainedConfig

from builder import configs, tensorrt_engine
from builder.checks import check_names, check_options
from builder.errors import BuildError
from builder.attention import ATTENTION, FUSED_EXPORT_TYPES
from builder.export import RepositoryModel, export_onnx, load_repository_model
from builder.manifest import (
    Manifest,
    OnnxFacts,
    fingerprint,
    library_versions,
    python_version,
    read_manifest,
    write_manifest,
)
from builder.optimize import FUSED_OPS, onnx_op_counts, optimize_for_onnxruntime, publish_onnx, save_onnx
from builder.packing import PACKED_FAMILIES, PackedForm, PackingError, cpu_form, packed_model, position_offset
from builder.parity import ParityResult, compare, packed_parity_inputs, parity_inputs, real_tokens, torch_references
from builder.publish import publish, staging_directory
from builder.settings import (
    PACKED_TASKS,
    BuildRequest,
    Format,
    Pooling,
    ResolvedSettings,
    Task,
    DEFAULT_MAX_BATCH_TOKENS,
    DEFAULT_SPARSE_MAX_BATCH_TOKENS,
    DEFAULT_STEP_QUEUE_DELAY_US,
    DEFAULT_TOKENIZER_QUEUE_DELAY_US,
    default_instances,
    default_preferred_batch_sizes,
)
from builder.source import (
    SUPPORTED_POOLING,
    ModelSource,
    SentenceTransformersConfig,
    SpladeConfig,
    flag_heads,
    config_labels,
    config_matryoshka_dims,
    has_classification_head,
    model_max_seq_len,
    read_sentence_transformers,
    resolve_source,
)
from builder.versions import next_version, stage_version
from contract import (
    CUDA_PROVIDER_OPTIONS,
    ATTENTION_MASK,
    BATCHING_MODULE,
    LABELS_FILE,
    PACKING_MODULE,
    TOKENIZATION_MODULE,
    TOKENIZER_FILE,
    Layout,
    OnnxAccelerator,
    entry_names,
)
from contract.batching import default_rows, default_widths
from contract.packing import PackedRows

Log = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@contextmanager
def _step(log: Log, what: str) -> Iterator[None]:
    """Log `what ...` when a long step starts and `what done in 1.2s` when it ends (nothing when it raises)."""
    log(f"{what} ...")
    started = time.monotonic()
    yield
    log(f"{what} done in {time.monotonic() - started:.1f}s")


@dataclass
class PlannedBuild:
    """One model after its settings were resolved against the checkpoint."""

    source: ModelSource
    settings: ResolvedSettings
    fingerprint: str
    entries: dict[str, str]  # role -> entry name
    timing_cache: Path


@dataclass
class BuildOutcome:
    name: str
    entries: list[str]
    skipped: bool
    parity: list[ParityResult] = field(default_factory=list)
    seconds: float = 0.0
    version: int = 0  # the version directory it was published as (0: skipped)
    settings: ResolvedSettings | None = None  # what it was built for


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


# rerank: a label with one of these names (any case) scores relevance when the model has several logits
RELEVANCE_LABELS = ("relevant", "relevance", "entailment", "yes", "true", "positive")


@dataclass
class TaskSettings:
    """The task-specific part of the resolved settings."""

    labels: list[str] | None = None
    pairs: bool = False
    score_label: int | None = None
    pooling: Pooling | None = None
    normalize: bool | None = None
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    matryoshka_dims: list[int] = field(default_factory=list)
    splade: SpladeConfig | None = None
    flag_heads: list[str] = field(default_factory=list)
    sparse_skip_ids: list[int] = field(default_factory=list)


def _labels(request: BuildRequest, source: ModelSource, task: Task) -> list[str]:
    """classify / rerank: label names, one per logit of the head (a base checkpoint gets a new classify head)."""
    if has_classification_head(source.config):
        labels = request.labels or config_labels(source.config)
        num_labels = int(source.config.num_labels or 0)
        if labels is None or len(labels) != num_labels:
            raise BuildError(
                f"{request.name}: {len(labels or [])} labels given but the model's head has {num_labels} outputs")
        return labels
    if task == "rerank":
        raise BuildError(f"{request.name}: {request.model!r} has no sequence-classification head; rerank needs a "
                         "cross-encoder checkpoint (`*ForSequenceClassification`, e.g. BAAI/bge-reranker-base)")
    if request.labels:
        return request.labels
    raise BuildError(f"{request.name}: {request.model!r} has no sequence-classification head; "
                     "give --labels to add a new (random) head, or use --task embed")


def _score_label(request: BuildRequest, labels: list[str]) -> int:
    """rerank: the logit that scores relevance (--score-label NAME|INDEX, else the one logit, else a known name)."""
    if request.score_label is not None:
        given = request.score_label.strip()
        named = [i for i, label in enumerate(labels) if label.lower() == given.lower()]
        if named:
            return named[0]
        if given.isdigit() and int(given) < len(labels):
            return int(given)
        raise BuildError(f"{request.name}: --score-label {given!r} is neither a label of the model "
                         f"({', '.join(labels)}) nor an index below {len(labels)}")
    if len(labels) == 1:
        return 0
    known = [i for i, label in enumerate(labels) if label.lower() in RELEVANCE_LABELS]
    if len(known) == 1:
        return known[0]
    raise BuildError(f"{request.name}: the model has {len(labels)} logits ({', '.join(labels)}); give "
                     "--score-label NAME|INDEX to name the one that scores relevance")


def _prompts(request: BuildRequest, st: SentenceTransformersConfig) -> tuple[dict[str, str], str | None]:
    """The model's prompts extended and overridden by --prompt, and the default prompt (which must exist)."""
    prompts = {**st.prompts, **(request.prompts or {})}
    default = request.default_prompt_name or st.default_prompt_name
    if default is not None and default not in prompts:
        known = ", ".join(sorted(prompts)) or "none"
        raise BuildError(f"{request.name}: default prompt name {default!r} is not a known prompt (known: {known}); "
                         "add it with --prompt NAME=TEXT")
    return prompts, default


def _matryoshka_dims(request: BuildRequest, source: ModelSource) -> list[int]:
    """Dimensions a request may truncate to: ascending, the full width included; [] when none are declared."""
    dims = request.matryoshka_dims if request.matryoshka_dims is not None else config_matryoshka_dims(source.config)
    if not dims:
        return []
    width = int(getattr(source.config, "hidden_size", 0) or 0)
    bad = [d for d in dims if not 1 <= d <= width]
    if bad:
        raise BuildError(f"{request.name}: matryoshka dimension(s) {', '.join(map(str, bad))} outside 1..{width} "
                         "(the embedding width)")
    return sorted(set(dims) | {width})


def _embed_settings(request: BuildRequest, source: ModelSource, st: SentenceTransformersConfig) -> TaskSettings:
    """Pooling and normalisation as the model was trained (sentence-transformers modules), prompts, matryoshka,
    and bge-m3's FlagEmbedding heads where the folder ships them."""
    if st.is_sparse_encoder:
        raise BuildError(f"{request.name}: {request.model!r} is a sentence-transformers SparseEncoder (SPLADE: MLM head "
                         "+ SpladePooling); --task embed would serve mean-pooled hidden states instead of its sparse "
                         "vectors. Build it with --task sparse-embed")
    extra = st.unsupported_modules()
    if extra and st.is_multi_vector:
        raise BuildError(f"{request.name}: {request.model!r} is a multi-vector (ColBERT) model, which the builder "
                         f"does not serve: its module(s) {', '.join(extra)} (and the query expansion and skiplist "
                         "its encode applies) are not exported. bge-m3-style ColBERT heads (colbert_linear.pt) are")
    if extra:
        raise BuildError(f"{request.name}: the model's modules.json has module(s) the export cannot run "
                         f"({', '.join(extra)}); an embedder may have only Transformer, Pooling and Normalize")
    if request.pooling is None and st.pooling_problem:
        raise BuildError(f"{request.name}: the model's sentence-transformers Pooling asks for {st.pooling_problem}, "
                         f"which the export cannot do; --pooling {'|'.join(SUPPORTED_POOLING)} overrides it")
    prompts, default = _prompts(request, st)
    heads = flag_heads(source.path)
    found = [name for name, path in (("sparse", heads.sparse), ("colbert", heads.colbert)) if path is not None]
    tok = source.tokenizer
    # FlagEmbedding drops the lexical weights of these tokens (M3Embedder._process_token_weights)
    skip = sorted({int(i) for i in (tok.cls_token_id, tok.eos_token_id, tok.pad_token_id, tok.unk_token_id)
                   if i is not None}) if heads.sparse else []
    return TaskSettings(
        pooling=request.pooling or cast(Pooling | None, st.pooling) or "mean",
        normalize=True if st.normalize is None else st.normalize,  # no modules.json: normalise (TEI's default)
        prompts=prompts, default_prompt_name=default, matryoshka_dims=_matryoshka_dims(request, source),
        flag_heads=found, sparse_skip_ids=skip,
    )


def _sparse_settings(request: BuildRequest, source: ModelSource, st: SentenceTransformersConfig) -> TaskSettings:
    """SPLADE: a SparseEncoder folder (ST 5 or ST 6 layout), or a bare masked-LM checkpoint (SPLADE's defaults)."""
    masked_lm = any(a.endswith("ForMaskedLM") for a in (source.config.architectures or []))
    if st.modules is not None and not st.is_sparse_encoder:
        raise BuildError(f"{request.name}: {request.model!r} is a dense sentence-transformers model, not a "
                         "SparseEncoder (MLM head + SpladePooling); build it with --task embed")
    if st.modules is None and not masked_lm:
        raise BuildError(f"{request.name}: --task sparse-embed needs a masked-LM checkpoint (`*ForMaskedLM`) or a "
                         f"sentence-transformers SparseEncoder folder; {request.model!r} is neither")
    extra = st.unsupported_modules()
    if extra:
        raise BuildError(f"{request.name}: the model's modules.json has module(s) the export cannot run "
                         f"({', '.join(extra)}); a SparseEncoder may have only an MLM Transformer and SpladePooling")
    if st.splade_problem:
        raise BuildError(f"{request.name}: the model asks for {st.splade_problem}, which the export cannot do")
    prompts, default = _prompts(request, st)
    return TaskSettings(splade=st.splade or SpladeConfig(), prompts=prompts, default_prompt_name=default)


def _task_settings(request: BuildRequest, source: ModelSource, task: Task, st: SentenceTransformersConfig) -> TaskSettings:
    if task == "embed":
        return _embed_settings(request, source, st)
    if task == "sparse-embed":
        return _sparse_settings(request, source, st)
    labels = _labels(request, source, task)
    if task == "rerank":
        return TaskSettings(labels=labels, pairs=True, score_label=_score_label(request, labels))
    return TaskSettings(labels=labels, pairs=bool(request.pairs))


def resolve_settings(request: BuildRequest, source: ModelSource, formats: list[Format]) -> ResolvedSettings:
    """Fill every default from the model and reject settings the model cannot honour."""
    task = request.task
    st = read_sentence_transformers(source.path)
    limit = model_max_seq_len(source)
    max_seq_len = request.max_seq_len or min(limit, st.max_seq_length or 512)
    if max_seq_len > limit:
        raise BuildError(f"{request.name}: --max-seq-len {max_seq_len} is above the model's limit of {limit} tokens")
    task_settings = _task_settings(request, source, task, st)
    # Measured (docs/benchmarks.md, 3m): on a GPU one merged batch beats per-bucket batches (1.7-1.8x);
    # on a CPU it lost (0.4-0.6x) when the runner still padded merged batches to the widest request.
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
        pooling=task_settings.pooling, labels=task_settings.labels, length_buckets=sorted(set(request.length_buckets)),
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
        pairs=task_settings.pairs, normalize=task_settings.normalize, prompts=task_settings.prompts,
        default_prompt_name=task_settings.default_prompt_name, matryoshka_dims=task_settings.matryoshka_dims,
        score_label=task_settings.score_label, warmup=request.warmup, onnx_accelerator=accelerator,
        onnx_trt_cache=request.onnx_trt_cache if accelerator == "tensorrt" else "",
        splade_pooling=task_settings.splade.pooling if task_settings.splade else None,
        splade_activation=task_settings.splade.activation if task_settings.splade else None,
        flag_heads=task_settings.flag_heads, sparse_skip_ids=task_settings.sparse_skip_ids, layout=layout,
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


def _copy_model_py(module: str, destination: Path) -> None:
    text = resources.files("builder.triton_models").joinpath(f"{module}.py").read_text()
    destination.write_text(text)


def _write_tokenizer(planned: PlannedBuild, tok_dir: Path) -> None:
    """tokenizer.json, model.py and the shared tokenization module, then the config (with the file's hash)."""
    version_dir = tok_dir / "1"
    version_dir.mkdir(parents=True)
    tokenizer = planned.source.tokenizer
    tokenizer.backend_tokenizer.save(str(version_dir / TOKENIZER_FILE))
    digest = hashlib.sha256((version_dir / TOKENIZER_FILE).read_bytes()).hexdigest()
    _copy_model_py("tokenizer", version_dir / "model.py")
    _copy_model_py("cancellation", version_dir / "cancellation.py")
    module = resources.files("contract").joinpath(TOKENIZATION_MODULE).read_text()
    (version_dir / TOKENIZATION_MODULE).write_text(module)
    configs.write_tokenizer_config(tok_dir, configs.tokenizer_config(planned.settings, int(tokenizer.pad_token_id or 0),
                                                                     digest), planned.settings)


def _cuda(runtime: str) -> tuple[str, dict[str, str]]:
    """The CUDA provider as the step will run it: the python runner's options, or (native) the onnxruntime
    backend's, which are onnxruntime's defaults."""
    return "CUDAExecutionProvider", dict(CUDA_PROVIDER_OPTIONS) if runtime == "python" else {}


def _onnx_outputs(path: Path, inputs: dict[str, np.ndarray], outputs: list[str], device: str, runtime: str
                  ) -> list[np.ndarray]:
    """The published model's outputs, on the GPU when it is built for one and onnxruntime-gpu is installed."""
    providers: list[str | tuple[str, dict[str, str]]] = ["CPUExecutionProvider"]
    if device == "gpu" and "CUDAExecutionProvider" in ort.get_available_providers():
        providers.insert(0, _cuda(runtime))
    session = ort.InferenceSession(str(path), providers=providers)
    return [np.asarray(o) for o in session.run(outputs, inputs)]


def _pack_graph(planned: PlannedBuild, path: Path, config: PretrainedConfig, log: Log) -> None:
    """Rewrite the optimized graph at `path` into the packed layout's (builder/packing.py): the GPU form on GPU
    builds, the CPU form on CPU builds. A graph the rewrite does not know is a build error."""
    s = planned.settings
    form: PackedForm = "gpu" if s.device == "gpu" else "cpu"
    with _step(log, f"{s.name}: rewriting the graph into the packed layout ({form} form)"):
        try:
            model = packed_model(onnx.load(str(path)), task=s.task, pooling=s.pooling,
                                 num_heads=int(config.num_attention_heads), hidden_size=int(config.hidden_size),
                                 offset=position_offset(config.model_type, config.pad_token_id), form=form)
        except PackingError as exc:
            raise BuildError(f"{s.name}: the packed layout cannot be built for this graph ({exc}); build it with "
                             "--layout padded") from None
        save_onnx(model, path)


def _packed_outputs(path: Path, inputs: dict[str, np.ndarray], outputs: list[str], device: str, work: Path
                    ) -> tuple[list[np.ndarray], str]:
    """The published packed graph's outputs on the parity inputs (packed on the host; per-token outputs come
    back [tokens, ...]), and where it ran: on the GPU where built for one and onnxruntime-gpu is installed;
    else a GPU form runs as its CPU form (the same graph but attention: builder/packing.py), which onnxruntime's
    CPU provider can run."""
    rows = packed_parity_inputs(inputs)
    if device == "gpu" and "CUDAExecutionProvider" in ort.get_available_providers():
        session = ort.InferenceSession(str(path), providers=[_cuda("python"), "CPUExecutionProvider"])
        return _run_packed(session, outputs, rows), "CUDAExecutionProvider"
    ran_on = "CPUExecutionProvider"
    if device == "gpu":
        save_onnx(cpu_form(onnx.load(str(path))), work / "cpu_form.onnx")
        path, ran_on = work / "cpu_form.onnx", "CPUExecutionProvider (the GPU form's CPU form: no CUDA here)"
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return _run_packed(session, outputs, rows), ran_on


def _run_packed(session: ort.InferenceSession, outputs: list[str], rows: PackedRows) -> list[np.ndarray]:
    """The rows fed as the graph declares (a graph without mean pooling reads fewer index tensors)."""
    return [np.asarray(o) for o in session.run(outputs, rows.feed({i.name for i in session.get_inputs()}))]


def _check(result: ParityResult, planned: PlannedBuild, log: Log) -> None:
    log(f"parity {planned.settings.name} {result.summary()}")
    if not result.passed:
        raise BuildError(f"{planned.settings.name}: parity failed, nothing published: {result.summary()}")


def _fused_export(planned: PlannedBuild, staging: Path, log: Log) -> Path | None:
    """The export with onnxruntime's MultiHeadAttention written in (builder/attention.py), for models whose
    attention the optimizer cannot fuse (ModernBERT); None, with a notice, when that export fails."""
    s = planned.settings
    path = staging / f".{s.name}_export" / "fused" / "model.onnx"
    path.parent.mkdir(parents=True)
    try:
        with _step(log, f"{s.name}: exporting ONNX with fused MultiHeadAttention"):
            fused = load_repository_model(planned.source.path, s, attn_implementation=ATTENTION)
            export_onnx(fused, s.output_names, path, s.opset)
    except Exception as exc:  # noqa: BLE001 - the plain export still works
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        log(f"notice: {s.name}: the export with fused attention failed ({reason}); using the plain export")
        return None
    return path


def build_one(planned: PlannedBuild, staging: Path, log: Log) -> tuple[list[ParityResult], OnnxFacts]:
    """Write every entry of one model into `staging`; raise BuildError when parity fails."""
    s, entries = planned.settings, planned.entries
    tokenizer = planned.source.tokenizer
    _write_tokenizer(planned, staging / entries["tokenizer"])

    with _step(log, f"{s.name}: loading the weights of {s.model}"):
        model: RepositoryModel = load_repository_model(planned.source.path, s, attn_implementation="eager")
    inputs = parity_inputs(tokenizer, s.max_seq_len, pairs=s.pairs)
    warmup_ids = configs.warmup_token_ids(tokenizer, s.max_seq_len)
    with _step(log, f"{s.name}: computing PyTorch reference outputs"):
        references = torch_references(model, inputs, attn_implementation="sdpa")
    reference = references[0]
    width = int(reference.shape[1])
    # per-token outputs: [batch, seq] + these dims ([] for one weight per token)
    token_dims = {name: [int(d) for d in ref.shape[2:]] for name, ref in zip(s.token_outputs, references[1:])}
    if s.matryoshka_dims and s.matryoshka_dims[-1] != width:
        raise BuildError(f"{s.name}: the embeddings are {width} wide, not {s.matryoshka_dims[-1]} "
                         "(config.hidden_size) as the matryoshka dimensions assumed")

    raw_path = staging / f".{s.name}_export" / "model.onnx"  # never published; TensorRT parses this one
    raw_path.parent.mkdir(parents=True)
    with _step(log, f"{s.name}: exporting ONNX (opset {s.opset})"):
        export_onnx(model, s.output_names, raw_path, s.opset)
    config = model.model.config
    del model
    optimizer_input = raw_path
    if "onnx" in entries and s.onnx_optimize and config.model_type in FUSED_EXPORT_TYPES:
        optimizer_input = _fused_export(planned, staging, log) or raw_path
    facts = OnnxFacts()
    results: list[ParityResult] = []
    if "onnx" in entries:
        onnx_dir = staging / entries["onnx"]
        onnx_path = onnx_dir / "1" / "model.onnx"
        onnx_path.parent.mkdir(parents=True, exist_ok=True)
        if s.onnx_optimize:
            try:
                heads = int(getattr(config, "num_attention_heads", 0) or 0)
                hidden = int(getattr(config, "hidden_size", 0) or 0)
                with _step(log, f"{s.name}: optimizing the ONNX graph ({s.onnx_precision})"):
                    facts.fused_ops = optimize_for_onnxruntime(optimizer_input, onnx_path, heads, hidden,
                                                               float16=s.onnx_precision == "fp16",
                                                               multi_head_attention=s.layout == "packed")
                facts.optimized = True
                facts.precision = s.onnx_precision
                log(f"{s.name}: onnxruntime transformer optimizer fused {facts.fused_ops} ({facts.precision})")
                if not {"Attention", "MultiHeadAttention"} & set(facts.fused_ops):
                    log(f"notice: {s.name}: onnxruntime {ort.__version__}'s optimizer fused no attention on this export; "
                        "the model runs with unfused attention (onnxruntime 1.31 fuses it on BERT exports of transformers 5)")
            except Exception as exc:  # noqa: BLE001 - the optimizer raises anything; the plain export still works
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                if s.layout == "packed":
                    raise BuildError(f"{s.name}: onnxruntime's transformer optimizer failed ({reason}); the packed "
                                     "layout needs its fused attention: build it with --layout padded") from None
                log(f"notice: {s.name}: onnxruntime's transformer optimizer failed ({reason}); publishing the plain export")
        if not facts.optimized:
            publish_onnx(raw_path, onnx_path)
        if s.layout == "packed":
            _pack_graph(planned, onnx_path, config, log)
            facts.layout = "packed"
            facts.packed_form = "gpu" if s.device == "gpu" else "cpu"
            counts = onnx_op_counts(onnx_path)
            facts.fused_ops = {op: counts[op] for op in FUSED_OPS if op in counts}
            log(f"{s.name}: packed graph ({facts.packed_form} form): {facts.fused_ops}")
        facts.ops = onnx_op_counts(onnx_path)
        artifact = "onnx_fp16" if facts.precision == "fp16" else "onnx"
        with _step(log, f"{s.name}: running {artifact} for the parity check"):
            if s.layout == "packed":
                outputs, ran_on = _packed_outputs(onnx_path, inputs, s.output_names, s.device, raw_path.parent)
            else:
                outputs, ran_on = _onnx_outputs(onnx_path, inputs, s.output_names, s.device, s.runtime), ""
        mask = inputs[ATTENTION_MASK]
        results.append(compare(artifact, s.task, reference, outputs[0], s.max_seq_len))
        for name, ref, got in zip(s.token_outputs, references[1:], outputs[1:]):  # packed: [T, ...] already
            got = got.reshape(len(got), -1) if s.layout == "packed" else real_tokens(got, mask)
            results.append(compare(artifact, s.task, real_tokens(ref, mask), got, s.max_seq_len, output=name,
                                   sentences=len(mask)))
        if s.layout == "packed":
            results = [r.model_copy(update={"layout": "packed", "ran_on": ran_on}) for r in results]
        if not s.skip_parity:
            for result in results:
                _check(result, planned, log)
        step_config = configs.onnx_config(s, width, facts.precision, planned.fingerprint, token_dims)
        if s.layout == "packed":
            configs.set_vocabulary(step_config, int(config.vocab_size), int(getattr(config, "type_vocab_size", 0) or 0))
        configs.write_step_config(onnx_dir, step_config, s, warmup_ids)
        if s.runtime == "python":
            _copy_model_py("onnx_runner", onnx_dir / "1" / "model.py")
            _copy_model_py("cancellation", onnx_dir / "1" / "cancellation.py")
            module = resources.files("contract").joinpath(BATCHING_MODULE).read_text()
            (onnx_dir / "1" / BATCHING_MODULE).write_text(module)
            if s.layout == "packed":  # the runner's packed path and the layout's rules (contract/packing.py)
                _copy_model_py("packed_runner", onnx_dir / "1" / "packed_runner.py")
                module = resources.files("contract").joinpath(PACKING_MODULE).read_text()
                (onnx_dir / "1" / PACKING_MODULE).write_text(module)
    if "trt" in entries:
        trt_dir = staging / entries["trt"]
        configs.write_step_config(trt_dir, configs.trt_config(s, width, token_dims), s, warmup_ids)
        plan_path = trt_dir / "1" / "model.plan"
        with _step(log, f"{s.name}: building the TensorRT FP16 engine (timing cache {planned.timing_cache})"):
            tensorrt_engine.build_engine(raw_path, plan_path, tensorrt_engine.profile_shapes(s), planned.timing_cache,
                                         s.trt_workspace_mib)
        with _step(log, f"{s.name}: running trt_fp16 for the parity check"):
            trt_outputs = tensorrt_engine.run_engine(plan_path, inputs, s.output_name)
        results.append(compare("trt_fp16", s.task, reference, trt_outputs, s.max_seq_len))
        if not s.skip_parity:
            _check(results[-1], planned, log)
    shutil.rmtree(raw_path.parent)
    for fmt in s.formats:
        ens_dir = staging / entries[f"{fmt}_ensemble"]
        configs.write_config(ens_dir, configs.ensemble_config(s, fmt, width))
        if s.labels is not None:
            (ens_dir / LABELS_FILE).write_text("".join(f"{label}\n" for label in s.labels or []))
    return results, facts


def _manifest(planned: PlannedBuild, parity: list[ParityResult], facts: OnnxFacts, version: int) -> Manifest:
    s = planned.settings
    return Manifest(
        builder_version=__import__("builder").BUILDER_VERSION, fingerprint=planned.fingerprint, version=version,
        source=planned.source.identity(), settings=s,
        artifacts={role: name for role, name in planned.entries.items()},
        versions=library_versions(), python=python_version(),
        gpu=tensorrt_engine.gpu_name() if "trt" in s.formats else None,
        parity=parity, onnx=facts, built_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )


def _stale_entries(repository: Path, planned: PlannedBuild) -> list[str]:
    """Existing entries of this NAME that the new build no longer produces (e.g. a dropped format)."""
    wanted = set(planned.entries.values())
    names = set(entry_names(planned.settings.name))
    return sorted(n for n in names - wanted if (repository / n).exists())


def build_all(requests: list[BuildRequest], repository: Path, log: Log = _stderr,
              keep_versions: int = 2) -> list[BuildOutcome]:
    """Build every request into `repository`; all are published together, or none.

    Each model is published as a new version directory of all its entries, next to the newest
    `keep_versions - 1` versions before it (builder/versions.py); Triton switches on a `load`."""
    check_names(requests)
    notices: list[str] = []
    planned = [plan(request, notices) for request in requests]
    for notice in notices:
        log(notice)
    outcomes: list[BuildOutcome] = []
    todo = []
    for p in planned:
        if is_up_to_date(p, repository):
            outcomes.append(BuildOutcome(p.settings.name, list(p.entries.values()), skipped=True, settings=p.settings))
        else:
            todo.append(p)
    if not todo:
        return outcomes
    with staging_directory(repository) as staging:
        entries: list[str] = []
        stale: list[str] = []
        for p in todo:
            started = time.monotonic()
            parity, facts = build_one(p, staging, log)
            version = next_version(repository / e for e in entry_names(p.settings.name))
            manifest = _manifest(p, parity, facts, version)
            for entry in p.entries.values():
                write_manifest(staging / entry, manifest)
                stage_version(staging / entry, version, repository / entry, keep_versions)
            entries += p.entries.values()
            stale += _stale_entries(repository, p)
            outcomes.append(BuildOutcome(p.settings.name, list(p.entries.values()), skipped=False, parity=parity,
                                         seconds=time.monotonic() - started, version=version, settings=p.settings))
        with _step(log, f"publishing {len(entries)} entries into {repository}"):
            publish(staging, repository, entries, stale)
    return outcomes
