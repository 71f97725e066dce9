"""Served models, discovered from Triton's repository index and model configs (docs/contract.md).

An ensemble with a `task` parameter names a served model and one backend of it; its two steps
name the tokenizer model and the model step, whose configs say how the gateway tokenizes
(max_seq_len, pad id, tokenizer.json's sha256) and how it may batch (max batch size, GPU or CPU).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import orjson
from tritonclient.grpc import model_config_pb2

from contract import (
    API_BACKEND,
    Layout,
    BACKEND_PREFERENCE,
    ONNX_ACCELERATORS,
    TASKS,
    ApiBackend,
    PER_TOKEN_OUTPUTS,
    OnnxAccelerator,
    Param,
    Task,
    family_of,
    output_name,
)
from contract.batching import parse_sizes
from contract.ranges import decode_ranges
from gateway.errors import ErrorType, GatewayError, invalid, unavailable
from gateway.triton.client import IndexEntry

log = logging.getLogger("gateway.registry")

Backend = ApiBackend
# A model family (its tokenizer, model steps and ensembles) as Triton holds it. `ready`: served;
# `invalid`: Triton serves it but it does not follow the contract (skipped); `failed`: a load failed.
FamilyState = Literal["ready", "loading", "unloading", "unloaded", "failed", "invalid"]
LOADING_RETRY_AFTER_S = 2.0


@dataclass(frozen=True)
class Family:
    """One model NAME's entries in Triton's repository index and the state they add up to."""

    name: str
    state: FamilyState
    entries: tuple[IndexEntry, ...]
    reason: str = ""  # Triton's reason for `failed`

    @property
    def ensembles(self) -> list[str]:
        return sorted({e.name for e in self.entries if e.name.endswith("_ensemble")})

    @property
    def steps(self) -> list[str]:
        """The tokenizer and model steps: what the ensembles run."""
        return sorted({e.name for e in self.entries if not e.name.endswith("_ensemble")})

    def loaded(self) -> list[str]:
        """Entries with a version Triton holds (READY or LOADING)."""
        return sorted({e.name for e in self.entries if e.state in ("READY", "LOADING")})


def family_state(entries: list[IndexEntry]) -> tuple[FamilyState, str]:
    """What a family's index rows add up to: ready when an ensemble version is READY (during a reload
    the old version serves until the new one is ready), else loading, unloading, failed or unloaded."""
    ensembles = [e for e in entries if e.name.endswith("_ensemble")]
    if any(e.state == "READY" for e in ensembles or entries):
        return "ready", ""
    for state in ("LOADING", "UNLOADING"):
        if any(e.state == state for e in entries):
            return state.lower(), ""  # type: ignore[return-value]
    failures = [f"{e.name}: {e.reason}" for e in entries if e.reason not in ("", "unloaded")]
    if failures:
        return "failed", "; ".join(failures)
    return "unloaded", ""


def families_of(index: list[IndexEntry]) -> dict[str, Family]:
    """The model families of Triton's repository index, by the contract's entry names."""
    rows: dict[str, list[IndexEntry]] = {}
    for entry in index:
        name = family_of(entry.name)
        if name is not None:
            rows.setdefault(name, []).append(entry)
    families = {}
    for name, entries in sorted(rows.items()):
        state, reason = family_state(entries)
        families[name] = Family(name, state, tuple(sorted(entries)), reason)
    return families


@dataclass(frozen=True)
class Endpoint:
    """One backend of a served model: its ensemble (text in) and its model step (token ids in)."""

    triton_model: str  # the ensemble
    backend: Backend
    max_batch_size: int  # of the ensemble
    step_model: str = ""
    step_max_batch_size: int = 0
    step_on_gpu: bool = False
    step_widths: tuple[int, ...] = ()  # the shapes the step's batches take (contract/batching.py)
    step_rows: tuple[int, ...] = ()
    accelerator: OnnxAccelerator = "none"  # onnx: how the onnxruntime backend runs the step (ensemble parameter)
    precision: str = ""  # the step's `precision` parameter (fp16, fp32); "" when the step's config is not known
    step_layout: Layout = "padded"  # packed: the step takes packed batches (docs/contract.md)
    step_instances: int = 1  # instances Triton runs of the step (over every GPU it sees)
    # per-token outputs of the step (docs/contract.md): name -> floats per token (0: one weight per token)
    token_outputs: tuple[tuple[str, int], ...] = ()
    step_max_tokens: int = 0  # the step's token budget of one call (parameter max_batch_tokens; 0 = not declared)

    def token_width(self, name: str) -> int | None:
        """Floats per token of the per-token output `name` (0: a scalar), or None when the step has none."""
        return dict(self.token_outputs).get(name)


@dataclass(frozen=True)
class TokenizerInfo:
    """The tokenizer model of a served model, as its config describes it."""

    triton_model: str
    pad_token_id: int
    sha256: str  # of tokenizer.json; "" when the builder did not record it


@dataclass
class ServedModel:
    """A model NAME as the API exposes it, with its endpoints by backend."""

    name: str
    task: Task
    max_seq_len: int
    labels: tuple[str, ...] = ()
    embedding_dim: int = 0
    pooling: str = ""
    source: str = ""
    pairs: bool = False  # takes text pairs (rerank, pair classifiers) instead of single texts
    normalize: bool = True  # embed: the default of `normalize` (what the model was trained with)
    prompts: dict[str, str] = field(default_factory=dict)  # embed: prompt name -> prefix
    default_prompt: str = ""  # embed: the prompt used when a request names none
    matryoshka_dims: tuple[int, ...] = ()  # embed: dimensions a request may truncate to
    # embed: int8/uint8 ranges [2, width] by width, calibrated at build (contract/ranges.py); {} = not calibrated
    quantization_ranges: dict[int, np.ndarray] = field(default_factory=dict, compare=False)
    score_label: int = 0  # rerank: the logit that scores relevance
    sparse_skip_ids: tuple[int, ...] = ()  # embed with bge-m3 heads: token ids whose lexical weight is dropped
    tokenizer: TokenizerInfo | None = None
    endpoints: dict[Backend, Endpoint] = field(default_factory=dict)

    @property
    def output_name(self) -> str:
        return output_name(self.task)

    @property
    def output_width(self) -> int:
        return self.embedding_dim if self.task in ("embed", "sparse-embed") else len(self.labels)

    @property
    def default_backend(self) -> Backend:
        return next(b for b in BACKEND_PREFERENCE if b in self.endpoints)

    def endpoint(self, backend: Backend | None) -> Endpoint:
        """The endpoint for `backend`, or the preferred one (TensorRT when built)."""
        chosen = backend or self.default_backend
        if chosen not in self.endpoints:
            raise invalid(
                f"model {self.name!r} has no {chosen!r} backend (available: {sorted(self.endpoints)})",
                type=ErrorType.BACKEND_NOT_AVAILABLE,
            )
        return self.endpoints[chosen]


def _params(config: model_config_pb2.ModelConfig) -> dict[str, str]:
    return {k: v.string_value for k, v in config.parameters.items()}


def _on_gpu(config: model_config_pb2.ModelConfig) -> bool:
    groups = config.instance_group
    return any(g.kind == model_config_pb2.ModelInstanceGroup.KIND_GPU for g in groups) or (
        config.platform == "tensorrt_plan"
    )


def _instances(config: model_config_pb2.ModelConfig) -> int:
    """Instances Triton runs of a model: each group's count, on each of its GPUs for a KIND_GPU group (Triton
    lists the GPUs it placed a group without a `gpus` list on in the config it serves)."""
    total = 0
    for group in config.instance_group:
        gpus = len(group.gpus) if group.kind == model_config_pb2.ModelInstanceGroup.KIND_GPU else 0
        total += max(group.count, 1) * max(gpus, 1)
    return max(total, 1)


def _labels(text: str) -> tuple[str, ...]:
    """A classifier's labels: a JSON list of distinct non-empty strings (they key each prediction's scores)."""
    labels = orjson.loads(text)
    if not isinstance(labels, list) or not all(isinstance(x, str) and x for x in labels) or (
        len(set(labels)) != len(labels)
    ):
        raise ValueError(f"labels must be a JSON list of distinct non-empty strings, not {text[:80]!r}")
    return tuple(labels)


def _flag(params: dict[str, str], key: str, default: bool) -> bool:
    value = params.get(key, "").strip().lower()
    if not value:
        return default
    if value not in ("true", "false"):
        raise ValueError(f"parameter {key} must be true or false, not {value[:20]!r}")
    return value == "true"


def _accelerator(params: dict[str, str], backend: Backend) -> OnnxAccelerator:
    """The onnx step's execution accelerator (absent: `none`, repositories built before the parameter)."""
    value = params.get(Param.ONNX_ACCELERATOR, "none") if backend == "onnx" else "none"
    if value not in ONNX_ACCELERATORS:
        raise ValueError(f"{Param.ONNX_ACCELERATOR} must be one of {', '.join(ONNX_ACCELERATORS)}, not {value[:20]!r}")
    return value  # type: ignore[return-value]


