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
HUB_PATTERNS = ["*.json", "*.txt", "*.model", "*.spm", "sentencepiece*", "*Pooling/*"]
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
# Modules an embedding model may have: the encoder, its pooling and normalisation (all inside our graph or
# published as parameters). Anything else (Dense, LayerNorm, ...) changes the embeddings.
_KNOWN_MODULES = ("Transformer", "Pooling", "Normalize")


@dataclass(frozen=True)
class SentenceTransformersConfig:
    """How a sentence-transformers layout says the model is used (all None / empty without one)."""

    modules: tuple[str, ...] | None = None  # module types of modules.json; None when there is no modules.json
    pooling: str | None = None  # a mode the export can do
    pooling_problem: str | None = None  # why the Pooling config cannot be honoured
    max_seq_length: int | None = None  # sentence_bert_config.json
    prompts: dict[str, str] = field(default_factory=dict)  # config_sentence_transformers.json
    default_prompt_name: str | None = None

    @property
    def normalize(self) -> bool | None:
        """Whether a Normalize module ends the pipeline; None without modules.json."""
        return None if self.modules is None else any(m.endswith("Normalize") for m in self.modules)

    def unsupported_modules(self) -> list[str]:
        return [m for m in self.modules or () if not m.endswith(_KNOWN_MODULES)]


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
                  if isinstance(m, dict) and str(m.get("type", "")).endswith("Pooling")]
    candidates += sorted(path.glob("*Pooling/config.json"))
    pooling: str | None = None
    problem: str | None = None
    for candidate in candidates:
        data = _read_json(candidate)
        if isinstance(data, dict):
            pooling, problem = _pooling(data)
            break
    bert_config = _read_json(path / "sentence_bert_config.json")
    max_seq_length = bert_config.get("max_seq_length") if isinstance(bert_config, dict) else None
    st_config = _read_json(path / "config_sentence_transformers.json")
    st_config = st_config if isinstance(st_config, dict) else {}
    prompts, default = st_config.get("prompts"), st_config.get("default_prompt_name")
    return SentenceTransformersConfig(
        modules=module_types, pooling=pooling, pooling_problem=problem,
        max_seq_length=int(max_seq_length) if isinstance(max_seq_length, int) and max_seq_length > 0 else None,
        prompts={str(k): str(v) for k, v in prompts.items()} if isinstance(prompts, dict) else {},
        default_prompt_name=str(default) if default else None,
    )


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
