"""HTTP routes of sparse and per-token vectors, in text-embeddings-inference's shapes: `/embed_sparse`,
`/embed_all`, and `/embed_multi_vector` (ColBERT vectors)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from contract import COLBERT_VECTORS, TOKEN_EMBEDDINGS
from gateway.api.responses import OrjsonResponse, json_answer
from gateway.api.routes import _ERRORS, count_tokens, services, texts_of
from gateway.api.schemas import EmbedAllRequest, EmbedSparseRequest, SparseValue
from gateway.service.sparse import SparseVector

vectors = APIRouter(responses={**_ERRORS, 424: _ERRORS[404]})


@vectors.post("/embed_sparse", response_class=OrjsonResponse, responses={200: {"model": list[list[SparseValue]]}})
async def embed_sparse_route(body: EmbedSparseRequest, request: Request) -> Response:
    """Sparse vectors: SPLADE models (vocabulary weights) and bge-m3-style models (lexical weights per token id),
    one list of non-zero {index, value} per input, ascending index (text-embeddings-inference's shape); 424 for a
    model without a sparse output."""
    result = await services(request).sparse.embed_sparse(
        request.state, body.model, texts_of(body.inputs), prompt_name=body.prompt_name, truncate=body.truncate,
        direction=body.truncation_direction, backend=body.backend)
    count_tokens(request, result.model, result.tokens)
    return OrjsonResponse(sparse_json(result.vectors))


def sparse_json(vectors: list[SparseVector]) -> list[list[dict[str, int | float]]]:
    """TEI's sparse shape: per input, its non-zero values as [{index, value}, ...] (also /tei/{model}/embed_sparse)."""
    return [[{"index": i, "value": v} for i, v in zip(indices.tolist(), values.tolist())]
            for indices, values in vectors]


async def _per_token(request: Request, body: EmbedAllRequest, output: str) -> Response:
    result = await services(request).multi_vector.embed_tokens(
        request.state, output, body.model, texts_of(body.inputs), prompt_name=body.prompt_name,
        truncate=body.truncate, direction=body.truncation_direction, backend=body.backend)
    count_tokens(request, result.model, result.tokens)
    return await json_answer(result.vectors, floats=sum(v.size for v in result.vectors))


@vectors.post("/embed_all", response_class=OrjsonResponse, responses={200: {"model": list[list[list[float]]]}})
async def embed_all_route(body: EmbedAllRequest, request: Request) -> Response:
    """The encoder's last hidden state for every token of each input's truncated encoding (special tokens
    included, not normalized): `[[[float] per token] per input]`, text-embeddings-inference's shape."""
    return await _per_token(request, body, TOKEN_EMBEDDINGS)


@vectors.post("/embed_multi_vector", response_class=OrjsonResponse,
              responses={200: {"model": list[list[list[float]]]}})
async def embed_multi_vector_route(body: EmbedAllRequest, request: Request) -> Response:
    """ColBERT vectors (models with bge-m3's colbert_linear.pt): normalize(colbert_linear(hidden)) for every
    token but the first (CLS), `[[[float] per token] per input]`, as FlagEmbedding's colbert_vecs."""
    return await _per_token(request, body, COLBERT_VECTORS)
