"""Find the model (local directory or hub id through the Hugging Face cache) and check it is usable."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from transformers import (
    AutoConfig,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedTokenizerFast,
)

from builder.checks import check_model
from builder.errors import BuildError

# Encoder-only families whose sequence-classification / base models export with the 3-tensor interface.
ENCODER_TYPES = frozenset(
    {
        "bert", "roberta", "xlm-roberta", "camembert", "electra", "distilbert", "albert", "mpnet",
        "deberta", "deberta-v2", "ernie", "xlm", "megatron-bert", "rembert", "roformer", "nezha",
        "mobilebert", "squeezebert", "funnel", "layoutlm", "luke", "data2vec-text", "xmod", "bge-m3",
        "modernbert", "nomic_bert", "new", "jina_bert",
    }
)
# Families whose position ids start after padding_idx (max_position_embeddings - padding_idx - 1 usable).
OFFSET_POSITION_TYPES = frozenset({"roberta", "xlm-roberta", "camembert", "data2vec-text", "xmod", "luke"})
HUB_PATTERNS = ["*.json", "*.txt", "*.model", "*.spm", "sentencepiece*", "*Pooling/*", "sparse_linear.pt",
                "colbert_linear.pt"]
WEIGHT_PATTERNS = {"safetensors": ["*.safetensors"], "bin": ["pytorch_model*.bin"]}


def _weight_patterns(model: str, revision: str | None) -> list[str]:
    """safetensors when the repository has them, else PyTorch .bin files (never both: they are large)."""
    from huggingface_hub import HfApi

    try:
        files = HfApi().list_repo_files(model, revision=revision)
    except Exception:  # noqa: BLE001 - offline or unknown: snapshot_download reports it precisely
        return WEIGHT_PATTERNS["safetensors"] + WEIGHT_PATTERNS["bin"]
    if any(f.endswith(".safetensors") for f in files):
        return WEIGHT_PATTERNS["safetensors"]
    return WEIGHT_PATTERNS["bin"]


@dataclass(frozen=True)
class ModelSource:
    """A model on local disk, with what identifies its exact version."""

    spec: str  # what the user gave (hub id or path)
    path: Path
    revision: str | None  # hub commit hash; None for local directories
    file_hashes: dict[str, str]  # local directories: relative path -> sha256
    config: PretrainedConfig
    tokenizer: PreTrainedTokenizerFast

    def identity(self) -> dict[str, Any]:
        """What the manifest records as the source, and what a rebuild decision depends on."""
        if self.revision is not None:
            return {"id": self.spec, "revision": self.revision}
        return {"path": str(self.path), "files": self.file_hashes}


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def hash_directory(path: Path) -> dict[str, str]:
    """sha256 of every file under `path` (hidden files skipped), keyed by relative path."""
    return {
        str(f.relative_to(path)): _sha256(f)
        for f in sorted(path.rglob("*"))
        if f.is_file() and not any(part.startswith(".") for part in f.relative_to(path).parts)
    }


def _download(model: str, revision: str | None) -> tuple[Path, str]:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    try:
        patterns = HUB_PATTERNS + _weight_patterns(model, revision)
        local = Path(snapshot_download(repo_id=model, revision=revision, allow_patterns=patterns))
    except RepositoryNotFoundError:
        raise BuildError(f"unknown model id {model!r}: not found on the Hugging Face hub (or needs HF_TOKEN)") from None
    except LocalEntryNotFoundError:
        raise BuildError(f"cannot fetch model {model!r}: the hub is unreachable and it is not in the HF cache") from None
    except (HfHubHTTPError, OSError, ValueError) as exc:
        raise BuildError(f"cannot fetch model {model!r}: {str(exc).splitlines()[0]}") from None
    return local, local.name  # snapshots/<commit hash>


def resolve_source(model: str, revision: str | None = None) -> ModelSource:
    """Load config and fast tokenizer of `model`; raise BuildError if it is not a usable encoder."""
    local = check_model(model)
    if local is not None:
        path = local
        try:
            hashes = hash_directory(path)
        except OSError as exc:
            raise BuildError(f"model path {model!r} is not readable: {exc.strerror}") from None
        commit = None
        path = path.resolve()
    else:
        path, commit = _download(model, revision)
        hashes = {}
    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError, KeyError, json.JSONDecodeError) as exc:
        raise BuildError(f"cannot read the config of {model!r}: {str(exc).splitlines()[0]}") from None
    decoder = getattr(config, "is_encoder_decoder", False) or getattr(config, "is_decoder", False)
    if config.model_type not in ENCODER_TYPES or decoder:
        raise BuildError(f"model {model!r} is a {config.model_type!r} model, not a supported encoder (BERT family)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # noqa: BLE001 - tokenizer loading raises many types
        raise BuildError(f"cannot load the tokenizer of {model!r}: {str(exc).splitlines()[0]}") from None
    if not getattr(tokenizer, "is_fast", False) or getattr(tokenizer, "backend_tokenizer", None) is None:
        raise BuildError(f"model {model!r} has no fast (Rust `tokenizers`) tokenizer; one is required")
    if tokenizer.backend_tokenizer.get_vocab_size() <= len(set(tokenizer.all_special_ids)):
        # transformers 5 builds an empty tokenizer when a checkpoint ships no tokenizer files
        raise BuildError(f"model {model!r} has no tokenizer files (tokenizer.json, vocab.txt, ...); a fast tokenizer is required")
    return ModelSource(model, path, commit, hashes, config, cast(PreTrainedTokenizerFast, tokenizer))


def model_max_seq_len(source: ModelSource) -> int:
    """The longest sequence the model accepts (position embeddings, tokenizer limit)."""
    limit = int(getattr(source.config, "max_position_embeddings", 512) or 512)
    if source.config.model_type in OFFSET_POSITION_TYPES:
        limit -= int(getattr(source.config, "pad_token_id", 1) or 1) + 1
    tok_limit = int(getattr(source.tokenizer, "model_max_length", 0) or 0)
    if 0 < tok_limit < 1_000_000:
        limit = min(limit, tok_limit)
    return limit


# sentence-transformers Pooling modes (legacy `pooling_mode_*` keys and the `pooling_mode` key of v5+)
_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max", "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken",
}
SUPPORTED_POOLING = ("mean", "cls", "lasttoken")
# sentence-transformers modules the export runs, by class name (the last part of modules.json's `type`, in a
# `sentence_transformers.` package: ST 5 `sentence_transformers.models.X` / `sentence_transformers.sparse_encoder.
# models.X`, ST 6 `sentence_transformers.base.modules...X` / `...sparse_encoder.modules...X`). Anything else
# (Dense, LayerNorm, Router, SparseAutoEncoder, a PyLate module, ...) changes the output: the build is refused,
# naming it, never approximated.
_ENCODER_MODULES = ("Transformer", "MLMTransformer")
_DENSE_MODULES = ("Pooling", "Normalize")
_SPARSE_MODULES = ("SpladePooling",)
SPLADE_POOLING = ("max", "sum")
SPLADE_ACTIVATIONS = ("relu", "log1p_relu")
# FlagEmbedding's bge-m3 heads, saved next to the encoder's weights (FlagEmbedding BGEM3 runner)
SPARSE_HEAD_FILE = "sparse_linear.pt"
COLBERT_HEAD_FILE = "colbert_linear.pt"


def module_class(module_type: str) -> str | None:
    """The class name of a modules.json `type` the builder knows, or None (another package or class)."""
    if not module_type.startswith("sentence_transformers."):
        return None
    name = module_type.rsplit(".", 1)[-1]
    return name if name in (*_ENCODER_MODULES, *_DENSE_MODULES, *_SPARSE_MODULES) else None


@dataclass(frozen=True)
class SpladeConfig:
    """A SpladePooling module's config: log(1 + act(logits)) pooled over the real tokens."""

    pooling: str = "max"  # max or sum over the tokens
    activation: str = "relu"  # relu: log1p(relu(x)); log1p_relu: log1p(log1p(relu(x)))


