"""Request and response models of the HTTP API (pydantic v2)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

Text = Annotated[str, Field(min_length=1)]
Inputs = Annotated[
    Text | Annotated[list[Text], Field(min_length=1)], Field(description="One non-empty text or a non-empty list.")
]
Backend = Literal["onnx", "trt"]


class _Request(BaseModel):
    """Request bodies are strict: booleans are JSON booleans, integers JSON integers, no unknown fields."""

    model_config = ConfigDict(extra="forbid", strict=True)


class ClassifyRequest(_Request):
    model: str | None = Field(None, description="Served model NAME; optional when one classifier is served.")
    inputs: Inputs
    truncate: bool = Field(True, description="Truncate texts over max_seq_len (else 413).")
    backend: Backend | None = Field(None, description="Force a backend; default TensorRT when built.")


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


class EmbedRequest(_Request):
    model: str | None = Field(None, description="Served model NAME; optional when one embedder is served.")
    inputs: Inputs
    normalize: bool = True
    truncate: bool = True
    backend: Backend | None = None


class EmbedResponse(BaseModel):
    model: str
    embeddings: list[list[float]]
    dimensions: int
    usage: Usage


class OpenAIEmbeddingRequest(BaseModel):
    """OpenAI `POST /v1/embeddings` body (token-array inputs are not supported)."""

    model_config = ConfigDict(extra="ignore", strict=True)  # OpenAI clients send fields of newer API versions

    input: Inputs
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)
    user: str | None = None


class OpenAIEmbedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


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
    task: Literal["classify", "embed"]
    backends: list[Backend]
    default_backend: Backend
    max_tokens: int
    max_batch_size: int
    pipeline: Literal["scheduler", "ensemble"] = Field(
        description="scheduler: the gateway tokenizes and batches by length; ensemble: Triton's ensemble does it."
    )
    labels: list[str] | None = None
    dimensions: int | None = None
    pooling: str | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Health(BaseModel):
    status: Literal["ok"]


class Readiness(BaseModel):
    """`GET /readyz`: 200 "ready", or 503 "not ready" (Triton down, no model, or a model not loaded)."""

    status: Literal["ready", "not ready"]
    models: list[str]


class ErrorBody(BaseModel):
    type: str
    message: str


class ErrorResponse(BaseModel):
    error: ErrorBody
