"""Reranking with a cross-encoder: one (query, text) pair per text, scored by the model's relevance logit."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from contract import TruncationDirection
from gateway.service.admission import INTERACTIVE, Urgency
from gateway.service.classify import softmax
from gateway.service.inference import Inference, Inputs
from gateway.service.registry import Backend, ServedModel
from gateway.service.serving import Call, ModelRef, Service


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
    direction: TruncationDirection, backend: Backend | None, deadline: float, urgency: Urgency = INTERACTIVE,
) -> tuple[np.ndarray, int]:
    """The relevance score of every text to `query`, in input order, and the billed token count."""
    inputs = Inputs([query] * len(texts), texts, direction, urgency=urgency)
    result = await inference.run(model, inputs, truncate=truncate, backend=backend, deadline=deadline)
    return relevance(model, result.rows, raw_scores), result.tokens


def ranking(scores: np.ndarray, top_n: int | None = None) -> list[int]:
    """Indices by descending score (ties keep input order), the first `top_n`."""
    order = np.argsort(-scores, kind="stable").tolist()
    return order if top_n is None else order[:top_n]


@dataclass(frozen=True, slots=True)
class RerankQuery:
    """What to rank and how: the arguments every API's rerank request turns itself into (`query()`)."""

    query: str
    texts: list[str]
    top_n: int | None = None
    raw_scores: bool = False  # the logit, not the score
    truncate: bool = True
    direction: TruncationDirection = "right"
    backend: Backend | None = None
    cut: bool = False  # texts (and the query) over the character limit are cut there instead of refused (413)


@dataclass(frozen=True, slots=True)
class Ranking:
    model: str
    scores: list[float]  # per text, in input order
    order: list[int]  # indices of the texts by descending score, the first `top_n`
    tokens: int  # billed


class RerankService(Service):
    """Scores of texts against a query by a cross-encoder (/rerank, /v1/rerank, /v2/rerank, TEI's /rerank)."""

    async def rerank(self, call: Call, model: ModelRef, request: RerankQuery) -> Ranking:
        """The relevance of every text to the query, and the ranking."""
        texts, query, direction = request.texts, request.query, request.direction
        if request.cut:
            texts, (query,) = self.cut(texts, direction), self.cut([query], direction)
        self.check_texts(call, texts, [query])
        served = await self.model(call, model, "rerank")
        scores, tokens = await self.within_deadline(call, lambda deadline: rerank(
            self.inference, served, query, texts, raw_scores=request.raw_scores, truncate=request.truncate,
            direction=direction, backend=request.backend, deadline=deadline, urgency=self.urgency(call)))
        return Ranking(served.name, scores.tolist(), ranking(scores, request.top_n), tokens)
