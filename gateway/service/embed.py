"""Embeddings: the pooled vectors of the ensemble, L2-normalized by the gateway on request."""

from __future__ import annotations

import numpy as np

from gateway.service.inference import Inference
from gateway.service.registry import Backend, ServedModel


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero)."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, np.float32(1e-12))


async def embed(
    inference: Inference,
    model: ServedModel,
    texts: list[str],
    *,
    normalize: bool,
    truncate: bool,
    backend: Backend | None,
    deadline: float,
) -> tuple[np.ndarray, int]:
    """Embeddings [n, dim] float32 for `texts` in order, and the billed token count."""
    result = await inference.run(model, texts, truncate=truncate, backend=backend, deadline=deadline)
    vectors = l2_normalize(result.outputs) if normalize else result.outputs
    return vectors.astype(np.float32, copy=False), result.tokens
