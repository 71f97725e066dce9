"""Sparse (lexical) embeddings: SPLADE vocabulary rows, and bge-m3's lexical weights.

- sparse-embed models (SPLADE, a sentence-transformers SparseEncoder): the model step returns one
  vocabulary-wide row per text, `log(1 + relu(logits))` pooled over the real tokens as its SpladePooling
  says; the gateway keeps the non-zero entries (a full row is mostly zeros, and too large to move per text).
- embed models built with FlagEmbedding's `sparse_linear.pt` (bge-m3): the step returns one weight per
  token, `relu(sparse_linear(hidden))`; the gateway keeps, per token id, the largest weight of the text's
  real tokens, drops the ids FlagEmbedding drops (cls, eos, pad, unk: ensemble parameter
  `sparse_skip_ids`) and zero weights, as `BGEM3FlagModel.encode(return_sparse=True)` does.
Both come back as (indices ascending, values), non-zero values only: TEI's `/embed_sparse`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from contract import TOKEN_WEIGHTS, TruncationDirection
from gateway.errors import ErrorType, GatewayError
from gateway.service.inference import Inference, Inputs
from gateway.service.prompts import prompt_text, with_prompt
from gateway.service.registry import Backend, ServedModel
from gateway.service.serving import Call, Service

SparseVector = tuple[np.ndarray, np.ndarray]  # (indices int64 ascending, values float32), non-zero values only
SparseKind = Literal["splade", "lexical"]


def sparse_kind(model: ServedModel) -> SparseKind | None:
    """How `model` makes sparse vectors, or None when it has no sparse output."""
    if model.task == "sparse-embed":
        return "splade"
    if model.task == "embed" and model.endpoint(None).token_width(TOKEN_WEIGHTS) is not None:
        return "lexical"
    return None


def check_sparse(model: ServedModel) -> SparseKind:
    """The model's sparse kind; 424 (TEI's answer) when it has no sparse output."""
    kind = sparse_kind(model)
    if kind is None:
        raise GatewayError(ErrorType.SPARSE_NOT_SUPPORTED, f"model {model.name!r} has no sparse output: /embed_sparse "
                           "serves SPLADE models (--task sparse-embed) and embedders with bge-m3's sparse_linear.pt")
    return kind


def from_row(row: np.ndarray) -> SparseVector:
    """A vocabulary-wide row's non-zero entries."""
    indices = np.flatnonzero(row != 0)  # on a boolean mask: cheaper than np.flatnonzero on the floats
    return indices, row[indices].astype(np.float32, copy=False)


def from_rows(rows: np.ndarray) -> list[SparseVector]:
    """The non-zero entries of every row of [n, vocabulary]."""
    return [from_row(row) for row in rows]


def from_token_weights(ids: np.ndarray, weights: np.ndarray, skip: tuple[int, ...]) -> SparseVector:
    """The largest weight per token id over a text's tokens, without `skip` ids and zero weights."""
    keep = (weights > 0) & ~np.isin(ids, skip)
    ids, weights = ids[keep].astype(np.int64), weights[keep]
    if not ids.size:
        return ids, weights.astype(np.float32)
    order = np.lexsort((-weights, ids))  # by id, largest weight first within an id
    ids, weights = ids[order], weights[order]
    first = np.concatenate(([True], ids[1:] != ids[:-1]))
    return ids[first], weights[first].astype(np.float32, copy=False)


async def embed_sparse(
    inference: Inference, model: ServedModel, inputs: Inputs, *, truncate: bool, backend: Backend | None,
    deadline: float,
) -> tuple[list[SparseVector], int]:
    """One sparse vector per input, in input order, and the billed token count."""
    if check_sparse(model) == "splade":
        result = await inference.run(model, inputs, truncate=truncate, backend=backend, deadline=deadline)
        return from_rows(result.rows), result.tokens
    result = await inference.run(model, inputs, truncate=truncate, backend=backend, deadline=deadline,
                                 outputs=(TOKEN_WEIGHTS,))
    assert result.ids is not None  # per-token outputs run on the scheduler pipeline, which knows the ids
    vectors = [from_token_weights(ids, weights, model.sparse_skip_ids) for ids, weights in zip(result.ids, result.per_text)]
    return vectors, result.tokens


@dataclass(frozen=True, slots=True)
class SparseEmbeddings:
    model: str
    vectors: list[SparseVector]  # per input, in order
    tokens: int  # billed


class SparseService(Service):
    """Sparse vectors (/embed_sparse)."""

    async def embed_sparse(
        self, call: Call, model: str | None, texts: list[str], *, prompt_name: str | None = None,
        truncate: bool = True, direction: TruncationDirection = "right", backend: Backend | None = None,
    ) -> SparseEmbeddings:
        """One sparse vector per text; `model` None: the only served model with a sparse output."""
        self.check_texts(call, texts)
        served = await self.model_with(call, model, lambda m: sparse_kind(m) is not None, "a sparse output")
        inputs = Inputs(with_prompt(texts, prompt_text(served, prompt_name)), None, direction,
                        urgency=self.urgency(call))
        vectors, tokens = await self.within_deadline(call, lambda deadline: embed_sparse(
            self.inference, served, inputs, truncate=truncate, backend=backend, deadline=deadline))
        return SparseEmbeddings(served.name, vectors, tokens)