def _token_outputs(step: model_config_pb2.ModelConfig) -> tuple[tuple[str, int], ...]:
    """The step's per-token outputs it declares (FP32 [-1] or [-1, dim]) by the contract's names."""
    found = []
    for output in step.output:
        dims = list(output.dims)
        if output.name in PER_TOKEN_OUTPUTS and dims and dims[0] == -1 and len(dims) <= 2:
            found.append((output.name, int(dims[1]) if len(dims) == 2 else 0))
    return tuple(found)


def _prompts(text: str) -> dict[str, str]:
    """An embedder's prompts: a JSON object of prompt name -> prefix text."""
    prompts = orjson.loads(text or "{}")
    if not isinstance(prompts, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in prompts.items()):
        raise ValueError(f"prompts must be a JSON object of strings, not {text[:80]!r}")
    return prompts


def parse_ensemble(
    config: model_config_pb2.ModelConfig, others: dict[str, model_config_pb2.ModelConfig] | None = None
) -> tuple[ServedModel, Endpoint] | None:
    """The served model described by one ensemble config, or None when it is not a gateway model.

    `others` holds the configs of the ready models by name, for the ensemble's steps.
    """
    params = _params(config)
    task = params.get(Param.TASK)
    if config.platform != "ensemble" or task not in TASKS:
        return None
    backend = API_BACKEND.get(params.get(Param.BACKEND, "onnx"))
    if backend is None:
        log.warning("ensemble %s has unknown backend %r; skipped", config.name, params.get(Param.BACKEND))
        return None
    model = ServedModel(
        name=params.get(Param.MODEL_NAME) or config.name,
        task=task,  # type: ignore[arg-type]
        max_seq_len=int(params.get(Param.MAX_SEQ_LEN, "512")),
        labels=_labels(params[Param.LABELS]) if task in ("classify", "rerank") else (),
        embedding_dim=int(params.get(Param.EMBEDDING_DIM, "0")),
        pooling=params.get(Param.POOLING, ""),
        source=params.get(Param.SOURCE, ""),
        pairs=task == "rerank" or _flag(params, Param.PAIRS, False),
        normalize=_flag(params, Param.NORMALIZE, True),
        prompts=_prompts(params.get(Param.PROMPTS, "")),
        default_prompt=params.get(Param.DEFAULT_PROMPT, ""),
        matryoshka_dims=parse_sizes(params.get(Param.MATRYOSHKA_DIMS, "")),
        score_label=int(params.get(Param.SCORE_LABEL, "0") or 0),
        sparse_skip_ids=parse_sizes(params.get(Param.SPARSE_SKIP_IDS, "")),
        quantization_ranges=decode_ranges(params.get(Param.QUANTIZATION_RANGES, "")),
    )
    if model.max_seq_len <= 0:
        raise ValueError(f"max_seq_len {model.max_seq_len} is not positive")
    if model.default_prompt and model.default_prompt not in model.prompts:
        raise ValueError(f"default prompt {model.default_prompt!r} is not one of its prompts")
    if task == "rerank" and not 0 <= model.score_label < len(model.labels):
        raise ValueError(f"score_label {model.score_label} is not an index of its {len(model.labels)} logits")
    if any(d > model.embedding_dim or d <= 0 for d in model.matryoshka_dims):
        raise ValueError(f"matryoshka_dims {model.matryoshka_dims} outside 1..{model.embedding_dim}")
    if not set(model.quantization_ranges) <= {*model.matryoshka_dims, model.embedding_dim}:
        raise ValueError(f"quantization ranges of widths {sorted(model.quantization_ranges)} it does not serve")
    if model.output_width <= 0:
        log.warning("ensemble %s has no labels/embedding_dim; skipped", config.name)
        return None
    steps = [s.model_name for s in config.ensemble_scheduling.step]
    accelerator = _accelerator(params, backend)
    endpoint = Endpoint(config.name, backend, int(config.max_batch_size) or 1, accelerator=accelerator)
    others = others or {}
    if len(steps) == 2 and steps[0] in others and steps[1] in others:
        tok, step = others[steps[0]], others[steps[1]]
        tok_params = _params(tok)
        model.tokenizer = TokenizerInfo(
            triton_model=tok.name,
            pad_token_id=int(tok_params.get(Param.PAD_TOKEN_ID, "0") or 0),
            sha256=tok_params.get(Param.TOKENIZER_SHA256, ""),
        )
        step_params = _params(step)
        endpoint = Endpoint(
            config.name, backend, endpoint.max_batch_size, step_model=step.name,
            step_max_batch_size=int(step.max_batch_size) or 1, step_on_gpu=_on_gpu(step),
            step_widths=parse_sizes(step_params.get(Param.BATCH_WIDTHS, "")),
            step_rows=parse_sizes(step_params.get(Param.BATCH_ROWS, "")), accelerator=accelerator,
            precision=step_params.get(Param.PRECISION, ""),
            step_layout="packed" if step_params.get(Param.LAYOUT) == "packed" else "padded",
            step_instances=_instances(step),
            token_outputs=_token_outputs(step), step_max_tokens=int(step_params.get(Param.MAX_BATCH_TOKENS, "0") or 0),
        )
    return model, endpoint


