"""text-embeddings-inference's HTTP API for every served model, at the base URL /tei/{model}.

Clients written for TEI (huggingface_hub's InferenceClient, langchain-huggingface, LlamaIndex's
TextEmbeddingsInference, plain HTTP) point their base URL here. Thin adapters: TEI's request is mapped to
the same services /embed, /classify, /rerank, /tokenize and /decode use, and their answer written in TEI's
shape (api/tei_schemas.py documents it, tests/gateway/test_response_models.py checks it). Errors get TEI's
shape and status codes in api/tei_errors.py.

TEI serves one model and routes `POST /` by its kind; here `POST /tei/{model}` does the same by the served
model's task (`_COMPAT`): an embedding model also answers TEI's similarity body there (huggingface_hub's
`sentence_similarity` posts it to the base URL; TEI itself does so only with TASK=sentence-similarity), a SPLADE
model answers /embed_sparse. TEI's OpenAI routes, /v1/embeddings and /embeddings, embed with the path's model (TEI
serves one and takes any `model`); their errors take TEI's OpenAI shape (api/tei_errors.py). `/vertex` (Google
Vertex AI) runs each of its instances through the route the model's kind takes, concurrently.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from pathlib import PurePath
from typing import Annotated, Any, cast

import orjson
from fastapi import APIRouter, Path, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.responses import Response

from contract import TOKEN_EMBEDDINGS, Task
from gateway.api.responses import OrjsonResponse, json_answer
from gateway.api.route_table import runs
from gateway.api.routes import count_tokens, openai_embeddings, services, texts_of
from gateway.api.schemas import OpenAIEmbeddingRequest, OpenAIEmbeddingResponse
from gateway.api.tei_errors import TEI_OPENAI_ROUTES, TEI_PREFIX
from gateway.api.tei_schemas import (
    TEI_VERSION,
    direction,
    TeiClassifierModel,
    TeiClassifierType,
    TeiDecodeRequest,
    TeiDecodeResponse,
    TeiEmbedAllRequest,
    TeiEmbedAllResponse,
    TeiEmbeddingModel,
    TeiEmbeddingType,
    TeiEmbedRequest,
    TeiEmbedResponse,
    TeiEmbedSparseRequest,
    TeiEmbedSparseResponse,
    TeiError,
    TeiInfo,
    TeiOpenAIError,
    TeiPredictRequest,
    TeiPredictResponse,
    TeiRerankerType,
    TeiRerankRequest,
    TeiRerankResponse,
    TeiSimilarityRequest,
    TeiSimilarityResponse,
    TeiTokenizeRequest,
    TeiTokenizeResponse,
    TeiVertexRequest,
    TeiVertexResponse,
)
from gateway.api.vectors import sparse_json
from gateway.errors import ErrorType, GatewayError, invalid
from gateway.service.registry import ServedModel
from gateway.service.services import Services
from gateway.settings import GatewaySettings

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": TeiError} for code in (400, 401, 404, 413, 415, 422, 424, 429, 501, 503, 504)
}
tei = APIRouter(prefix=TEI_PREFIX + "{model}", tags=["text-embeddings-inference"], responses=_ERRORS)
ModelName = Annotated[str, Path(description="A served model NAME (GET /v1/models lists them): the base URL "
                                            "/tei/{model} is that model's TEI server.", examples=["e5"])]
TEI_POOLING = {"mean": "mean", "cls": "cls", "lasttoken": "last_token"}  # the builder's names -> TEI's
TEI_DTYPE = {"fp16": "float16", "fp32": "float32"}


def _json(body: BaseModel) -> Response:
    """The answer of a response model (/info; the inference routes write dicts: no model per request)."""
    return OrjsonResponse(body.model_dump())


async def _served(request: Request, name: str, task: Task | None = None) -> tuple[Services, ServedModel]:
    """The model /tei/{model} names (404 when not served; `task`: 424 when it serves another one)."""
    tasks = services(request)
    return tasks, await tasks.catalog.model(request.state, name, task)


def _not_empty(texts: list[str], field: str) -> None:
    """TEI's `Empty` (400) for an empty list or an empty text."""
    if not texts or not all(texts):
        raise invalid(f"`{field}` cannot be empty", type=ErrorType.EMPTY_INPUT)