@dataclass(frozen=True)
class SentenceTransformersConfig:
    """How a sentence-transformers layout says the model is used (all None / empty without one)."""

    modules: tuple[str, ...] | None = None  # module types of modules.json; None when there is no modules.json
    pooling: str | None = None  # a mode the export can do
    pooling_problem: str | None = None  # why the Pooling config cannot be honoured
    max_seq_length: int | None = None  # sentence_bert_config.json
    prompts: dict[str, str] = field(default_factory=dict)  # config_sentence_transformers.json
    default_prompt_name: str | None = None
    model_type: str | None = None  # config_sentence_transformers.json: SentenceTransformer, SparseEncoder, ...
    transformer_task: str | None = None  # sentence_bert_config.json (ST 6): feature-extraction, fill-mask, ...
    splade: SpladeConfig | None = None  # the SpladePooling module's config, when there is one
    splade_problem: str | None = None  # why the SpladePooling config cannot be honoured

    @property
    def normalize(self) -> bool | None:
        """Whether a Normalize module ends the pipeline; None without modules.json."""
        return None if self.modules is None else any(module_class(m) == "Normalize" for m in self.modules)

    @property
    def is_sparse_encoder(self) -> bool:
        """A SparseEncoder folder (MLM head + SpladePooling), in the ST 5 or the ST 6 layout."""
        classes = {module_class(m) for m in self.modules or ()}
        return (self.model_type == "SparseEncoder" or "MLMTransformer" in classes or "SpladePooling" in classes
                or self.transformer_task == "fill-mask")

    @property
    def is_multi_vector(self) -> bool:
        """A ColBERT-style folder: sentence-transformers' MultiVectorEncoder, or a PyLate save."""
        return self.model_type == "MultiVectorEncoder" or any(
            m.startswith("pylate.") or m.endswith("MultiVectorMask") for m in self.modules or ())

    def unsupported_modules(self) -> list[str]:
        """Modules the export of this layout cannot run (their modules.json types)."""
        allowed = (*_ENCODER_MODULES, *_SPARSE_MODULES) if self.is_sparse_encoder else ("Transformer", *_DENSE_MODULES)
        return [m for m in self.modules or () if module_class(m) not in allowed]


