"""Request and response models of the HTTP API (pydantic v2). A request model turns itself into its service's
arguments (`to_query()`), so that a service is called the same way from every API that offers it."""

from __future__ import annotations

from typing import Annotated, Literal, cast

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PlainSerializer, PlainValidator, TypeAdapter, WithJsonSchema

from contract import ApiBackend as Backend
from contract import OnnxAccelerator
from gateway.service.classify import ClassifyQuery
from gateway.service.embed import EmbedQuery
from gateway.service.prompts import Prompt
from gateway.service.quantization import EmbeddingType
from gateway.service.rerank import RerankQuery

Text = Annotated[str, Field(min_length=1)]
Inputs = Annotated[
    Text | Annotated[list[Text], Field(min_length=1)], Field(description="One non-empty text or a non-empty list.")
]


def texts_of(inputs: str | list[str]) -> list[str]:
    return [inputs] if isinstance(inputs, str) else inputs


_FLOAT_ROWS: TypeAdapter[list[list[float]]] = TypeAdapter(list[list[float]])


def _float_matrix(value: object) -> np.ndarray:
    """A [n, dim] float32 array as handlers build it, or (a body read back) a list of equally long float lists."""
    if isinstance(value, np.ndarray):
        if value.ndim == 2 and value.dtype == np.float32:
            return value
        raise ValueError("expected a 2-D float32 array")
    rows = _FLOAT_ROWS.validate_python(value)
    if len({len(row) for row in rows}) > 1:
        raise ValueError("expected rows of one length")
    return np.array(rows, dtype=np.float32).reshape(len(rows), len(rows[0]) if rows else 0)


# Embedding vectors in a response model: a [n, dim] float32 array, checked as such (not float by float) and
# written by orjson as float32 (OrjsonResponse); the OpenAPI document shows a list of float lists.
FloatMatrix = Annotated[
    np.ndarray,
    PlainValidator(_float_matrix),
    PlainSerializer(lambda a: a.tolist(), when_used="json"),
    WithJsonSchema({"type": "array", "items": {"type": "array", "items": {"type": "number", "format": "float"}}}),
]


class _Request(BaseModel):
    """Request bodies are strict: booleans are JSON booleans, integers JSON integers, no unknown fields."""

    model_config = ConfigDict(extra="forbid", strict=True)


Pair = Annotated[list[Text], Field(min_length=2, max_length=2)]
ClassifyInputs = Annotated[
    Text | Annotated[list[Text], Field(min_length=1)] | Annotated[list[Pair], Field(min_length=1)],
    Field(
        description="One non-empty text, a non-empty list, or (models built with pairs) a list of "
        "[text, text_pair] pairs.",
        examples=[["the movie was great"], [["A man is eating.", "Someone eats food."]]],
    ),
]
Direction = Annotated[
    Literal["right", "left"],
    Field(description="Which end of an over-long input is cut off (pairs: the longer text first).",
          examples=["left"]),
]
TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
Offset = Annotated[int, Field(ge=0)]
Chunks = Annotated[
    list[Annotated[list[Annotated[list[Offset], Field(min_length=2, max_length=2)]], Field(min_length=1)]],
    Field(min_length=1, description="Late chunking: per input, its chunks as [start, end) character offsets into the "
          "text (the model runs once over the whole text; each chunk's vector is the mean of the hidden states of the "
          "tokens it overlaps). Answers one vector per chunk; a text over the model's window is refused (413).",
          examples=[[[[0, 19], [20, 41]]]]),
]
LongInputs = Annotated[
    bool | Literal["chunk"] | None,
    Field(description="A text over the model's window: `true` truncates it, `false` refuses it (413), `chunk` "
          "embeds it in windows of the model's length and answers their token-weighted mean; default: the "
          "server's (GATEWAY_LONG_INPUTS, `truncate` unless set).", examples=["chunk"]),
]


class ClassifyRequest(_Request):
    model: str | None = Field(None, description="Served model NAME; optional when one classifier is served.")
    inputs: ClassifyInputs
    truncate: bool = Field(True, description="Truncate texts over max_seq_len (else 413).")
    truncation_direction: Direction = "right"
    backend: Backend | None = Field(None, description="Force a backend; default TensorRT when built.")

    def to_query(self) -> ClassifyQuery:
        raw = self.inputs
        if isinstance(raw, list) and raw and isinstance(raw[0], list):
            pairs = cast(list[list[str]], raw)
            texts, second = [p[0] for p in pairs], [p[1] for p in pairs]
        else:
            texts, second = texts_of(cast(str | list[str], raw)), None
        return ClassifyQuery(texts, second, self.truncate, self.truncation_direction, self.backend)


class Prediction(BaseModel):
    label: str
    score: float
    scores: dict[str, float]