# --- embed -----------------------------------------------------------------------------------------
async def _embed(request: Request, tasks: Services, model: ServedModel, body: TeiEmbedRequest) -> Response:
    query = body.to_query()
    _not_empty(query.texts, "inputs")
    result = await tasks.embed.embed(request.state, model, query)
    count_tokens(request, model.name, result.tokens)
    return OrjsonResponse(result.vectors)


@tei.post("/embed", response_class=OrjsonResponse, responses={200: {"model": TeiEmbedResponse}})
@runs("embed")
async def tei_embed_route(model: ModelName, body: TeiEmbedRequest, request: Request) -> Response:
    """TEI `/embed`: one vector per input, as a bare array (also for a single text)."""
    tasks, served = await _served(request, model, "embed")
    return await _embed(request, tasks, served, body)


# --- TEI's OpenAI routes ---------------------------------------------------------------------------
_OPENAI_ERRORS: dict[int | str, dict[str, Any]] = {code: {"model": TeiOpenAIError} for code in _ERRORS}


@runs("embed")
async def tei_openai_embeddings_route(model: ModelName, body: OpenAIEmbeddingRequest, request: Request) -> Response:
    """TEI's OpenAI-compatible embeddings (the openai client's base URL /tei/{model}/v1): normalized vectors of the
    path's model, whatever `model` says (TEI serves one model and takes any); texts over the model's limits are
    truncated, as TEI's auto_truncate does. Errors in TEI's OpenAI shape, `{message, code, type}`."""
    tasks, served = await _served(request, model, "embed")
    return await openai_embeddings(request, tasks.embed, served, body, cut=True)


for _path in TEI_OPENAI_ROUTES:
    tei.add_api_route(_path, tei_openai_embeddings_route, methods=["POST"], response_class=OrjsonResponse,
                      name=f"tei_openai{_path.replace('/', '_')}", operation_id=f"tei_openai{_path.replace('/', '_')}",
                      responses={200: {"model": OpenAIEmbeddingResponse}, **_OPENAI_ERRORS})


# --- sparse and per-token vectors, similarity ------------------------------------------------------
async def _embed_sparse(request: Request, tasks: Services, model: ServedModel, body: TeiEmbedSparseRequest) -> Response:
    texts = texts_of(body.inputs)
    _not_empty(texts, "inputs")
    result = await tasks.sparse.embed_sparse(
        request.state, model.name, texts, prompt_name=body.prompt_name, truncate=body.truncate is not False,
        direction=direction(body.truncation_direction))
    count_tokens(request, model.name, result.tokens)
    return OrjsonResponse(sparse_json(result.vectors))


@tei.post("/embed_sparse", response_class=OrjsonResponse, responses={200: {"model": TeiEmbedSparseResponse}})
async def tei_embed_sparse_route(model: ModelName, body: TeiEmbedSparseRequest, request: Request) -> Response:
    """TEI `/embed_sparse`: per input, its non-zero {index, value} pairs, ascending index (SPLADE models, and
    bge-m3-style lexical weights); 424 for a model without a sparse output."""
    tasks, served = await _served(request, model)
    return await _embed_sparse(request, tasks, served, body)


@tei.post("/embed_all", response_class=OrjsonResponse, responses={200: {"model": TeiEmbedAllResponse}})
async def tei_embed_all_route(model: ModelName, body: TeiEmbedAllRequest, request: Request) -> Response:
    """TEI `/embed_all`: per input, the last hidden state of every token of its truncated encoding (special tokens
    included, not normalized); 424 for a model built without per-token outputs."""
    texts = texts_of(body.inputs)
    _not_empty(texts, "inputs")
    tasks, served = await _served(request, model)
    result = await tasks.multi_vector.embed_tokens(
        request.state, TOKEN_EMBEDDINGS, served.name, texts, prompt_name=body.prompt_name,
        truncate=body.truncate is not False, direction=direction(body.truncation_direction))
    count_tokens(request, served.name, result.tokens)
    return await json_answer(result.vectors, floats=sum(v.size for v in result.vectors))


