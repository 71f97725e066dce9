"""Classification of texts or text pairs: softmax over the model's logits, labels from the repository."""

from __future__ import annotations

from typing import Any

import numpy as np

from gateway.errors import ErrorType, invalid
from gateway.service.inference import Inference, Inputs
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


def check_pairs(model: ServedModel, pairs: bool) -> None:
    """400 when a request sends pairs to a single-text model, or single texts to a pair model."""
    if pairs and not model.pairs:
        raise invalid(f"model {model.name!r} takes single texts, not pairs", type=ErrorType.PAIRS_NOT_SUPPORTED)
    if model.pairs and not pairs:
        raise invalid(f"model {model.name!r} takes text pairs: send inputs as [[text, text_pair], ...]",
                      type=ErrorType.PAIRS_REQUIRED)


async def classify(
    inference: Inference, model: ServedModel, inputs: Inputs, *, truncate: bool, backend: Backend | None,
    deadline: float, raw_scores: bool = False,
) -> tuple[list[dict[str, Any]], int]:
    """Predictions for `inputs` in order, and the billed token count; `raw_scores`: the logits, not the softmax."""
    result = await inference.run(model, inputs, truncate=truncate, backend=backend, deadline=deadline)
    return predictions(model.labels, result.outputs if raw_scores else softmax(result.outputs)), result.tokens
