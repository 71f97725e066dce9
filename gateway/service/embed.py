"""Embeddings: prompts prepended as the model was trained (service/prompts.py), pooled vectors from the model, optional
matryoshka truncation, L2-normalized by default when the model was trained so (its Normalize module). Long texts
may be chunked and pooled instead of truncated (service/long_inputs.py), and a document's chunks embedded by late
chunking (service/late_chunking.py). The answer gives the embedding types a request asks for
(service/quantization.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from contract import TruncationDirection
from gateway.errors import ErrorType, invalid
from gateway.service.admission import Urgency
from gateway.service.cache import ResultCache
from gateway.service.inference import Inputs
from gateway.service.inference.pipeline import token_input_unsupported
from gateway.service.late_chunking import Span, late_chunk
from gateway.service.long_inputs import can_chunk, embed_chunked
from gateway.service.prompts import DEFAULT_PROMPT, Prompt, with_prompt
from gateway.service.quantization import EmbeddingType, calibrated_ranges, quantize
from gateway.service.registry import Backend, ServedModel
from gateway.service.serving import Call, ModelRef, Service
from gateway.service.tokens import check_token_ids


def l2_normalize(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (zero rows stay zero)."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.maximum(norms, np.float32(1e-12))


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


@dataclass(frozen=True, slots=True)
class EmbedQuery:
    """What to embed and how: the arguments every API's embed request turns itself into (`query()`)."""

    texts: list[str]
    token_ids: list[list[int]] | None = None  # the model's own ids without special tokens, instead of texts
    prompt: Prompt = DEFAULT_PROMPT
    normalize: bool | None = None  # None: as the model was trained
    dimensions: int | None = None
    truncate: bool | Literal["chunk"] | None = True  # "chunk": chunked and pooled; None: as GATEWAY_LONG_INPUTS says
    direction: TruncationDirection = "right"
    backend: Backend | None = None
    cut: bool = False  # texts over the character limit are cut there instead of refused (413)
    chunks: Sequence[Sequence[Span]] | None = None  # late chunking: per text, its chunks' [start, end) offsets
    types: tuple[EmbeddingType, ...] = ("float",)  # the embedding types the answer gives (Embeddings.as_type)


@dataclass(frozen=True, slots=True)
class Embeddings:
    model: str
    vectors: np.ndarray  # [n, dimensions] float32, in input order
    tokens: int  # billed
    chunks: list[int] | None = None  # late chunking: the vectors of each input (its chunks), in order
    ranges: np.ndarray | None = None  # int8/uint8's calibrated ranges at this width, when the query asked for them

    def as_type(self, embedding_type: EmbeddingType) -> np.ndarray:
        """The vectors as one of the query's embedding types."""
        return quantize(self.vectors, embedding_type, self.ranges)


class EmbedService(Service):
    """Embeddings of texts or token ids (/embed, /v1/embeddings, /v2/embed, TEI's /embed)."""

    async def embed(self, call: Call, model: ModelRef, query: EmbedQuery) -> Embeddings:
        """One vector per text (or per row of token ids), in order."""
        texts = query.texts
        if query.token_ids is not None:
            self.check_count(call, len(query.token_ids))
        else:
            if query.cut:
                texts = self.cut(texts, query.direction)
            self.check_texts(call, texts)
        served = await self.model(call, model, "embed")
        urgency = self.urgency(call)
        if query.token_ids is not None:
            inputs = self._token_inputs(served, query.token_ids, query.prompt, urgency)
        else:
            inputs = Inputs(with_prompt(texts, query.prompt.prefix(served)), None, query.direction, urgency=urgency)
        width = check_dimensions(served, query.dimensions)
        ranges = calibrated_ranges(served, query.types, width or served.embedding_dim, query.normalize)
        if query.chunks is not None:
            late = await self._late_chunk(call, served, texts, query, width)
            return Embeddings(late.model, late.vectors, late.tokens, late.chunks, ranges)
        if self._chunks_long_inputs(served, query):
            settings = self.runtime.settings
            vectors, tokens = await self.within_deadline(call, lambda deadline: embed_chunked(
                self.inference, served, inputs, backend=query.backend, overlap=settings.chunk_overlap_tokens,
                max_tokens=settings.max_chunked_tokens, deadline=deadline))
            return Embeddings(served.name, finish(served, vectors, query.normalize, width), tokens, ranges=ranges)
        truncate = query.truncate is not False
        vectors, tokens = await self.within_deadline(call, lambda deadline: embed(
            self.runtime.cache, served, inputs, normalize=query.normalize, dimensions=width, truncate=truncate,
            backend=query.backend, deadline=deadline))
        return Embeddings(served.name, vectors, tokens, ranges=ranges)

    def _chunks_long_inputs(self, model: ServedModel, query: EmbedQuery) -> bool:
        """Whether texts over the window are chunked: as the request says, else by GATEWAY_LONG_INPUTS where the
        model's pipeline can (elsewhere they are truncated)."""
        if query.truncate is not None:
            return query.truncate == "chunk"
        return self.runtime.settings.long_inputs == "chunk" and can_chunk(self.inference, model, query.backend)

    async def _late_chunk(self, call: Call, model: ServedModel, texts: list[str], query: EmbedQuery,
                          width: int | None) -> Embeddings:
        """One vector per chunk of each text, from one run of the model over the whole text."""
        spans = query.chunks
        if query.token_ids is not None or spans is None:
            raise invalid("`chunks` are character offsets into texts: send text, not token ids")
        vectors, counts, tokens = await self.within_deadline(call, lambda deadline: late_chunk(
            self.inference, model, texts, query.prompt.prefix(model), spans, urgency=self.urgency(call),
            backend=query.backend, deadline=deadline))
        return Embeddings(model.name, finish(model, vectors, query.normalize, width), tokens, counts)

    def _token_inputs(self, model: ServedModel, rows: list[list[int]], prompt: Prompt, urgency: Urgency) -> Inputs:
        """Token ids as given: 400 with an input type (prompts are text), for a model whose tokenizer the gateway
        cannot read, or for an id outside the model's vocabulary."""
        if prompt.input_type is not None:
            raise invalid("input_type applies to text input; token ids are taken as given",
                          type=ErrorType.PROMPT_WITH_TOKEN_INPUT)
        tokenizer = self.inference.tokenizer_for(model)
        if tokenizer is None:
            raise token_input_unsupported(model)
        check_token_ids(tokenizer.encoder, rows)
        return Inputs([], token_ids=rows, urgency=urgency)


async def embed(
    cache: ResultCache,
    model: ServedModel,
    inputs: Inputs,
    *,
    normalize: bool | None,
    dimensions: int | None,
    truncate: bool,
    backend: Backend | None,
    deadline: float,
) -> tuple[np.ndarray, int]:
    """Embeddings [n, dim] float32 in input order, and the billed token count. The model's rows come through the
    result cache (the same with it off); `dimensions` (checked by check_dimensions) keeps the first components;
    normalization comes after it."""
    rows, tokens = await cache.rows(model, inputs, truncate=truncate, backend=backend, deadline=deadline)
    return finish(model, rows, normalize, dimensions), tokens


def finish(model: ServedModel, vectors: np.ndarray, normalize: bool | None, dimensions: int | None) -> np.ndarray:
    """Pooled vectors as the request asks for them: the first `dimensions` components, then normalized."""
    if dimensions is not None:
        vectors = vectors[:, :dimensions]
    if model.normalize if normalize is None else normalize:
        vectors = l2_normalize(vectors)
    return np.ascontiguousarray(vectors, dtype=np.float32)