async def _similarity(request: Request, tasks: Services, model: ServedModel, body: TeiSimilarityRequest) -> Response:
    if not body.inputs.sentences:
        raise invalid("`inputs.sentences` cannot be empty", type=ErrorType.EMPTY_INPUT)
    query = body.to_query()
    _not_empty(query.texts, "inputs")
    result = await tasks.embed.embed(request.state, model, query)
    count_tokens(request, model.name, result.tokens)
    return OrjsonResponse(result.vectors[1:] @ result.vectors[0])  # unit vectors: the dot product is the cosine


@tei.post("/similarity", response_class=OrjsonResponse, responses={200: {"model": TeiSimilarityResponse}})
@runs("embed")
async def tei_similarity_route(model: ModelName, body: TeiSimilarityRequest, request: Request) -> Response:
    """TEI `/similarity` (embedding models): the cosine similarity of `inputs.source_sentence` with each of
    `inputs.sentences`, in order."""
    tasks, served = await _served(request, model, "embed")
    return await _similarity(request, tasks, served, body)


# --- predict ---------------------------------------------------------------------------------------
async def _predict(request: Request, tasks: Services, model: ServedModel, body: TeiPredictRequest, *,
                   nested: bool = False) -> Response:
    query = body.to_query()
    _not_empty(query.texts + (query.pairs or []), "inputs")
    result = await tasks.classify.classify(request.state, model, query)
    count_tokens(request, model.name, result.tokens)
    rows = [
        [{"score": score, "label": label} for label, score in sorted(p["scores"].items(), key=lambda s: -s[1])]
        for p in result.predictions
    ]
    return OrjsonResponse(rows[0] if body.single and not nested else rows)


@tei.post("/predict", response_class=OrjsonResponse, responses={200: {"model": TeiPredictResponse}})
@runs("classify")
async def tei_predict_route(model: ModelName, body: TeiPredictRequest, request: Request) -> Response:
    """TEI `/predict` (classifiers): every label, best first; a single input gives one flat list, a batch
    one list per input."""
    tasks, served = await _served(request, model, "classify")
    return await _predict(request, tasks, served, body)


# --- rerank ----------------------------------------------------------------------------------------
async def _rerank(request: Request, tasks: Services, model: ServedModel, body: TeiRerankRequest) -> Response:
    _not_empty(body.texts, "texts")
    _not_empty([body.query], "query")
    result = await tasks.rerank.rerank(request.state, model, body.to_query())
    count_tokens(request, model.name, result.tokens)
    scores = result.scores
    if body.return_text:
        return OrjsonResponse([{"index": i, "text": body.texts[i], "score": scores[i]} for i in result.order])
    return OrjsonResponse([{"index": i, "score": scores[i]} for i in result.order])


@tei.post("/rerank", response_class=OrjsonResponse, responses={200: {"model": TeiRerankResponse}})
@runs("rerank")
async def tei_rerank_route(model: ModelName, body: TeiRerankRequest, request: Request) -> Response:
    """TEI `/rerank` (cross-encoders): `[{index, score, text?}]`, best first."""
    tasks, served = await _served(request, model, "rerank")
    return await _rerank(request, tasks, served, body)


# --- the compat route ------------------------------------------------------------------------------
Handler = Callable[[Request, Services, ServedModel, Any], Coroutine[Any, Any, Response]]


async def _predict_compat(request: Request, tasks: Services, model: ServedModel, body: TeiPredictRequest) -> Response:
    # huggingface_hub's text_classification sends `parameters` and reads the Inference API's answer
    # (one list per input: [[{label, score}, ...]]); TEI's own flat list would give it the best label only.
    return await _predict(request, tasks, model, body, nested=body.parameters is not None)


# per task, the bodies POST /tei/{model} takes, tried in order (the first one's errors are the answer's)
_COMPAT: dict[str, tuple[tuple[type[BaseModel], Handler], ...]] = {
    "embed": ((TeiEmbedRequest, _embed), (TeiSimilarityRequest, _similarity)),
    "sparse-embed": ((TeiEmbedSparseRequest, _embed_sparse),),
    "classify": ((TeiPredictRequest, _predict_compat),),
    "rerank": ((TeiRerankRequest, _rerank),),
}
_COMPAT_BODY = {"anyOf": [{"$ref": f"#/components/schemas/{m.__name__}"}
                          for bodies in _COMPAT.values() for m, _ in bodies]}


