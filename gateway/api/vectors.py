"""HTTP routes of sparse and per-token vectors, in text-embeddings-inference's shapes: `/embed_sparse`,
`/embed_all`, and `/embed_multi_vector` (ColBERT vectors). `embed_sparse_response` is what a
model-in-path route (TEI's `/tei/{model}/embed_sparse`) calls with the path's model name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, Depends, Request
from starlette.responses import Response

from gateway.api.responses import OrjsonResponse
from gateway.api.routes import _ERRORS, _deadline, _runtime, _texts, require_json
from gateway.api.schemas import EmbedAllRequest, EmbedSparseRequest, SparseValue
from gateway.errors import ErrorType, GatewayError
from gateway.metrics import TOKENS
from gateway.service.embed import prompt_text, with_prompt
from gateway.service.inference import Inputs
from gateway.service.multi_vector import check_embed_all, check_multi_vector, embed_all, embed_multi_vector
from gateway.service.registry import ServedModel
from gateway.service.runtime import Runtime
from gateway.service.sparse import embed_sparse, sparse_kind

vectors = APIRouter(dependencies=[Depends(require_json)], responses={**_ERRORS, 424: _ERRORS[404]})


async def _model(runtime: Runtime, name: str | None, has: Callable[[ServedModel], bool], what: str) -> ServedModel:
    """The model a request names (any task; its outputs are checked by the service), or the only served model
    that `has` the output."""
    if name is not None:
        return await runtime.any_model(name)
    if runtime.registry.refresh_due():
        await runtime.refresh()
    candidates = [m for m in runtime.registry.models.values() if has(m)]
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise GatewayError(ErrorType.MODEL_NOT_FOUND, f"no model with {what} is served")
    raise GatewayError(ErrorType.MODEL_REQUIRED, f"several models with {what} are served "
                       f"({sorted(m.name for m in candidates)}): name one in `model`")


def _has(check: Callable[[ServedModel], None]) -> Callable[[ServedModel], bool]:
    def has(model: ServedModel) -> bool:
        try:
            check(model)
        except GatewayError:
            return False
        return True
    return has


async def embed_sparse_response(runtime: Runtime, request: Request, body: EmbedSparseRequest,
                                model_name: str | None) -> Response:
    """`[[{"index", "value"}, ...] per input]`: non-zero values, ascending index; 424 for a model without a
    sparse output. Usage is counted like the other routes' (gateway_tokens_total)."""
    texts = _texts(request, runtime, body.inputs)
    model = await _model(runtime, model_name, lambda m: sparse_kind(m) is not None, "a sparse output")
    request.state.model = model.name
    inputs = Inputs(with_prompt(texts, prompt_text(model, body.prompt_name)), None, body.truncation_direction)
    sparse, tokens = await _deadline(runtime, lambda deadline: embed_sparse(
        runtime.inference, model, inputs, truncate=body.truncate, backend=body.backend, deadline=deadline))
    TOKENS.labels(request.url.path, model.name).inc(tokens)
    return OrjsonResponse([[{"index": i, "value": v} for i, v in zip(indices.tolist(), values.tolist())]
                           for indices, values in sparse])


@vectors.post("/embed_sparse", response_class=OrjsonResponse, responses={200: {"model": list[list[SparseValue]]}})
async def embed_sparse_route(body: EmbedSparseRequest, request: Request) -> Response:
    """Sparse vectors: SPLADE models (vocabulary weights) and bge-m3-style models (lexical weights per token id),
    one list of non-zero {index, value} per input, ascending index (text-embeddings-inference's shape)."""
    return await embed_sparse_response(_runtime(request), request, body, body.model)


async def _per_token(request: Request, body: EmbedAllRequest, check: Callable[[ServedModel], None],
                     run: Any, what: str) -> Response:
    runtime = _runtime(request)
    texts = _texts(request, runtime, body.inputs)
    model = await _model(runtime, body.model, _has(check), what)
    request.state.model = model.name
    check(model)
    inputs = Inputs(with_prompt(texts, prompt_text(model, body.prompt_name)), None, body.truncation_direction)
    rows, tokens = await _deadline(runtime, lambda deadline: run(
        runtime.inference, model, inputs, truncate=body.truncate, backend=body.backend, deadline=deadline))
    TOKENS.labels(request.url.path, model.name).inc(tokens)
    return OrjsonResponse(rows)


@vectors.post("/embed_all", response_class=OrjsonResponse, responses={200: {"model": list[list[list[float]]]}})
async def embed_all_route(body: EmbedAllRequest, request: Request) -> Response:
    """The encoder's last hidden state for every token of each input's truncated encoding (special tokens
    included, not normalized): `[[[float] per token] per input]`, text-embeddings-inference's shape."""
    return await _per_token(request, body, check_embed_all, embed_all, "per-token hidden states")


@vectors.post("/embed_multi_vector", response_class=OrjsonResponse,
              responses={200: {"model": list[list[list[float]]]}})
async def embed_multi_vector_route(body: EmbedAllRequest, request: Request) -> Response:
    """ColBERT vectors (models with bge-m3's colbert_linear.pt): normalize(colbert_linear(hidden)) for every
    token but the first (CLS), `[[[float] per token] per input]`, as FlagEmbedding's colbert_vecs."""
    return await _per_token(request, body, check_multi_vector, embed_multi_vector, "ColBERT vectors")
