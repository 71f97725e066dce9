"""HTTP routes of sparse and per-token vectors, in text-embeddings-inference's shapes: `/embed_sparse`,
`/embed_all`, and `/embed_multi_vector` (ColBERT vectors); and `/encode`, several of them from one forward pass."""

from __future__ import annotations

from fastapi import APIRouter, Request
from starlette.responses import Response

from contract import COLBERT_VECTORS, TOKEN_EMBEDDINGS
from gateway.api.responses import OrjsonResponse, json_answer
from gateway.api.routes import _ERRORS, count_tokens, services, texts_of
from gateway.api.vector_schemas import EmbedAllRequest, EmbedSparseRequest, EncodeRequest, EncodeResponse, SparseValue
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


@vectors.post("/encode", response_class=OrjsonResponse, responses={200: {"model": EncodeResponse}})
async def encode_route(body: EncodeRequest, request: Request) -> Response:
    """Several outputs of one execution of the model (bge-m3's dense, sparse and ColBERT outputs), each in the shape
    its own route answers: `dense` as /embed's `embeddings`, `sparse` as /embed_sparse, `multi_vector` as
    /embed_multi_vector; an output not asked for is null. The tokens are billed once."""
    result = await services(request).encode.encode(request.state, body.model, body.to_query())
    count_tokens(request, result.model, result.tokens)
    sparse = None if result.sparse is None else sparse_json(result.sparse)
    floats = sum(a.size for a in (result.dense, *(result.multi_vector or ()), *(v for _, v in result.sparse or ()))
                 if a is not None)
    return await json_answer({"model": result.model, "dense": result.dense, "sparse": sparse,
                              "multi_vector": result.multi_vector, "usage": {"tokens": result.tokens}}, floats=floats)
