"""Cohere's v2 API, what `cohere.ClientV2(base_url=...)` calls: `POST /v2/embed` and `POST /v2/rerank`.

Thin adapters over the services of /embed and /rerank: Cohere's request mapped in (input_type -> the
model's prompt, truncate -> truncation side, output_dimension -> matryoshka dimensions), the answer mapped
to Cohere's response model (api/cohere_schemas.py). The v1 rerank shape stays in api/routes.py.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from starlette.responses import Response

from contract import TruncationDirection
from gateway.api.cohere_schemas import (
    CohereBilledUnits,
    CohereEmbeddings,
    CohereEmbedV2Request,
    CohereEmbedV2Response,
    CohereMeta,
    CohereRerankV2Request,
    CohereRerankV2Response,
    CohereRerankV2Result,
)
from gateway.api.responses import OrjsonResponse
from gateway.api.routes import _ERRORS, _check_inputs, _deadline, _runtime, api
from gateway.errors import ErrorType, invalid
from gateway.metrics import TOKENS
from gateway.service.embed import check_dimensions, embed, prompt_text, with_prompt
from gateway.service.inference import Inputs
from gateway.service.registry import ServedModel
from gateway.service.rerank import ranking, rerank

cohere = APIRouter(dependencies=api.dependencies, responses=_ERRORS, tags=["cohere"])

# Cohere's input_type -> the prompt names a model may call it by, in order of preference.
INPUT_TYPE_PROMPTS: dict[str, tuple[str, ...]] = {
    "search_query": ("search_query", "query"),
    "search_document": ("search_document", "document", "passage", "doc"),
    "classification": ("classification",),
    "clustering": ("clustering",),
}
EXACT_TYPES = ("float", "base64", "binary", "ubinary")


def input_type_prompt(model: ServedModel, input_type: str | None) -> str:
    """The prefix of the model's prompt for `input_type`; a model without one gets its default prompt (if any)."""
    for name in INPUT_TYPE_PROMPTS.get(input_type or "", ()):
        if name in model.prompts:
            return model.prompts[name]
    return prompt_text(model, None)


def _request_id(request: Request) -> str:
    return getattr(request.state, "request_id", "") or ""


def _refuse_unsupported(body: CohereEmbedV2Request, model: ServedModel) -> None:
    """400 `unsupported_option` for what a text encoder here cannot answer exactly."""
    if body.images is not None or body.inputs is not None or body.input_type == "image":
        raise invalid("images and multimodal `inputs` are not supported (text models): send `texts`",
                      type=ErrorType.UNSUPPORTED_OPTION)
    inexact = sorted({t for t in body.embedding_types or () if t not in EXACT_TYPES})
    if inexact:
        raise invalid(f"embedding_types {inexact} are not served: Cohere's int8 scales are calibrated per model "
                      f"and not published, so there is no exact equivalent; use {', '.join(EXACT_TYPES)}",
                      type=ErrorType.UNSUPPORTED_OPTION)
    if body.max_tokens is not None and body.max_tokens < model.max_seq_len:
        raise invalid(f"max_tokens below the model's max_seq_len ({model.max_seq_len}) is not supported: texts are "
                      "truncated at max_seq_len", type=ErrorType.UNSUPPORTED_OPTION)


def _embeddings(vectors: np.ndarray, types: set[str]) -> CohereEmbeddings:
    """The requested embedding types of unit-length float32 vectors."""
    fields: dict[str, Any] = {}
    if "float" in types:
        fields["float_"] = vectors
    if "base64" in types:
        little = vectors.astype("<f4", copy=False)
        fields["base64"] = [base64.b64encode(row.tobytes()).decode() for row in little]
    bits = np.packbits(vectors > 0, axis=1) if types & {"binary", "ubinary"} else None
    if bits is not None and "ubinary" in types:
        fields["ubinary"] = bits.tolist()
    if bits is not None and "binary" in types:
        fields["binary"] = (bits.astype(np.int16) - 128).tolist()
    return CohereEmbeddings(**fields)


@cohere.post("/v2/embed", response_class=OrjsonResponse, responses={200: {"model": CohereEmbedV2Response}})
async def cohere_embed_route(body: CohereEmbedV2Request, request: Request) -> Response:
    """Cohere v2 embed: unit-length vectors in the requested `embedding_types`, one per text, in order."""
    runtime = _runtime(request)
    model = await runtime.model(body.model, "embed")
    request.state.model = model.name
    _refuse_unsupported(body, model)
    texts = body.texts or []
    _check_inputs(request, runtime, texts)
    dimensions = check_dimensions(model, body.output_dimension)
    direction: TruncationDirection = "left" if body.truncate == "START" else "right"
    inputs = Inputs(with_prompt(texts, input_type_prompt(model, body.input_type)), None, direction)
    vectors, tokens = await _deadline(runtime, lambda deadline: embed(
        runtime.inference, model, inputs, normalize=True, dimensions=dimensions, truncate=body.truncate != "NONE",
        backend=None, deadline=deadline))
    TOKENS.labels("/v2/embed", model.name).inc(tokens)
    answer = CohereEmbedV2Response(
        id=_request_id(request), embeddings=_embeddings(vectors, set(body.embedding_types or ["float"])), texts=texts,
        meta=CohereMeta(billed_units=CohereBilledUnits(input_tokens=tokens)))
    return OrjsonResponse(answer.model_dump(by_alias=True, exclude_none=True))


@cohere.post("/v2/rerank", response_class=OrjsonResponse, responses={200: {"model": CohereRerankV2Response}})
async def cohere_rerank_route(body: CohereRerankV2Request, request: Request) -> Response:
    """Cohere v2 rerank: `results` sorted by relevance_score, best first, `top_n` of them."""
    runtime = _runtime(request)
    _check_inputs(request, runtime, body.documents, [body.query])
    model = await runtime.model(body.model, "rerank")
    request.state.model = model.name
    scores, tokens = await _deadline(runtime, lambda deadline: rerank(
        runtime.inference, model, body.query, body.documents, raw_scores=False, truncate=True, direction="right",
        backend=None, deadline=deadline))
    TOKENS.labels("/v2/rerank", model.name).inc(tokens)
    values = scores.tolist()
    answer = CohereRerankV2Response(
        id=_request_id(request), results=[CohereRerankV2Result(index=i, relevance_score=values[i])
                                          for i in ranking(scores, body.top_n)],
        meta=CohereMeta(billed_units=CohereBilledUnits(input_tokens=tokens)))
    return OrjsonResponse(answer.model_dump(by_alias=True, exclude_none=True))
