"""Reranking with a cross-encoder: one (query, text) pair per text, scored by the model's relevance logit."""

from __future__ import annotations

import numpy as np

from contract import TruncationDirection
from gateway.service.classify import softmax
from gateway.service.inference import Inference, Inputs
from gateway.service.registry import Backend, ServedModel


def relevance(model: ServedModel, logits: np.ndarray, raw: bool) -> np.ndarray:
    """Scores [n] from logits [n, labels]: one logit -> sigmoid, several -> softmax of the score label
    (what sentence-transformers' CrossEncoder gives); `raw`: the logit itself."""
    logit = logits[:, model.score_label]
    if raw:
        return logit
    if logits.shape[1] == 1:
        return 1.0 / (1.0 + np.exp(-logit.astype(np.float64)))
    return softmax(logits.astype(np.float64))[:, model.score_label]


async def rerank(
    inference: Inference, model: ServedModel, query: str, texts: list[str], *, raw_scores: bool, truncate: bool,
    direction: TruncationDirection, backend: Backend | None, deadline: float,
) -> tuple[np.ndarray, int]:
    """The relevance score of every text to `query`, in input order, and the billed token count."""
    inputs = Inputs([query] * len(texts), texts, direction)
    result = await inference.run(model, inputs, truncate=truncate, backend=backend, deadline=deadline)
    return relevance(model, result.outputs, raw_scores), result.tokens


def ranking(scores: np.ndarray, top_n: int | None = None) -> list[int]:
    """Indices by descending score (ties keep input order), the first `top_n`."""
    order = np.argsort(-scores, kind="stable").tolist()
    return order if top_n is None else order[:top_n]
