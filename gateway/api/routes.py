"""HTTP routes: /classify, /embed, /rerank, /tokenize, /decode, OpenAI-style /v1/embeddings, /v1/rerank and
/v1/models, and /healthz, /readyz, /metrics."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import numpy as np
from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.responses import PlainTextResponse
from starlette.responses import Response

from contract import TruncationDirection
from gateway.api.responses import OrjsonResponse
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
)
from gateway.errors import ErrorType, GatewayError, invalid
from gateway.metrics import TOKENS, render_latest
from gateway.service.classify import check_pairs, classify
from gateway.service.embed import (
    check_dimensions,
    embed,
    prompt_for_input_type,
    prompt_text,
    with_prompt,
)
from gateway.service.inference import Inputs
from gateway.service.registry import Backend, ServedModel
from gateway.service.rerank import ranking, rerank
from gateway.service.runtime import Runtime
from gateway.service.tokens import check_token_ids, decode, tokenize, tokenizer_of

T = TypeVar("T")
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 404, 413, 415, 422, 429, 501, 502, 503, 504)
}


def json_media_error(content_type: str) -> GatewayError | None:
    """The 415 of a POST body not declared as JSON (a form or text body would fail obscurely later)."""
    media = content_type.partition(";")[0].strip().lower()
    if media != "application/json" and not (media.startswith("application/") and media.endswith("+json")):
        return GatewayError(ErrorType.UNSUPPORTED_MEDIA_TYPE, "send the body as JSON with Content-Type: "
                            f"application/json (got {media or 'no Content-Type'!r})")
    return None


async def require_json(request: Request) -> None:
    """415 unless a POST body is declared as JSON."""
    if request.method == "POST" and (error := json_media_error(request.headers.get("content-type", ""))) is not None:
        raise error


api = APIRouter(dependencies=[Depends(require_json)], responses=_ERRORS)  # API keys: api/middleware.py
ops = APIRouter()


def _runtime(request: Request) -> Runtime:
    return request.app.state.runtime  # type: ignore[no-any-return]


def _check_inputs(request: Request, runtime: Runtime, texts: list[str], *more: list[str]) -> None:
    """413 for too many inputs or an over-long text (characters; tokens are checked after tokenization)."""
    request.state.inputs = len(texts)
    s = runtime.settings
    if len(texts) > s.max_inputs:
        raise GatewayError(ErrorType.TOO_MANY_INPUTS, f"{len(texts)} inputs, over the limit of {s.max_inputs}")
    for group in (texts, *more):
        for i, text in enumerate(group):
            if len(text) > s.max_input_chars:
                raise GatewayError(ErrorType.INPUT_TOO_LONG, f"input {i} has {len(text)} characters, over the limit of "
                                   f"{s.max_input_chars}")


def _texts(request: Request, runtime: Runtime, inputs: str | list[str]) -> list[str]:
    texts = [inputs] if isinstance(inputs, str) else inputs
    _check_inputs(request, runtime, texts)
    return texts


def _classify_inputs(request: Request, runtime: Runtime, body: ClassifyRequest) -> Inputs:
    """Texts or pairs; pairs are a list of two-text lists."""
    if isinstance(body.inputs, list) and body.inputs and isinstance(body.inputs[0], list):
        pairs = cast(list[list[str]], body.inputs)
        first, second = [p[0] for p in pairs], [p[1] for p in pairs]
        _check_inputs(request, runtime, first, second)
        return Inputs(first, second, body.truncation_direction)
    texts = _texts(request, runtime, cast(str | list[str], body.inputs))
    return Inputs(texts, None, body.truncation_direction)


async def _deadline(runtime: Runtime, work: Callable[[float], Awaitable[T]]) -> T:
    """Run `work(deadline)`: it must be done by the deadline (time.monotonic()), or 504."""
    timeout = runtime.settings.request_timeout_s
    try:
        async with asyncio.timeout(timeout):
            return await work(time.monotonic() + timeout)
    except TimeoutError:
        raise GatewayError(ErrorType.TIMEOUT, f"request took longer than {timeout}s") from None


@api.post("/classify", response_class=OrjsonResponse, responses={200: {"model": ClassifyResponse}})
async def classify_route(body: ClassifyRequest, request: Request) -> Response:
    """Classify one text, a list, or a list of [text, text_pair] pairs; one prediction per input, in order."""
    runtime = _runtime(request)
    inputs = _classify_inputs(request, runtime, body)
    model = await runtime.model(body.model, "classify")
    request.state.model = model.name
    check_pairs(model, inputs.pairs is not None)
    preds, tokens = await _deadline(runtime, lambda deadline: classify(
        runtime.inference, model, inputs, truncate=body.truncate, backend=body.backend, deadline=deadline))
    TOKENS.labels("/classify", model.name).inc(tokens)
    return OrjsonResponse({"model": model.name, "predictions": preds, "usage": {"tokens": tokens}})


@api.post("/embed", response_class=OrjsonResponse, responses={200: {"model": EmbedResponse}})
async def embed_route(body: EmbedRequest, request: Request) -> Response:
    """Embed one text or a list; one vector per input, in order."""
    runtime = _runtime(request)
    texts = _texts(request, runtime, body.inputs)
    model = await runtime.model(body.model, "embed")
    request.state.model = model.name
    dimensions = check_dimensions(model, body.dimensions)
    inputs = Inputs(with_prompt(texts, prompt_text(model, body.prompt_name)), None, body.truncation_direction)
    vectors, tokens = await _deadline(runtime, lambda deadline: embed(
        runtime.inference, model, inputs, normalize=body.normalize, dimensions=dimensions, truncate=body.truncate,
        backend=body.backend, deadline=deadline))
    TOKENS.labels("/embed", model.name).inc(tokens)
    return OrjsonResponse(
        {"model": model.name, "embeddings": vectors, "dimensions": int(vectors.shape[1]), "usage": {"tokens": tokens}}
    )


def _openai_inputs(runtime: Runtime, request: Request, body: OpenAIEmbeddingRequest, model: ServedModel) -> Inputs:
    """Texts with the prompt of `input_type` (or the model's default one), or token ids as given."""
    raw = body.input
    if isinstance(raw, list) and raw and isinstance(raw[0], (int, list)):
        rows = [cast(list[int], raw)] if isinstance(raw[0], int) else cast(list[list[int]], raw)
        request.state.inputs = len(rows)
        if len(rows) > runtime.settings.max_inputs:
            raise GatewayError(ErrorType.TOO_MANY_INPUTS, f"{len(rows)} inputs, over the limit of "
                               f"{runtime.settings.max_inputs}")
        if body.input_type is not None:
            raise invalid("input_type applies to text input; token ids are taken as given",
                          type=ErrorType.PROMPT_WITH_TOKEN_INPUT)
        tokenizer = runtime.inference.tokenizer_for(model)
        if tokenizer is None:
            raise invalid(f"model {model.name!r} takes no token ids here: the gateway cannot read its tokenizer "
                          "(GATEWAY_REPOSITORY); send text", type=ErrorType.TOKEN_INPUT_UNSUPPORTED)
        check_token_ids(tokenizer.encoder, rows)
        return Inputs([], token_ids=rows)
    texts = _texts(request, runtime, cast(str | list[str], raw))
    return Inputs(with_prompt(texts, prompt_text(model, prompt_for_input_type(model, body.input_type))))


@api.post("/v1/embeddings", response_class=OrjsonResponse, responses={200: {"model": OpenAIEmbeddingResponse}})
async def openai_embeddings_route(body: OpenAIEmbeddingRequest, request: Request) -> Response:
    """OpenAI-compatible embeddings (normalized, as OpenAI's are)."""
    runtime = _runtime(request)
    model = await runtime.model(body.model, "embed")
    request.state.model = model.name
    inputs = _openai_inputs(runtime, request, body, model)
    dimensions = check_dimensions(model, body.dimensions)
    vectors, tokens = await _deadline(runtime, lambda deadline: embed(
        runtime.inference, model, inputs, normalize=True, dimensions=dimensions, truncate=True, backend=None,
        deadline=deadline))
    TOKENS.labels("/v1/embeddings", model.name).inc(tokens)
    if body.encoding_format == "base64":
        little = vectors.astype("<f4", copy=False)
        data = [
            {"object": "embedding", "index": i, "embedding": base64.b64encode(row.tobytes()).decode()}
            for i, row in enumerate(little)
        ]
    else:
        data = [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(vectors)]
    return OrjsonResponse(
        {
            "object": "list",
            "data": data,
            "model": model.name,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
    )


async def _rerank(runtime: Runtime, request: Request, name: str | None, query: str, texts: list[str], *,
                  raw_scores: bool, truncate: bool, direction: TruncationDirection,
                  backend: Backend | None) -> tuple[ServedModel, np.ndarray, int]:
    _check_inputs(request, runtime, texts, [query])
    model = await runtime.model(name, "rerank")
    request.state.model = model.name
    scores, tokens = await _deadline(runtime, lambda deadline: rerank(
        runtime.inference, model, query, texts, raw_scores=raw_scores, truncate=truncate, direction=direction,
        backend=backend, deadline=deadline))
    TOKENS.labels(request.url.path, model.name).inc(tokens)
    return model, scores, tokens


@api.post("/rerank", response_class=OrjsonResponse, responses={200: {"model": list[Rank]}})
async def rerank_route(body: RerankRequest, request: Request) -> Response:
    """Score every text against the query with a cross-encoder; results sorted by score, best first
    (text-embeddings-inference's shape)."""
    runtime = _runtime(request)
    _, scores, _ = await _rerank(runtime, request, body.model, body.query, body.texts, raw_scores=body.raw_scores,
                                 truncate=body.truncate, direction=body.truncation_direction, backend=body.backend)
    values = scores.tolist()
    results: list[dict[str, Any]] = []
    for i in ranking(scores):
        rank: dict[str, Any] = {"index": i, "score": values[i]}
        if body.return_text:
            rank["text"] = body.texts[i]
        results.append(rank)
    return OrjsonResponse(results)


@api.post("/v1/rerank", response_class=OrjsonResponse, responses={200: {"model": CohereRerankResponse}})
async def cohere_rerank_route(body: CohereRerankRequest, request: Request) -> Response:
    """Cohere/Jina-style rerank: `results` sorted by relevance_score, best first, `top_n` of them."""
    runtime = _runtime(request)
    texts = [d if isinstance(d, str) else d.text for d in body.documents]
    model, scores, tokens = await _rerank(runtime, request, body.model, body.query, texts, raw_scores=False,
                                          truncate=True, direction="right", backend=None)
    values = scores.tolist()
    results: list[dict[str, Any]] = []
    for i in ranking(scores, body.top_n):
        result: dict[str, Any] = {"index": i, "relevance_score": values[i]}
        if body.return_documents:
            result["document"] = {"text": texts[i]}
        results.append(result)
    request_id = getattr(request.state, "request_id", "") or ""
    return OrjsonResponse({"id": request_id, "model": model.name, "results": results,
                           "usage": {"total_tokens": tokens}})


@api.post("/tokenize", response_class=OrjsonResponse, responses={200: {"model": list[list[Token]]}, 501: {}})
async def tokenize_route(body: TokenizeRequest, request: Request) -> Response:
    """Tokens of one text or a list (untruncated): id, text, special flag and character offsets."""
    runtime = _runtime(request)
    texts = _texts(request, runtime, body.inputs)
    model = await runtime.any_model(body.model)
    request.state.model = model.name
    prefix = prompt_text(model, body.prompt_name) if body.prompt_name is not None else ""
    tokenizer = tokenizer_of(runtime.inference, model)
    return OrjsonResponse(await tokenize(tokenizer, with_prompt(texts, prefix), body.add_special_tokens))


@api.post("/decode", response_class=OrjsonResponse, responses={200: {"model": list[str]}, 501: {}})
async def decode_route(body: DecodeRequest, request: Request) -> Response:
    """The text of token ids (one list, or a list of lists): one string per list."""
    runtime = _runtime(request)
    rows = [cast(list[int], body.ids)] if isinstance(body.ids[0], int) else cast(list[list[int]], body.ids)
    request.state.inputs = len(rows)
    model = await runtime.any_model(body.model)
    request.state.model = model.name
    return OrjsonResponse(await decode(tokenizer_of(runtime.inference, model), rows, body.skip_special_tokens))


def _card(runtime: Runtime, m: ServedModel) -> dict[str, Any]:
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
        "pipeline": runtime.inference.pipeline_of(m, m.endpoint(None)),
        "pairs": m.pairs,
    }
    if m.task == "embed":
        card.update(dimensions=m.embedding_dim, pooling=m.pooling, normalize=m.normalize, prompts=m.prompts,
                    default_prompt_name=m.default_prompt or None,
                    matryoshka_dimensions=sorted({*m.matryoshka_dims, m.embedding_dim}) if m.matryoshka_dims else None)
    elif m.task == "sparse-embed":
        card.update(dimensions=m.embedding_dim, prompts=m.prompts, default_prompt_name=m.default_prompt or None)
    else:
        card["labels"] = list(m.labels)
    card["token_outputs"] = [name for name, _ in m.endpoint(None).token_outputs]
    return card


@api.get("/v1/models", response_class=OrjsonResponse, responses={200: {"model": ModelList}})
async def models_route(request: Request) -> Response:
    """Served models with task, labels or dimensions, prompts, max tokens and backends."""
    runtime = _runtime(request)
    if not runtime.registry.models and runtime.registry.refresh_due():
        await runtime.refresh()
    cards = [_card(runtime, m) for m in sorted(runtime.registry.models.values(), key=lambda m: m.name)]
    return OrjsonResponse({"object": "list", "data": cards})


@api.get("/v1/models/{model_id}", response_class=OrjsonResponse, responses={200: {"model": ModelCard}})
async def model_route(
    request: Request, model_id: str = Path(description="A served model NAME (GET /v1/models lists them).",
                                           examples=["e5"]),
) -> Response:
    """One served model's card (OpenAI `models.retrieve`); 404 when it is not served."""
    runtime = _runtime(request)
    return OrjsonResponse(_card(runtime, await runtime.any_model(model_id)))


@ops.get("/healthz", response_class=OrjsonResponse, response_model=Health)
async def healthz() -> Response:
    """The process is alive."""
    return OrjsonResponse({"status": "ok"})


@ops.get("/readyz", response_class=OrjsonResponse, response_model=Readiness, responses={503: {"model": Readiness}})
async def readyz(
    request: Request, deep: bool = Query(False, description="Also run a one-token request through every served "
                                         "model (short deadline); `checks` reports each.", examples=[True]),
) -> Response:
    """200 when Triton is ready and every served model is loaded, else 503. `?deep=1` also runs a
    one-token request through every served model (short deadline) and reports each."""
    runtime = _runtime(request)
    ready = await runtime.ready()
    body: dict[str, Any] = {"status": "ready" if ready else "not ready", "models": sorted(runtime.registry.models),
                            "families": {n: runtime.registry.state_of(n) for n in sorted(runtime.registry.families)}}
    if deep and ready:
        body["checks"] = checks = await runtime.probe()
        if any(v != "ok" for v in checks.values()):
            body["status"], ready = "not ready", False
    return OrjsonResponse(body, status_code=200 if ready else 503)


@ops.get("/metrics", response_class=PlainTextResponse)
async def metrics() -> Response:
    """Prometheus exposition of the gateway's metrics (all workers)."""
    data, content_type = render_latest()
    return Response(data, media_type=content_type)
