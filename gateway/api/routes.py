"""HTTP routes: /classify, /embed, /v1/embeddings, /v1/models, /healthz, /readyz, /metrics."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, Request
from fastapi.responses import PlainTextResponse
from starlette.responses import Response

from gateway.api.responses import OrjsonResponse
from gateway.api.schemas import (
    ClassifyRequest,
    ClassifyResponse,
    EmbedRequest,
    EmbedResponse,
    ErrorResponse,
    Health,
    ModelList,
    OpenAIEmbeddingRequest,
    OpenAIEmbeddingResponse,
    Readiness,
)
from gateway.errors import ErrorKind, GatewayError, invalid
from gateway.metrics import TOKENS, render_latest
from gateway.service.classify import classify
from gateway.service.embed import embed
from gateway.service.runtime import Runtime

T = TypeVar("T")
_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (400, 401, 404, 413, 415, 422, 429, 502, 503, 504)
}


async def require_json(request: Request) -> None:
    """415 unless a POST body is declared as JSON (a form or text body would fail obscurely later)."""
    if request.method != "POST":
        return
    media = request.headers.get("content-type", "").partition(";")[0].strip().lower()
    if media != "application/json" and not (media.startswith("application/") and media.endswith("+json")):
        raise GatewayError(
            ErrorKind.UNSUPPORTED_MEDIA,
            f"send the body as JSON with Content-Type: application/json (got {media or 'no Content-Type'!r})",
        )


api = APIRouter(dependencies=[Depends(require_json)], responses=_ERRORS)  # API keys: api/middleware.py
ops = APIRouter()


def _runtime(request: Request) -> Runtime:
    return request.app.state.runtime  # type: ignore[no-any-return]


def _texts(request: Request, runtime: Runtime, inputs: str | list[str]) -> list[str]:
    texts = [inputs] if isinstance(inputs, str) else inputs
    request.state.inputs = len(texts)
    s = runtime.settings
    if len(texts) > s.max_inputs:
        raise GatewayError(ErrorKind.TOO_LARGE, f"{len(texts)} inputs, over the limit of {s.max_inputs}",
                           type="too_many_inputs")
    for i, text in enumerate(texts):
        if len(text) > s.max_input_chars:
            raise GatewayError(ErrorKind.TOO_LARGE, f"input {i} has {len(text)} characters, over the limit of "
                               f"{s.max_input_chars}", type="input_too_long")
    return texts


async def _deadline(runtime: Runtime, work: Callable[[float], Awaitable[T]]) -> T:
    """Run `work(deadline)`: it must be done by the deadline (time.monotonic()), or 504."""
    timeout = runtime.settings.request_timeout_s
    try:
        async with asyncio.timeout(timeout):
            return await work(time.monotonic() + timeout)
    except TimeoutError:
        raise GatewayError(ErrorKind.TIMEOUT, f"request took longer than {timeout}s") from None


@api.post("/classify", response_class=OrjsonResponse, responses={200: {"model": ClassifyResponse}})
async def classify_route(body: ClassifyRequest, request: Request) -> Response:
    """Classify one text or a list; one prediction per input, in order."""
    runtime = _runtime(request)
    texts = _texts(request, runtime, body.inputs)
    model = await runtime.model(body.model, "classify")
    request.state.model = model.name
    preds, tokens = await _deadline(runtime, lambda deadline: classify(
        runtime.inference, model, texts, truncate=body.truncate, backend=body.backend, deadline=deadline))
    TOKENS.labels("/classify", model.name).inc(tokens)
    return OrjsonResponse({"model": model.name, "predictions": preds, "usage": {"tokens": tokens}})


@api.post("/embed", response_class=OrjsonResponse, responses={200: {"model": EmbedResponse}})
async def embed_route(body: EmbedRequest, request: Request) -> Response:
    """Embed one text or a list; one vector per input, in order."""
    runtime = _runtime(request)
    texts = _texts(request, runtime, body.inputs)
    model = await runtime.model(body.model, "embed")
    request.state.model = model.name
    vectors, tokens = await _deadline(runtime, lambda deadline: embed(
        runtime.inference, model, texts, normalize=body.normalize, truncate=body.truncate, backend=body.backend,
        deadline=deadline))
    TOKENS.labels("/embed", model.name).inc(tokens)
    return OrjsonResponse(
        {"model": model.name, "embeddings": vectors, "dimensions": int(vectors.shape[1]), "usage": {"tokens": tokens}}
    )


@api.post("/v1/embeddings", response_class=OrjsonResponse, responses={200: {"model": OpenAIEmbeddingResponse}})
async def openai_embeddings_route(body: OpenAIEmbeddingRequest, request: Request) -> Response:
    """OpenAI-compatible embeddings (normalized, as OpenAI's are)."""
    runtime = _runtime(request)
    texts = _texts(request, runtime, body.input)
    model = await runtime.model(body.model, "embed")
    request.state.model = model.name
    if body.dimensions is not None and body.dimensions != model.embedding_dim:
        raise invalid(
            f"model {model.name!r} produces {model.embedding_dim}-dimensional embeddings only",
            type="unsupported_dimensions",
        )
    vectors, tokens = await _deadline(runtime, lambda deadline: embed(
        runtime.inference, model, texts, normalize=True, truncate=True, backend=None, deadline=deadline))
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


@api.get("/v1/models", response_class=OrjsonResponse, responses={200: {"model": ModelList}})
async def models_route(request: Request) -> Response:
    """Served models with task, labels or dimensions, max tokens and backends."""
    runtime = _runtime(request)
    if not runtime.registry.models and runtime.registry.refresh_due():
        await runtime.refresh()
    cards = []
    for m in sorted(runtime.registry.models.values(), key=lambda m: m.name):
        card: dict[str, Any] = {
            "id": m.name,
            "object": "model",
            "created": 0,
            "owned_by": "gateway",
            "task": m.task,
            "backends": sorted(m.endpoints),
            "default_backend": m.default_backend,
            "max_tokens": m.max_seq_len,
            "max_batch_size": m.endpoint(None).max_batch_size,
            "pipeline": runtime.inference.pipeline_of(m, m.endpoint(None)),
        }
        if m.task == "classify":
            card["labels"] = list(m.labels)
        else:
            card["dimensions"] = m.embedding_dim
            card["pooling"] = m.pooling
        cards.append(card)
    return OrjsonResponse({"object": "list", "data": cards})


@ops.get("/healthz", response_class=OrjsonResponse, response_model=Health)
async def healthz() -> Response:
    """The process is alive."""
    return OrjsonResponse({"status": "ok"})


@ops.get("/readyz", response_class=OrjsonResponse, response_model=Readiness, responses={503: {"model": Readiness}})
async def readyz(request: Request) -> Response:
    """200 when Triton is ready and every served model is loaded, else 503."""
    runtime = _runtime(request)
    ready = await runtime.ready()
    body = {"status": "ready" if ready else "not ready", "models": sorted(runtime.registry.models)}
    return OrjsonResponse(body, status_code=200 if ready else 503)


@ops.get("/metrics", response_class=PlainTextResponse)
async def metrics() -> Response:
    """Prometheus exposition of the gateway's metrics (all workers)."""
    data, content_type = render_latest()
    return Response(data, media_type=content_type)
