"""Served models, discovered from Triton's repository index and ensemble configs (docs/contract.md)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Literal

import orjson
from tritonclient.grpc import model_config_pb2

from gateway.api.errors import BadRequest, ModelNotFound

log = logging.getLogger("gateway.registry")

Task = Literal["classify", "embed"]
Backend = Literal["onnx", "trt"]
_BACKENDS: dict[str, Backend] = {"onnx": "onnx", "trt_fp16": "trt", "trt": "trt"}
_PREFERENCE: tuple[Backend, ...] = ("trt", "onnx")


@dataclass(frozen=True)
class Endpoint:
    """One ensemble in Triton that serves a model with one backend."""

    triton_model: str
    backend: Backend
    max_batch_size: int


@dataclass
class ServedModel:
    """A model NAME as the API exposes it, with its ensembles by backend."""

    name: str
    task: Task
    max_seq_len: int
    labels: tuple[str, ...] = ()
    embedding_dim: int = 0
    pooling: str = ""
    source: str = ""
    endpoints: dict[Backend, Endpoint] = field(default_factory=dict)

    @property
    def output_name(self) -> str:
        return "logits" if self.task == "classify" else "embeddings"

    @property
    def output_width(self) -> int:
        return len(self.labels) if self.task == "classify" else self.embedding_dim

    @property
    def default_backend(self) -> Backend:
        return next(b for b in _PREFERENCE if b in self.endpoints)

    def endpoint(self, backend: Backend | None) -> Endpoint:
        """The ensemble for `backend`, or the preferred one (TensorRT when built)."""
        chosen = backend or self.default_backend
        if chosen not in self.endpoints:
            raise BadRequest(
                f"model {self.name!r} has no {chosen!r} backend (available: {sorted(self.endpoints)})",
                type="backend_not_available",
            )
        return self.endpoints[chosen]


def parse_ensemble(config: model_config_pb2.ModelConfig) -> tuple[ServedModel, Endpoint] | None:
    """The served model described by one ensemble config, or None when it is not a gateway model."""
    params = {k: v.string_value for k, v in config.parameters.items()}
    task = params.get("task")
    if config.platform != "ensemble" or task not in ("classify", "embed"):
        return None
    backend = _BACKENDS.get(params.get("backend", "onnx"))
    if backend is None:
        log.warning("ensemble %s has unknown backend %r; skipped", config.name, params.get("backend"))
        return None
    model = ServedModel(
        name=params.get("model_name") or config.name,
        task=task,  # type: ignore[arg-type]
        max_seq_len=int(params.get("max_seq_len", "512")),
        labels=tuple(orjson.loads(params["labels"])) if task == "classify" else (),
        embedding_dim=int(params.get("embedding_dim", "0")),
        pooling=params.get("pooling", ""),
        source=params.get("source", ""),
    )
    if model.output_width <= 0:
        log.warning("ensemble %s has no labels/embedding_dim; skipped", config.name)
        return None
    return model, Endpoint(config.name, backend, int(config.max_batch_size) or 1)


class Registry:
    """The set of served models; `refresh` re-reads it from Triton."""

    def __init__(self, refresh_interval_s: float) -> None:
        self.models: dict[str, ServedModel] = {}
        self.refresh_interval_s = refresh_interval_s
        self._last_refresh = float("-inf")

    def replace(self, configs: list[model_config_pb2.ModelConfig]) -> None:
        """Rebuild the served models from the ready models' configs."""
        models: dict[str, ServedModel] = {}
        for config in configs:
            parsed = parse_ensemble(config)
            if parsed is None:
                continue
            model, endpoint = parsed
            served = models.setdefault(model.name, model)
            served.endpoints[endpoint.backend] = endpoint
        self.models = models
        self._last_refresh = time.monotonic()
        log.info("served models: %s", {n: sorted(m.endpoints) for n, m in models.items()})

    def refresh_due(self) -> bool:
        return time.monotonic() - self._last_refresh >= self.refresh_interval_s

    def resolve(self, name: str | None, task: Task) -> ServedModel:
        """The model a request names (or the only one of `task`), checked against the task."""
        if name is None:
            candidates = [m for m in self.models.values() if m.task == task]
            if len(candidates) == 1:
                return candidates[0]
            if not candidates:
                raise ModelNotFound(f"no {task} model is served")
            raise BadRequest(
                f"several {task} models are served ({sorted(m.name for m in candidates)}): name one in `model`",
                type="model_required",
            )
        model = self.models.get(name)
        if model is None:
            raise ModelNotFound(f"model {name!r} is not served (served: {sorted(self.models)})")
        if model.task != task:
            raise BadRequest(f"model {name!r} is a {model.task} model, not {task}", type="wrong_task")
        return model