@tei.post("", response_class=OrjsonResponse,
          openapi_extra={"requestBody": {"required": True, "content": {"application/json": {"schema": _COMPAT_BODY}}}},
          responses={200: {"model": TeiEmbedResponse | TeiSimilarityResponse | TeiEmbedSparseResponse
                                    | TeiPredictResponse | TeiRerankResponse}})
@runs(None)
async def tei_compat_route(model: ModelName, request: Request) -> Response:
    """TEI's `POST /`: `/embed` for an embedding model (`/similarity` when `inputs` is
    `{source_sentence, sentences}`), `/embed_sparse` for a SPLADE model, `/predict` for a classifier, `/rerank` for
    a reranker. For a classifier, `{"inputs": str, "parameters": {...}}` (huggingface_hub's `text_classification`)
    is answered as the Hugging Face Inference API does, `[[{label, score}, ...]]`."""
    tasks, served = await _served(request, model)
    raw = await request.body()
    first: ValidationError | None = None
    for schema, handler in _COMPAT[served.task]:
        try:
            body = schema.model_validate_json(raw)
        except ValidationError as exc:
            first = first or exc
            continue
        return await handler(request, tasks, served, body)
    assert first is not None  # every task has at least one body
    raise RequestValidationError(first.errors(include_url=False)) from None


# --- Vertex AI -------------------------------------------------------------------------------------
@tei.post("/vertex", response_class=OrjsonResponse, responses={200: {"model": TeiVertexResponse}})
async def tei_vertex_route(model: ModelName, body: TeiVertexRequest, request: Request) -> Response:
    """TEI `/vertex` (Google Vertex AI): `{"instances": [...]}`, answered `{"predictions": [...]}`. Each instance
    is the body of the route the model's kind takes (/embed, /embed_sparse, /predict, /rerank: the first body
    `POST /tei/{model}` takes) and gets that route's answer; one with `query` and `texts` is a /rerank body (424
    when the model is no reranker), as in TEI's vertex_compatibility.
    Instances run concurrently; one that fails fails the request with its error (the others are cancelled)."""
    tasks, served = await _served(request, model)
    limit = tasks.catalog.settings.max_inputs
    if len(body.instances) > limit:
        raise GatewayError(ErrorType.TOO_MANY_INPUTS, f"{len(body.instances)} instances, over the limit of {limit}")
    calls: list[tuple[Handler, BaseModel]] = []
    for instance in map(orjson.dumps, body.instances):  # validated as the routes validate their JSON bodies
        try:
            rerank = TeiRerankRequest.model_validate_json(instance)
        except ValidationError:
            schema, handler = _COMPAT[served.task][0]
            try:
                calls.append((handler, schema.model_validate_json(instance)))
            except ValidationError as exc:
                raise RequestValidationError(exc.errors(include_url=False)) from None
            continue
        if served.task != "rerank":  # TEI: "model is not a re-ranker model"; here the error /rerank gives
            await tasks.catalog.model(request.state, model, "rerank")
        calls.append((_rerank, rerank))
    # each instance notes its own input count in a state of its own (the access log and metrics read the sum)
    scopes = [{**request.scope, "state": {}} for _ in calls]
    try:
        async with asyncio.TaskGroup() as group:
            jobs = [group.create_task(handler(Request(scope), tasks, served, instance))
                    for scope, (handler, instance) in zip(scopes, calls)]
    except BaseExceptionGroup as failed:
        raise failed.exceptions[0] from None
    finally:
        request.state.inputs = sum(int(scope["state"].get("inputs", 0)) for scope in scopes)
    return Response(b'{"predictions":[' + b",".join(bytes(job.result().body) for job in jobs) + b"]}",
                    media_type="application/json")