class Usage(BaseModel):
    tokens: int


class ClassifyResponse(BaseModel):
    model: str
    predictions: list[Prediction]
    usage: Usage


EMBEDDING_TYPE = (
    "float (default); int8 or uint8: one integer per component, bucketed on the model's ranges calibrated when it "
    "was built (sentence-transformers' quantize_embeddings; 400 `not_calibrated` for a model built without them, "
    "and with a `normalize` that is not the model's own); binary or ubinary: one bit per component (1: positive), "
    "packed 8 to an integer, as int8 or uint8.")


class EmbedRequest(_Request):
    model: str | None = Field(None, description="Served model NAME; optional when one embedder is served.")
    inputs: Inputs
    normalize: bool | None = Field(
        None, description="L2-normalize the vectors; default: as the model was trained (its Normalize module).",
        examples=[True])
    truncate: LongInputs = None
    truncation_direction: Direction = "right"
    prompt_name: str | None = Field(
        None, description="A prompt of the model (GET /v1/models shows them) prepended to every input; "
        "default: the model's default prompt, if any.", examples=["query"])
    dimensions: int | None = Field(
        None, ge=1, description="Keep the first N components, then normalize (models built with matryoshka "
        "dimensions; GET /v1/models lists them).", examples=[64])
    chunks: Chunks | None = None
    backend: Backend | None = None
    embedding_type: EmbeddingType = Field("float", description=EMBEDDING_TYPE, examples=["int8"])

    def to_query(self) -> EmbedQuery:
        return EmbedQuery(texts_of(self.inputs), prompt=Prompt(self.prompt_name), normalize=self.normalize,
                          dimensions=self.dimensions, truncate=self.truncate, direction=self.truncation_direction,
                          backend=self.backend, chunks=self.chunks, types=(self.embedding_type,))


class EmbedResponse(BaseModel):
    model: str
    embeddings: list[list[float]] | list[list[int]] | list[list[list[float]]] | list[list[list[int]]] = Field(
        description="One vector per input (with `chunks`, per input one vector per chunk): floats, or the integers "
        "of `embedding_type`.", examples=[[[-12, 87, 3]]])
    dimensions: int = Field(description="Components per vector (binary types pack 8 into each integer).")
    usage: Usage


class RerankRequest(_Request):
    """text-embeddings-inference's `POST /rerank`."""

    model: str | None = Field(None, description="Served reranker NAME; optional when one is served.",
                              examples=["bge-reranker"])
    query: Text = Field(examples=["What is Deep Learning?"])
    texts: Annotated[list[Text], Field(min_length=1)] = Field(
        description="The texts to rank against the query.", examples=[["Deep learning is ...", "Paris is ..."]])
    raw_scores: bool = Field(False, description="Return the model's logit instead of the sigmoid/softmax score.",
                             examples=[False])
    return_text: bool = Field(False, description="Repeat each text in its result.", examples=[True])
    truncate: bool = Field(True, description="Truncate pairs over max_seq_len (else 413).", examples=[True])
    truncation_direction: Direction = "right"
    backend: Backend | None = Field(None, description="Force a backend; default TensorRT when built.",
                                    examples=["onnx"])

    def to_query(self) -> RerankQuery:
        return RerankQuery(self.query, self.texts, raw_scores=self.raw_scores, truncate=self.truncate,
                           direction=self.truncation_direction, backend=self.backend)


class Rank(BaseModel):
    index: int = Field(description="Position of the text in the request.", examples=[1])
    score: float = Field(examples=[0.8427])
    text: str | None = Field(None, description="With return_text only.", examples=["Paris is ..."])


class Document(_Request):
    text: Text = Field(examples=["Paris is ..."])


class CohereRerankRequest(BaseModel):
    """Cohere/Jina-style `POST /v1/rerank` (fields of other API versions are ignored)."""

    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = Field(None, examples=["reranker"])
    query: Text = Field(examples=["What is Deep Learning?"])
    documents: Annotated[list[Text | Document], Field(min_length=1)] = Field(
        description="Texts, or objects with a `text`.", examples=[["Deep learning is ...", {"text": "Paris is ..."}]])
    top_n: int | None = Field(None, ge=1, description="Return the best N only (default: all).", examples=[3])
    return_documents: bool = Field(True, description="Include each document's text in its result.",
                                   examples=[False])

    @property
    def texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in self.documents]

    def to_query(self) -> RerankQuery:
        return RerankQuery(self.query, self.texts, top_n=self.top_n)


class RerankResult(BaseModel):
    index: int = Field(description="Position of the document in the request.", examples=[1])
    relevance_score: float = Field(examples=[0.8427])
    document: Document | None = Field(None, description="With return_documents only.",
                                      examples=[{"text": "Paris is ..."}])


