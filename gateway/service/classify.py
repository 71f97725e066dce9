"""Classification of texts or text pairs: softmax over the model's logits, labels from the repository."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from contract import TruncationDirection
from gateway.errors import ErrorType, invalid
from gateway.service.inference import Inference, Inputs
from gateway.service.registry import Backend, ServedModel
from gateway.service.serving import Call, ModelRef, Service


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
    return predictions(model.labels, result.rows if raw_scores else softmax(result.rows)), result.tokens


@dataclass(frozen=True, slots=True)
class ClassifyQuery:
    """What to classify and how: the arguments every API's classify request turns itself into (`query()`)."""

    texts: list[str]
    pairs: list[str] | None = None  # the second text of each pair
    truncate: bool = True
    direction: TruncationDirection = "right"
    backend: Backend | None = None
    raw_scores: bool = False  # the logits, not the softmax
    cut: bool = False  # texts over the character limit are cut there instead of refused (413)


@dataclass(frozen=True, slots=True)
class Classification:
    model: str
    predictions: list[dict[str, Any]]  # {label, score, scores} per input, in order
    tokens: int  # billed


class ClassifyService(Service):
    """Classification of texts or text pairs (/classify, TEI's /predict)."""

    async def classify(self, call: Call, model: ModelRef, query: ClassifyQuery) -> Classification:
        """One prediction per text (or pair texts[i], pairs[i]), in order."""
        texts, pairs, direction = query.texts, query.pairs, query.direction
        if query.cut:
            texts = self.cut(texts, direction)
            pairs = self.cut(pairs, direction) if pairs is not None else None
        self.check_texts(call, texts, pairs or [])
        served = await self.model(call, model, "classify")
        check_pairs(served, pairs is not None)
        inputs = Inputs(texts, pairs, direction, urgency=self.urgency(call))
        preds, tokens = await self.within_deadline(call, lambda deadline: classify(
            self.inference, served, inputs, truncate=query.truncate, backend=query.backend, deadline=deadline,
            raw_scores=query.raw_scores))
        return Classification(served.name, preds, tokens)