# --- tokenize, decode ------------------------------------------------------------------------------
@tei.post("/tokenize", response_class=OrjsonResponse, responses={200: {"model": TeiTokenizeResponse}})
async def tei_tokenize_route(model: ModelName, body: TeiTokenizeRequest, request: Request) -> Response:
    """TEI `/tokenize`: the tokens of every input (untruncated), with character offsets."""
    texts = texts_of(body.inputs)
    _not_empty(texts, "inputs")
    tasks, served = await _served(request, model)
    result = await tasks.tokens.tokenize(request.state, served, texts, add_special_tokens=body.add_special_tokens,
                                         prompt_name=body.prompt_name)
    return await json_answer(result.tokens, tokens=sum(map(len, result.tokens)))


@tei.post("/decode", response_class=OrjsonResponse, responses={200: {"model": TeiDecodeResponse}})
async def tei_decode_route(model: ModelName, body: TeiDecodeRequest, request: Request) -> Response:
    """TEI `/decode`: the text of token ids (one list, or a list of lists)."""
    ids = body.ids
    rows = [cast(list[int], ids)] if not ids or isinstance(ids[0], int) else cast(list[list[int]], ids)
    if not rows or not all(rows):
        raise invalid("`ids` cannot be empty", type=ErrorType.EMPTY_INPUT)
    tasks, served = await _served(request, model)
    result = await tasks.tokens.decode(request.state, served, rows, skip_special_tokens=body.skip_special_tokens)
    return OrjsonResponse(result.texts)


# --- info, health ----------------------------------------------------------------------------------
def public_model_id(model: ServedModel) -> str:
    """What the model was built from: a hub id as it is, a local folder by its name only (the server's paths are
    not the client's business)."""
    source = model.source or model.name
    hub_id = source.count("/") <= 1 and not source.startswith(("/", ".", "~"))
    return source if hub_id else PurePath(source).name


def _info(s: GatewaySettings, model: ServedModel) -> TeiInfo:
    endpoint = model.endpoint(None)
    model_type: TeiEmbeddingType | TeiClassifierType | TeiRerankerType
    labels = TeiClassifierModel(id2label={str(i): label for i, label in enumerate(model.labels)},
                                label2id={label: i for i, label in enumerate(model.labels)})
    if model.task == "embed":
        pooling = TEI_POOLING.get(model.pooling, model.pooling)
        model_type = TeiEmbeddingType(embedding=TeiEmbeddingModel(pooling=pooling))
    elif model.task == "sparse-embed":  # TEI serves SPLADE as an embedding model with splade pooling
        model_type = TeiEmbeddingType(embedding=TeiEmbeddingModel(pooling="splade"))
    elif model.task == "classify":
        model_type = TeiClassifierType(classifier=labels)
    else:
        model_type = TeiRerankerType(reranker=labels)
    step_rows = endpoint.step_max_batch_size or endpoint.max_batch_size
    return TeiInfo(
        model_id=public_model_id(model),
        model_dtype=TEI_DTYPE.get(endpoint.precision, "float16" if endpoint.backend == "trt" else "float32"),
        served_model_name=model.name,
        model_type=model_type,
        max_concurrent_requests=s.max_in_flight,
        max_input_length=model.max_seq_len,
        max_batch_tokens=s.max_batch_tokens,
        max_batch_requests=min(s.max_batch_requests, step_rows),
        max_client_batch_size=s.max_inputs,
        auto_truncate=True,
        tokenization_workers=s.worker_count,
        version=TEI_VERSION,
    )


@tei.get("/info", response_class=OrjsonResponse, responses={200: {"model": TeiInfo}})
async def tei_info_route(model: ModelName, request: Request) -> Response:
    """TEI `/info`: what the model is (`model_type`) and the limits it is served with."""
    tasks, served = await _served(request, model)
    return _json(_info(tasks.catalog.settings, served))


@tei.get("/health", response_class=Response, responses={200: {"description": "The model answers (empty body)."}})
async def tei_health_route(model: ModelName, request: Request) -> Response:
    """TEI `/health` (public, like TEI's): 200 with an empty body when a one-token request through the model
    succeeds within GATEWAY_READY_PROBE_TIMEOUT_S (its result reused for 2 s), else 503 `Unhealthy`, also for a
    model of the repository that is not loaded now."""
    catalog = services(request).catalog
    await catalog.check_health(await catalog.health_model(request.state, model))
    return Response(status_code=200)