class RerankUsage(BaseModel):
    total_tokens: int = Field(description="Tokens of every (query, document) pair.", examples=[91])


class CohereRerankResponse(BaseModel):
    id: str = Field(examples=["d474ecef3ea94a3593f9482a02e69f8a"])
    model: str = Field(examples=["bge-reranker"])
    results: list[RerankResult] = Field(description="Best first.", examples=[
        [{"index": 1, "relevance_score": 0.8427, "document": {"text": "Paris is ..."}}]])
    usage: RerankUsage = Field(examples=[{"total_tokens": 91}])


class TokenizeRequest(_Request):
    """text-embeddings-inference's `POST /tokenize`."""

    model: str | None = Field(None, description="Served model NAME; optional when one model is served.",
                              examples=["e5"])
    inputs: Inputs = Field(examples=["hello world"])
    add_special_tokens: bool = Field(True, examples=[False])
    prompt_name: str | None = Field(None, description="Tokenize with this prompt of the model prepended.",
                                    examples=["query"])


class Token(BaseModel):
    id: int = Field(examples=[59])
    text: str = Field(description="The input characters of the token (the token itself when special).",
                      examples=["hello"])
    special: bool = Field(description="A special token ([CLS], [SEP], ...), not from the input.", examples=[False])
    start: int | None = Field(description="Character offset in the input; null for special tokens.", examples=[0])
    stop: int | None = Field(description="Character offset just after the token; null for special tokens.",
                             examples=[5])


class DecodeRequest(_Request):
    """text-embeddings-inference's `POST /decode`."""

    model: str | None = Field(None, description="Served model NAME; optional when one model is served.",
                              examples=["e5"])
    ids: TokenIds | Annotated[list[TokenIds], Field(min_length=1)] = Field(examples=[[2, 59, 3]])
    skip_special_tokens: bool = Field(True, examples=[False])


class OpenAIEmbeddingRequest(BaseModel):
    """OpenAI `POST /v1/embeddings` body."""

    model_config = ConfigDict(extra="ignore", strict=True)  # OpenAI clients send fields of newer API versions

    input: Inputs | TokenIds | Annotated[list[TokenIds], Field(min_length=1)] = Field(
        description="Text(s), or token ids of this model's own tokenizer without special tokens (what "
        "/tokenize gives with add_special_tokens: false); one list per input.",
        examples=["hello world", [[59, 60]]],
    )
    model: str | None = None
    encoding_format: Literal["float", "base64"] = Field(
        "float", description="base64: each vector as little-endian float32 bytes (the openai client's default).",
        examples=["base64"])
    dimensions: int | None = Field(None, ge=1, description="Matryoshka models: keep the first N, renormalized.",
                                   examples=[64])
    input_type: Literal["query", "passage"] | None = Field(
        None, description="NVIDIA NIM style: applies the model's `query` or `passage` prompt (text input only).",
        examples=["query"])
    truncate: LongInputs = None
    chunks: Chunks | None = Field(None, description="Late chunking (text input): as /embed's `chunks`; `data` then "
                                  "holds one embedding per chunk, with its `input_index` and `chunk_index`.")
    embedding_type: EmbeddingType = Field(
        "float", description="NVIDIA NIM style (the openai client sends it with `extra_body`): " + EMBEDDING_TYPE
        + " The integers come as JSON numbers: with any type but float, send `encoding_format: float` (400 "
        "otherwise: the openai client decodes base64 as float32).", examples=["int8"])
    user: str | None = None

    def to_query(self, cut: bool = False) -> EmbedQuery:
        """Normalized vectors (OpenAI's are); `cut`: texts over the character limit are cut there, not refused."""
        raw, prompt, types = self.input, Prompt(input_type=self.input_type), (self.embedding_type,)
        if isinstance(raw, list) and raw and isinstance(raw[0], (int, list)):
            rows = [cast(list[int], raw)] if isinstance(raw[0], int) else cast(list[list[int]], raw)
            return EmbedQuery([], token_ids=rows, prompt=prompt, normalize=True, dimensions=self.dimensions,
                              truncate=self.truncate, chunks=self.chunks, types=types)
        return EmbedQuery(texts_of(cast(str | list[str], raw)), prompt=prompt, normalize=True,
                          dimensions=self.dimensions, truncate=self.truncate, cut=cut, chunks=self.chunks, types=types)


class OpenAIEmbedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | list[int] | str
    input_index: int | None = Field(None, description="With `chunks`: the input this chunk's vector is of.")
    chunk_index: int | None = Field(None, description="With `chunks`: which of the input's chunks it is.")


class OpenAIUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class OpenAIEmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[OpenAIEmbedding]
    model: str
    usage: OpenAIUsage


