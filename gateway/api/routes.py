"""HTTP routes: /classify, /embed, /rerank, /tokenize, /decode, OpenAI-style /v1/embeddings, /v1/rerank and
/v1/models, and /healthz, /readyz, /metrics."""

from __future__ import annotations

import itertools
from typing import Any, cast

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import PlainTextResponse
from starlette.responses import Response

from gateway.api.responses import OrjsonResponse, base64_rows, json_answer
from gateway.api.route_table import runs
from gateway.api.schemas import (
    ClassifyRequest,
    ClassifyResponse,
    CohereRerankRequest,
    CohereRerankResponse,
    DecodeRequest,
    EmbedRequest,
    EmbedResponse,
    ErrorResponse,
    Health,
    ModelCard,
    ModelList,
    OpenAIEmbeddingRequest,
    OpenAIEmbeddingResponse,
    Rank,
    Readiness,
    RerankRequest,
    Token,
    TokenizeRequest,
    texts_of,
)
from gateway.errors import ErrorType, invalid
from gateway.metrics import TOKENS, render_latest
from gateway.service.catalog import CatalogService
from gateway.service.embed import EmbedService
from gateway.service.quantization import CALIBRATED, EMBEDDING_TYPES
from gateway.service.registry import ServedModel
from gateway.service.services import Services

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 404, 413, 415, 422, 429, 501, 502, 503, 504)
}


api = APIRouter(responses=_ERRORS)  # served by the edge (api/edge.py): keys, limits, the JSON check
ops = APIRouter()


def services(request: Request) -> Services:
    """The worker's task services (gateway/service/services.py)."""
    return request.app.state.services  # type: ignore[no-any-return]


def request_id_of(request: Request) -> str:
    return getattr(request.state, "request_id", "") or ""


def count_tokens(request: Request, model: str, tokens: int) -> None:
    """Bill `tokens` of `model` to the request's route (its template, /tei/{model}/embed)."""
    TOKENS.labels(request.scope["route"].path, model).inc(tokens)


@api.post("/classify", response_class=OrjsonResponse, responses={200: {"model": ClassifyResponse}})
@runs("classify")
async def classify_route(body: ClassifyRequest, request: Request) -> Response:
    """Classify one text, a list, or a list of [text, text_pair] pairs; one prediction per input, in order."""
    result = await services(request).classify.classify(request.state, body.model, body.to_query())
    count_tokens(request, result.model, result.tokens)
    return OrjsonResponse({"model": result.model, "predictions": result.predictions,
                           "usage": {"tokens": result.tokens}})


@api.post("/embed", response_class=OrjsonResponse, responses={200: {"model": EmbedResponse}})
@runs("embed")
async def embed_route(body: EmbedRequest, request: Request) -> Response:
    """Embed one text or a list; one vector per input, in order (with `chunks`: per input, one per chunk), as floats
    or as the `embedding_type`'s integers."""
    result = await services(request).embed.embed(request.state, body.model, body.to_query())
    count_tokens(request, result.model, result.tokens)
    vectors = result.as_type(body.embedding_type)
    embeddings = vectors if result.chunks is None else per_input(vectors, result.chunks)
    return OrjsonResponse({"model": result.model, "embeddings": embeddings, "dimensions": int(result.vectors.shape[1]),
                           "usage": {"tokens": result.tokens}})


def per_input(rows: Any, counts: list[int]) -> list[Any]:
    """`rows` (one per chunk, input by input) as one list of rows per input."""
    ends = list(itertools.accumulate(counts))
    return [rows[end - count:end] for end, count in zip(ends, counts)]


@api.post("/v1/embeddings", response_class=OrjsonResponse, responses={200: {"model": OpenAIEmbeddingResponse}})
@runs("embed")
async def openai_embeddings_route(body: OpenAIEmbeddingRequest, request: Request) -> Response:
    """OpenAI-compatible embeddings (normalized, as OpenAI's are)."""
    embed = services(request).embed
    model = await embed.model(request.state, body.model, "embed")  # first: token ids are read by its tokenizer
    return await openai_embeddings(request, embed, model, body)


