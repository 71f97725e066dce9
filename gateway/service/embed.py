"""Embeddings: prompts prepended as the model was trained, pooled vectors from the model, optional
matryoshka truncation, L2-normalized by default when the model was trained so (its Normalize module)."""

from __future__ import annotations

import numpy as np

from gateway.errors import ErrorType, invalid
from gateway.service.inference import Inference, Inputs
from gateway.service.registry import Backend, ServedModel

# OpenAI-style `input_type` (NVIDIA's embedding NIM) -> the prompt names a model may call it by.
INPUT_TYPE_PROMPTS: dict[str, tuple[str, ...]] = {
    "query": ("query",),
    "passage": ("passage", "document", "doc"),
}


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero)."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, np.float32(1e-12))


def prompt_text(model: ServedModel, prompt_name: str | None) -> str:
    """The prefix of `prompt_name`, else of the model's default prompt, else ""; 400 for an unknown name."""
    name = prompt_name if prompt_name is not None else model.default_prompt
    if not name:
        return ""
    if name not in model.prompts:
        known = ", ".join(sorted(model.prompts)) or "none"
        raise invalid(f"model {model.name!r} has no prompt {name!r} (its prompts: {known})", type=ErrorType.UNKNOWN_PROMPT)
    return model.prompts[name]


def prompt_for_input_type(model: ServedModel, input_type: str | None) -> str | None:
    """The prompt name an `input_type` maps to; None (the default prompt) when not given or when the
    model has no prompts at all (a symmetric model); 400 when the model has prompts but none for it."""
    if input_type is None or not model.prompts:
        return None
    for name in INPUT_TYPE_PROMPTS[input_type]:
        if name in model.prompts:
            return name
    raise invalid(f"model {model.name!r} has no prompt for input_type {input_type!r} "
                  f"(its prompts: {', '.join(sorted(model.prompts))})", type=ErrorType.UNKNOWN_PROMPT)


def check_dimensions(model: ServedModel, dimensions: int | None) -> int | None:
    """The width to truncate to (None: the full width); 400 unless the model was built for it."""
    if dimensions is None or dimensions == model.embedding_dim:
        return None
    if dimensions in model.matryoshka_dims:
        return dimensions
    allowed = sorted({*model.matryoshka_dims, model.embedding_dim})
    reason = "" if model.matryoshka_dims else " (it was not built as a matryoshka model)"
    raise invalid(f"model {model.name!r} cannot produce {dimensions}-dimensional embeddings{reason}; "
                  f"allowed dimensions: {allowed}", type=ErrorType.UNSUPPORTED_DIMENSIONS)


def with_prompt(texts: list[str], prefix: str) -> list[str]:
    return [prefix + t for t in texts] if prefix else texts


async def embed(
    inference: Inference,
    model: ServedModel,
    inputs: Inputs,
    *,
    normalize: bool | None,
    dimensions: int | None,
    truncate: bool,
    backend: Backend | None,
    deadline: float,
) -> tuple[np.ndarray, int]:
    """Embeddings [n, dim] float32 in input order, and the billed token count. `dimensions` (checked
    by check_dimensions) keeps the first components; normalization comes after it."""
    result = await inference.run(model, inputs, truncate=truncate, backend=backend, deadline=deadline)
    vectors = result.outputs if dimensions is None else result.outputs[:, :dimensions]
    if model.normalize if normalize is None else normalize:
        vectors = l2_normalize(vectors)
    return np.ascontiguousarray(vectors, dtype=np.float32), result.tokens