class ModelCard(BaseModel):
    """One served model in `GET /v1/models` (OpenAI list shape plus our fields)."""

    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "gateway"
    task: Literal["classify", "embed", "rerank", "sparse-embed"]
    backends: list[Backend]
    default_backend: Backend
    onnx_accelerator: OnnxAccelerator | None = Field(
        description="How Triton's onnxruntime backend runs the `onnx` backend's model step (builder "
        "`--onnx-accelerator`): `tensorrt` (ONNX Runtime's TensorRT provider, engines compiled at load and "
        "cached), `cuda` (its CUDA provider with tuned options) or `none` (no accelerator settings: CPU "
        "builds, the python runtime, repositories built before this field). null without an `onnx` backend.",
        examples=["cuda"],
    )
    max_tokens: int
    max_batch_size: int
    pipeline: Literal["scheduler", "ensemble"] = Field(
        description="scheduler: the gateway tokenizes and batches by length; ensemble: Triton's ensemble does it."
    )
    labels: list[str] | None = None
    pairs: bool = Field(False, description="Takes [text, text_pair] pairs (rerankers, pair classifiers).",
                        examples=[False])
    dimensions: int | None = None
    pooling: str | None = None
    normalize: bool | None = Field(None, description="embed: the default of `normalize`.", examples=[True])
    prompts: dict[str, str] | None = Field(None, description="embed: prompt name -> prefix.",
                                           examples=[{"query": "query: ", "passage": "passage: "}])
    default_prompt_name: str | None = Field(None, examples=["passage"])
    matryoshka_dimensions: list[int] | None = Field(
        None, description="embed: the `dimensions` a request may ask for.", examples=[[16, 32]])
    embedding_types: list[str] | None = Field(
        None, description="embed: the `embedding_type`s it serves; int8 and uint8 when its ranges were calibrated "
        "at build.", examples=[["float", "int8", "uint8", "binary", "ubinary"]])
    token_outputs: list[str] = Field(
        default_factory=list, description="Per-token outputs of the model step: `token_embeddings` (/embed_all), "
        "`token_weights` (bge-m3 lexical weights, /embed_sparse), `colbert_vectors` (/embed_multi_vector). "
        "sparse-embed models answer /embed_sparse from their vocabulary row.",
        examples=[["token_embeddings", "token_weights", "colbert_vectors"]])


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["ok"]


FamilyStateName = Literal["ready", "loading", "unloading", "unloaded", "failed", "invalid"]


class Readiness(BaseModel):
    """`GET /readyz`: 200 "ready", or 503 "not ready" (Triton down, no model, or a model not loaded)."""

    status: Literal["ready", "not ready"]
    models: list[str]
    families: dict[str, FamilyStateName] = Field(
        default_factory=dict, description="Every model family in Triton's repository and its state: `ready` "
        "(served), `loading`, `unloading`, `unloaded`, `failed` (a load failed), `invalid` (not served: it "
        "does not follow the repository contract).", examples=[{"m3e": "ready", "kcbert": "unloaded"}])
    triton: dict[str, str] = Field(
        default_factory=dict, description="How the gateway reaches Triton, each `ok`, `off` or what is wrong: "
        "`grpc` (GATEWAY_TRITON_URL: health, the repository, inference whose tensors are not all in shared memory), "
        "`repository` (its index, with GATEWAY_TRITON_REPOSITORY_KEY_FILE's key), `http` (GATEWAY_TRITON_HTTP_URL: "
        "inference whose tensors are all in shared memory), `shm` (the regions). A wrong HTTP endpoint or regions "
        "Triton cannot open leave the gateway ready: those calls go over gRPC.",
        examples=[{"grpc": "ok", "repository": "ok", "http": "ok", "shm": "ok"}])
    reason: str | None = Field(None, description="Why the gateway is not ready (only then).",
                               examples=["Triton does not answer on GATEWAY_TRITON_URL"])
    checks: dict[str, str] | None = Field(
        None, description="`?deep=1`: per model, `ok` or why a one-token request through it failed.",
        examples=[{"reranker": "ok"}])


class ErrorBody(BaseModel):
    type: str
    message: str


class ErrorResponse(BaseModel):
    error: ErrorBody


class FamilyEntry(BaseModel):
    """One version of one repository entry, as Triton's repository index lists it."""

    name: str
    version: str
    state: str = Field(description="Triton's state: READY, LOADING, UNLOADING, UNAVAILABLE, or empty (never loaded).")
    reason: str = ""


class ModelFamily(BaseModel):
    """`/admin/models`: a model NAME's tokenizer, steps and ensembles and the state they add up to."""

    name: str
    state: FamilyStateName
    reason: str = ""
    served: bool = Field(description="Whether the API serves it now (it is in /v1/models).")
    entries: list[FamilyEntry]


class FamilyList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelFamily]