async def openai_embeddings(request: Request, embed: EmbedService, model: ServedModel, body: OpenAIEmbeddingRequest,
                            *, cut: bool = False) -> Response:
    """The OpenAI embeddings answer of `body` by `model` (this /v1/embeddings, TEI's under /tei/{model});
    `cut`: texts over the character limit are cut there instead of refused."""
    if body.encoding_format == "base64" and body.embedding_type != "float":
        raise invalid(f"embedding_type {body.embedding_type} is answered as JSON integers: send encoding_format "
                      "\"float\" with it (base64 is float32, as the openai client decodes it)",
                      type=ErrorType.UNSUPPORTED_OPTION)
    result = await embed.embed(request.state, model, body.to_query(cut))
    count_tokens(request, result.model, result.tokens)
    if body.encoding_format == "base64":
        rows: Any = base64_rows(result.vectors)
    else:
        rows = result.as_type(body.embedding_type)
    data = [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)]
    if result.chunks is not None:  # one embedding per chunk: which input and chunk it is
        for item, (input_index, chunk_index) in zip(data, chunk_positions(result.chunks)):
            item["input_index"], item["chunk_index"] = input_index, chunk_index
    tokens = result.tokens
    return OrjsonResponse({"object": "list", "data": data, "model": result.model,
                           "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


def chunk_positions(counts: list[int]) -> list[tuple[int, int]]:
    """(input, chunk) of each vector of a late-chunked answer."""
    return [(i, j) for i, count in enumerate(counts) for j in range(count)]


@api.post("/rerank", response_class=OrjsonResponse, responses={200: {"model": list[Rank]}})
@runs("rerank")
async def rerank_route(body: RerankRequest, request: Request) -> Response:
    """Score every text against the query with a cross-encoder; results sorted by score, best first
    (text-embeddings-inference's shape)."""
    result = await services(request).rerank.rerank(request.state, body.model, body.to_query())
    count_tokens(request, result.model, result.tokens)
    scores, texts = result.scores, body.texts
    if body.return_text:
        return OrjsonResponse([{"index": i, "score": scores[i], "text": texts[i]} for i in result.order])
    return OrjsonResponse([{"index": i, "score": scores[i]} for i in result.order])


@api.post("/v1/rerank", response_class=OrjsonResponse, responses={200: {"model": CohereRerankResponse}})
@runs("rerank")
async def cohere_rerank_route(body: CohereRerankRequest, request: Request) -> Response:
    """Cohere/Jina-style rerank: `results` sorted by relevance_score, best first, `top_n` of them."""
    result = await services(request).rerank.rerank(request.state, body.model, body.to_query())
    count_tokens(request, result.model, result.tokens)
    scores, texts = result.scores, body.texts
    results: list[dict[str, Any]] = []
    for i in result.order:
        item: dict[str, Any] = {"index": i, "relevance_score": scores[i]}
        if body.return_documents:
            item["document"] = {"text": texts[i]}
        results.append(item)
    return OrjsonResponse({"id": request_id_of(request), "model": result.model, "results": results,
                           "usage": {"total_tokens": result.tokens}})


@api.post("/tokenize", response_class=OrjsonResponse, responses={200: {"model": list[list[Token]]}, 501: {}})
async def tokenize_route(body: TokenizeRequest, request: Request) -> Response:
    """Tokens of one text or a list (untruncated): id, text, special flag and character offsets."""
    result = await services(request).tokens.tokenize(
        request.state, body.model, texts_of(body.inputs), add_special_tokens=body.add_special_tokens,
        prompt_name=body.prompt_name)
    return await json_answer(result.tokens, tokens=sum(map(len, result.tokens)))


@api.post("/decode", response_class=OrjsonResponse, responses={200: {"model": list[str]}, 501: {}})
async def decode_route(body: DecodeRequest, request: Request) -> Response:
    """The text of token ids (one list, or a list of lists): one string per list."""
    rows = [cast(list[int], body.ids)] if isinstance(body.ids[0], int) else cast(list[list[int]], body.ids)
    result = await services(request).tokens.decode(request.state, body.model, rows,
                                                   skip_special_tokens=body.skip_special_tokens)
    return OrjsonResponse(result.texts)


def _card(catalog: CatalogService, m: ServedModel) -> dict[str, Any]:
    card: dict[str, Any] = {
        "id": m.name,
        "object": "model",
        "created": 0,
        "owned_by": "gateway",
        "task": m.task,
        "backends": sorted(m.endpoints),
        "default_backend": m.default_backend,
        "onnx_accelerator": m.endpoints["onnx"].accelerator if "onnx" in m.endpoints else None,
        "max_tokens": m.max_seq_len,
        "max_batch_size": m.endpoint(None).max_batch_size,
        "pipeline": catalog.pipeline_of(m),
        "pairs": m.pairs,
    }
    if m.task == "embed":
        card.update(dimensions=m.embedding_dim, pooling=m.pooling, normalize=m.normalize, prompts=m.prompts,
                    default_prompt_name=m.default_prompt or None,
                    matryoshka_dimensions=sorted({*m.matryoshka_dims, m.embedding_dim}) if m.matryoshka_dims else None,
                    embedding_types=[t for t in EMBEDDING_TYPES if m.quantization_ranges or t not in CALIBRATED])
    elif m.task == "sparse-embed":
        card.update(dimensions=m.embedding_dim, prompts=m.prompts, default_prompt_name=m.default_prompt or None)
    else:
        card["labels"] = list(m.labels)
    card["token_outputs"] = [name for name, _ in m.endpoint(None).token_outputs]
    return card


@api.get("/v1/models", response_class=OrjsonResponse, responses={200: {"model": ModelList}})
async def models_route(request: Request) -> Response:
    """Served models with task, labels or dimensions, prompts, max tokens and backends."""
    catalog = services(request).catalog
    return OrjsonResponse({"object": "list", "data": [_card(catalog, m) for m in await catalog.served()]})


@api.get("/v1/models/{model_id}", response_class=OrjsonResponse, responses={200: {"model": ModelCard}})
async def model_route(
    request: Request, model_id: str = Path(description="A served model NAME (GET /v1/models lists them).",
                                           examples=["e5"]),
) -> Response:
    """One served model's card (OpenAI `models.retrieve`); 404 when it is not served."""
    catalog = services(request).catalog
    return OrjsonResponse(_card(catalog, await catalog.model(request.state, model_id, None)))


@ops.get("/healthz", response_class=OrjsonResponse, response_model=Health)
async def healthz() -> Response:
    """The process is alive."""
    return OrjsonResponse({"status": "ok"})


@ops.get("/readyz", response_class=OrjsonResponse, response_model=Readiness, responses={503: {"model": Readiness}})
async def readyz(
    request: Request, deep: bool = Query(False, description="Also run a one-token request through every served "
                                         "model (short deadline); `checks` reports each.", examples=[True]),
) -> Response:
    """200 when Triton is ready and every served model is loaded, else 503 with the `reason`; `triton` says how
    each path to Triton fares. `?deep=1` also runs a one-token request through every served model (short
    deadline, its result reused for 2 s) and reports each."""
    report = await services(request).catalog.readiness(deep)
    ready = report.reason is None
    body: dict[str, Any] = {"status": "ready" if ready else "not ready", "models": report.models,
                            "families": report.families, "triton": report.triton}
    if not ready:
        body["reason"] = report.reason
    if report.checks is not None:
        body["checks"] = report.checks
    return OrjsonResponse(body, status_code=200 if ready else 503)


@ops.get("/metrics", response_class=PlainTextResponse)
async def metrics() -> Response:
    """Prometheus exposition of the gateway's metrics (all workers)."""
    data, content_type = render_latest()
    return Response(data, media_type=content_type)