class Registry:
    """The set of served models; `replace` rebuilds it from Triton's ready configs."""

    def __init__(self, refresh_interval_s: float) -> None:
        self.models: dict[str, ServedModel] = {}
        self.families: dict[str, Family] = {}
        self.refresh_interval_s = refresh_interval_s
        self.index: list[IndexEntry] | None = None  # Triton's repository index the models came from
        self.generation = 0  # +1 per refresh
        self._last_refresh = float("-inf")
        self._changing: dict[str, FamilyState] = {}  # families an admin call is loading or unloading here

    def replace(self, configs: list[model_config_pb2.ModelConfig], index: list[IndexEntry] | None = None) -> None:
        """Rebuild the served models from the ready models' configs; a malformed ensemble is skipped."""
        by_name = {c.name: c for c in configs}
        models: dict[str, ServedModel] = {}
        for config in configs:
            try:
                parsed = parse_ensemble(config, by_name)
            except (ValueError, KeyError, TypeError, orjson.JSONDecodeError) as exc:
                log.warning("ensemble %s does not follow the repository contract (%s); skipped", config.name, exc)
                continue
            if parsed is None:
                continue
            model, endpoint = parsed
            served = models.setdefault(model.name, model)
            served.endpoints[endpoint.backend] = endpoint
        if sorted(models) != sorted(self.models):
            log.info("served models: %s", {n: sorted(m.endpoints) for n, m in models.items()})
        self.models = models
        self.index = index
        self.families = families_of(index or [])
        for name, family in self.families.items():
            if family.state == "ready" and name not in models:
                self.families[name] = Family(name, "invalid", family.entries, "does not follow the repository contract")
        self.touch()

    def changing(self, name: str, state: FamilyState | None) -> None:
        """Mark a family as being loaded or unloaded by this worker (None: done)."""
        if state is None:
            self._changing.pop(name, None)
        else:
            self._changing[name] = state

    def state_of(self, name: str) -> FamilyState | None:
        """A family's state; None when Triton's repository has no such family."""
        if name in self._changing and name not in self.models:
            return self._changing[name]
        family = self.families.get(name)
        return family.state if family else ("ready" if name in self.models else None)

    def _not_served(self, name: str) -> GatewayError:
        """404 for an unknown or unloaded family; 503 with Retry-After for one that is loading."""
        state = self.state_of(name)
        if state == "loading":
            return unavailable(f"model {name!r} is loading; retry shortly", type=ErrorType.MODEL_LOADING,
                               retry_after_s=LOADING_RETRY_AFTER_S)
        if state is None:
            return GatewayError(ErrorType.MODEL_NOT_FOUND, f"model {name!r} is not served (served: {sorted(self.models)})")
        return GatewayError(ErrorType.MODEL_NOT_FOUND, f"model {name!r} is not served: it is {state} "
                            f"(served: {sorted(self.models)})")

    def touch(self) -> None:
        """Record a refresh (also one that found nothing changed)."""
        self.generation += 1
        self._last_refresh = time.monotonic()

    def refresh_due(self) -> bool:
        return time.monotonic() - self._last_refresh >= self.refresh_interval_s

    def resolve_any(self, name: str | None) -> ServedModel:
        """The model a request names, or the only one served (routes that work with any task)."""
        if name is None:
            if len(self.models) == 1:
                return next(iter(self.models.values()))
            if not self.models:
                raise GatewayError(ErrorType.MODEL_NOT_FOUND, "no model is served")
            raise invalid(f"several models are served ({sorted(self.models)}): name one in `model`",
                          type=ErrorType.MODEL_REQUIRED)
        model = self.models.get(name)
        if model is None:
            raise self._not_served(name)
        return model

    def resolve(self, name: str | None, task: Task) -> ServedModel:
        """The model a request names (or the only one of `task`), checked against the task."""
        if name is None:
            candidates = [m for m in self.models.values() if m.task == task]
            if len(candidates) == 1:
                return candidates[0]
            if not candidates:
                raise GatewayError(ErrorType.MODEL_NOT_FOUND, f"no {task} model is served")
            raise invalid(
                f"several {task} models are served ({sorted(m.name for m in candidates)}): name one in `model`",
                type=ErrorType.MODEL_REQUIRED,
            )
        model = self.models.get(name)
        if model is None:
            raise self._not_served(name)
        if model.task != task:
            raise invalid(f"model {name!r} serves the {model.task} task, not {task}", type=ErrorType.WRONG_TASK)
        return model