@dataclass(frozen=True)
class FlagHeads:
    """FlagEmbedding bge-m3 heads found next to the weights (paths; None when absent)."""

    sparse: Path | None = None
    colbert: Path | None = None


def flag_heads(path: Path) -> FlagHeads:
    """bge-m3's `sparse_linear.pt` / `colbert_linear.pt`, when the model folder ships them."""
    sparse, colbert = path / SPARSE_HEAD_FILE, path / COLBERT_HEAD_FILE
    return FlagHeads(sparse if sparse.is_file() else None, colbert if colbert.is_file() else None)


def _read_json(path: Path) -> Any:
    """A JSON file's content, or None when it does not exist; BuildError when it is not JSON."""
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BuildError(f"cannot read {path}: {str(exc).splitlines()[0]}") from None


def _pooling(config: dict[str, Any]) -> tuple[str | None, str | None]:
    """(mode, None) for a Pooling config the export can do, else (None, what it asks for)."""
    mode = config.get("pooling_mode")
    modes = [mode] if isinstance(mode, str) else list(mode or [])
    if not modes:
        modes = [name for key, name in _POOLING_KEYS.items() if config.get(key)] or ["mean"]
    if len(modes) > 1:
        return None, f"several pooling modes at once ({', '.join(map(str, modes))})"
    if modes[0] not in SUPPORTED_POOLING:
        return None, f"pooling mode {modes[0]!r}"
    if config.get("include_prompt", True) is False:
        return None, "include_prompt: false (prompt tokens left out of the pooling)"
    return str(modes[0]), None


