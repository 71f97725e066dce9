"""Classification: softmax over the ensemble's logits, labels from the repository."""

from __future__ import annotations

from typing import Any

import numpy as np

from gateway.service.inference import Inference
from gateway.service.registry import Backend, ServedModel


def softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax, numerically stable."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=1, keepdims=True)


def predictions(labels: tuple[str, ...], probs: np.ndarray) -> list[dict[str, Any]]:
    """One `{label, score, scores}` dict per row of `probs`."""
    best = probs.argmax(axis=1)
    rows = probs.tolist()
    return [
        {"label": labels[b], "score": row[b], "scores": dict(zip(labels, row))}
        for b, row in zip(best.tolist(), rows)
    ]


async def classify(
    inference: Inference, model: ServedModel, texts: list[str], *, truncate: bool, backend: Backend | None,
    deadline: float,
) -> tuple[list[dict[str, Any]], int]:
    """Predictions for `texts` in order, and the billed token count."""
    result = await inference.run(model, texts, truncate=truncate, backend=backend, deadline=deadline)
    return predictions(model.labels, softmax(result.outputs)), result.tokens
