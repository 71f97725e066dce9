"""Cohere's v2 API, what `cohere.ClientV2(base_url=...)` calls: `POST /v2/embed` and `POST /v2/rerank`.

Thin adapters over the services of /embed and /rerank: Cohere's request mapped in (input_type -> the
model's prompt, truncate -> truncation side, output_dimension -> matryoshka dimensions), the answer written
in Cohere's shape (api/cohere_schemas.py documents it, tests/gateway/test_response_models.py checks it).
The v1 rerank shape stays in api/routes.py.
"""

from __future__ import annotations

from typing import Any, cast

from fastapi import APIRouter, Request
from starlette.responses import Response

from gateway.api.cohere_schemas import (
    CohereEmbeddings,
    CohereEmbeddingType,
    CohereEmbedV2Request,
    CohereEmbedV2Response,
    CohereRerankV2Request,
    CohereRerankV2Response,
)
from gateway.api.responses import OrjsonResponse, base64_rows
from gateway.api.route_table import runs
from gateway.api.routes import _ERRORS, count_tokens, request_id_of, services
from gateway.errors import ErrorType, invalid
from gateway.service.embed import Embeddings
from gateway.service.quantization import EmbeddingType
from gateway.service.registry import ServedModel

cohere = APIRouter(responses=_ERRORS, tags=["cohere"])


def _refuse_unsupported(body: CohereEmbedV2Request, model: ServedModel) -> None:
    """400 `unsupported_option` for what a text encoder here cannot answer exactly."""
    if body.images is not None or body.inputs is not None or body.input_type == "image":
        raise invalid("images and multimodal `inputs` are not supported (text models): send `texts`",
                      type=ErrorType.UNSUPPORTED_OPTION)
    if body.max_tokens is not None and body.max_tokens < model.max_seq_len:
        raise invalid(f"max_tokens below the model's max_seq_len ({model.max_seq_len}) is not supported: texts are "
                      "truncated at max_seq_len", type=ErrorType.UNSUPPORTED_OPTION)


def _embeddings(result: Embeddings, types: list[CohereEmbeddingType]) -> dict[str, Any]:
    """The requested embedding types of the unit-length vectors (CohereEmbeddings' fields, in its order)."""
    fields: dict[str, Any] = {}
    for name in CohereEmbeddings.model_fields:
        wanted = "float" if name == "float_" else name
        if wanted in types:
            fields[wanted] = base64_rows(result.vectors) if wanted == "base64" else result.as_type(
                cast(EmbeddingType, wanted))
    return fields


def _meta(tokens: int) -> dict[str, Any]:
    """CohereMeta."""
    return {"api_version": {"version": "2"}, "billed_units": {"input_tokens": tokens}}


@cohere.post("/v2/embed", response_class=OrjsonResponse, responses={200: {"model": CohereEmbedV2Response}})
@runs("embed")
async def cohere_embed_route(body: CohereEmbedV2Request, request: Request) -> Response:
    """Cohere v2 embed: unit-length vectors in the requested `embedding_types`, one per text, in order."""
    embed = services(request).embed
    model = await embed.model(request.state, body.model, "embed")
    _refuse_unsupported(body, model)
    result = await embed.embed(request.state, model, body.to_query())
    count_tokens(request, result.model, result.tokens)
    embeddings = _embeddings(result, body.embedding_types or ["float"])
    return OrjsonResponse({"id": request_id_of(request), "embeddings": embeddings, "texts": body.texts or [],
                           "meta": _meta(result.tokens), "response_type": "embeddings_by_type"})


@cohere.post("/v2/rerank", response_class=OrjsonResponse, responses={200: {"model": CohereRerankV2Response}})
@runs("rerank")
async def cohere_rerank_route(body: CohereRerankV2Request, request: Request) -> Response:
    """Cohere v2 rerank: `results` sorted by relevance_score, best first, `top_n` of them."""
    result = await services(request).rerank.rerank(request.state, body.model, body.to_query())
    count_tokens(request, result.model, result.tokens)
    scores = result.scores
    return OrjsonResponse({"id": request_id_of(request),
                           "results": [{"index": i, "relevance_score": scores[i]} for i in result.order],
                           "meta": _meta(result.tokens)})