def read_sentence_transformers(path: Path) -> SentenceTransformersConfig:
    """modules.json, the Pooling module's config, sentence_bert_config.json and config_sentence_transformers.json."""
    modules = _read_json(path / "modules.json")
    if modules is not None and not isinstance(modules, list):
        raise BuildError(f"cannot read {path / 'modules.json'}: not a list of modules")
    module_types = None if modules is None else tuple(str(m.get("type", "")) for m in modules if isinstance(m, dict))
    candidates = [path / str(m.get("path", "")) / "config.json" for m in modules or []
                  if isinstance(m, dict) and module_class(str(m.get("type", ""))) == "Pooling"]
    candidates += [p for p in sorted(path.glob("*Pooling/config.json")) if "Splade" not in p.parent.name]
    splade_dirs = [path / str(m.get("path", "")) for m in modules or []
                   if isinstance(m, dict) and module_class(str(m.get("type", ""))) == "SpladePooling"]
    splade, splade_problem = _splade(splade_dirs[0] / "config.json") if splade_dirs else (None, None)
    pooling: str | None = None
    problem: str | None = None
    for candidate in candidates:
        data = _read_json(candidate)
        if isinstance(data, dict):
            pooling, problem = _pooling(data)
            break
    bert_config = _read_json(path / "sentence_bert_config.json")
    bert_config = bert_config if isinstance(bert_config, dict) else {}
    max_seq_length = bert_config.get("max_seq_length")
    transformer_task = bert_config.get("transformer_task")
    st_config = _read_json(path / "config_sentence_transformers.json")
    st_config = st_config if isinstance(st_config, dict) else {}
    prompts, default = st_config.get("prompts"), st_config.get("default_prompt_name")
    return SentenceTransformersConfig(
        modules=module_types, pooling=pooling, pooling_problem=problem,
        max_seq_length=int(max_seq_length) if isinstance(max_seq_length, int) and max_seq_length > 0 else None,
        prompts={str(k): str(v) for k, v in prompts.items()} if isinstance(prompts, dict) else {},
        default_prompt_name=str(default) if default else None,
        model_type=str(st_config["model_type"]) if st_config.get("model_type") else None,
        transformer_task=str(transformer_task) if transformer_task else None,
        splade=splade, splade_problem=splade_problem,
    )


def _splade(config_path: Path) -> tuple[SpladeConfig | None, str | None]:
    """A SpladePooling config.json (absent: SPLADE's defaults, max and relu), or why it cannot be honoured."""
    data = _read_json(config_path) or {}
    if not isinstance(data, dict):
        return None, f"{config_path} is not a JSON object"
    pooling = str(data.get("pooling_strategy", "max"))
    activation = str(data.get("activation_function", "relu"))
    if pooling not in SPLADE_POOLING:
        return None, f"SpladePooling pooling_strategy {pooling!r} (the export does {', '.join(SPLADE_POOLING)})"
    if activation not in SPLADE_ACTIVATIONS:
        return None, (f"SpladePooling activation_function {activation!r} (the export does "
                      f"{', '.join(SPLADE_ACTIVATIONS)})")
    return SpladeConfig(pooling, activation), None


def config_matryoshka_dims(config: PretrainedConfig) -> list[int] | None:
    """`matryoshka_dimensions` of the model's config.json, when it declares them."""
    dims = getattr(config, "matryoshka_dimensions", None)
    if not dims:
        return None
    try:
        return [int(d) for d in dims]
    except (TypeError, ValueError):
        raise BuildError(f"config.json matryoshka_dimensions {dims!r} is not a list of integers") from None


def config_labels(config: PretrainedConfig) -> list[str] | None:
    """Label names in index order from `config.id2label`, or None when the model has no labels."""
    id2label = getattr(config, "id2label", None) or {}
    if not id2label:
        return None
    return [str(id2label.get(i, id2label.get(str(i), f"LABEL_{i}"))) for i in range(len(id2label))]


def has_classification_head(config: PretrainedConfig) -> bool:
    """True when the checkpoint declares a sequence-classification architecture."""
    return any(a.endswith("ForSequenceClassification") for a in (config.architectures or []))
