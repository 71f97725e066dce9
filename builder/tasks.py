"""The task-specific part of a build's settings: labels and the relevance logit (classify, rerank), pooling, prompts,
matryoshka dimensions and bge-m3's heads (embed), SPLADE (sparse-embed), each checked against the checkpoint."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

from builder.errors import BuildError
from builder.settings import BuildRequest, Pooling, Task
from builder.source import (
    SUPPORTED_POOLING,
    ModelSource,
    SentenceTransformersConfig,
    SpladeConfig,
    config_labels,
    config_matryoshka_dims,
    flag_heads,
    has_classification_head,
)

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


def task_settings(request: BuildRequest, source: ModelSource, task: Task, st: SentenceTransformersConfig) -> TaskSettings:
    if task == "embed":
        return _embed_settings(request, source, st)
    if task == "sparse-embed":
        return _sparse_settings(request, source, st)
    labels = _labels(request, source, task)
    if task == "rerank":
        return TaskSettings(labels=labels, pairs=True, score_label=_score_label(request, labels))
    return TaskSettings(labels=labels, pairs=bool(request.pairs))
