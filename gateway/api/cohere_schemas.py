"""Request and response models of Cohere's v2 API (`POST /v2/embed`, `POST /v2/rerank`), as the cohere SDK's
own types define them (cohere.v2 raw_client, EmbedByTypeResponse, V2RerankResponse, ApiMeta).

Requests ignore fields this gateway does not use (the SDK sends fields of newer API versions, `priority`,
`max_tokens_per_doc`); field types are strict. Errors keep the gateway's `{"error": {"type", "message"}}`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gateway.api.schemas import FloatMatrix, Text
from gateway.service.embed import EmbedQuery
from gateway.service.prompts import Prompt
from gateway.service.rerank import RerankQuery

CohereEmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary", "base64"]


class _CohereRequest(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class _CohereResponse(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class CohereEmbedV2Request(_CohereRequest):
    """Cohere v2 `POST /v2/embed` (text only)."""

    model: str | None = Field(None, description="Served embedder NAME; optional when one is served.", examples=["e5"])
    texts: Annotated[list[Text], Field(min_length=1)] | None = Field(
        None, description="The texts to embed.", examples=[["how do I bake bread"]])
    input_type: Literal["search_document", "search_query", "classification", "clustering", "image"] | None = Field(
        None, description="Applies the model's prompt of that name (`search_query` also finds `query`, "
        "`search_document` also `document`, `passage`); a model without one uses its default prompt, if any. "
        "`image`: 400.", examples=["search_query"])
    embedding_types: Annotated[list[CohereEmbeddingType], Field(min_length=1)] | None = Field(
        None, description="float (default), base64 (little-endian float32), int8 and uint8 (one integer per "
        "component, on the model's ranges calibrated when it was built; 400 `not_calibrated` for a model built "
        "without them), binary and ubinary (one bit per component, 1 when positive, packed 8 to a byte, as int8 or "
        "uint8).", examples=[["float", "int8"]])
    truncate: Literal["NONE", "START", "END"] | None = Field(
        None, description="END (default) cuts the end of an over-long text, START its start; NONE: 413 instead.",
        examples=["END"])
    output_dimension: int | None = Field(
        None, ge=1, description="Keep the first N components, renormalized: one of the dimensions the model was "
        "built for (GET /v1/models lists them).", examples=[16])
    max_tokens: int | None = Field(
        None, ge=1, description="At least the model's max_seq_len (texts are truncated there); lower: 400.",
        examples=[512])
    images: list[Any] | None = Field(None, description="Not supported (text models): 400.", examples=[None])
    inputs: list[Any] | None = Field(None, description="Not supported (multimodal inputs): 400; send `texts`.",
                                     examples=[None])

    @model_validator(mode="after")
    def _something_to_embed(self) -> Self:
        if self.texts is None and self.images is None and self.inputs is None:
            raise ValueError("texts: field required")
        return self

    def to_query(self) -> EmbedQuery:
        """Unit-length vectors (Cohere's are)."""
        types = dict.fromkeys("float" if t == "base64" else t for t in self.embedding_types or ["float"])
        return EmbedQuery(self.texts or [], prompt=Prompt(input_type=self.input_type, cohere=True), normalize=True,
                          dimensions=self.output_dimension, truncate=self.truncate != "NONE",
                          direction="left" if self.truncate == "START" else "right", types=tuple(types))


class CohereEmbeddings(_CohereResponse):
    """The requested embedding types only, one entry per text each."""

    float_: FloatMatrix | None = Field(None, alias="float", description="Float embeddings.",
                                       examples=[[[-0.2441, -0.1442, 0.2649]]])
    int8: list[list[Annotated[int, Field(ge=-128, le=127)]]] | None = Field(
        None, description="One integer per component, on the model's calibrated ranges.", examples=[[[-87, -51, 99]]])
    uint8: list[list[Annotated[int, Field(ge=0, le=255)]]] | None = Field(
        None, description="One integer per component, on the model's calibrated ranges.", examples=[[[41, 77, 227]]])
    base64: list[str] | None = Field(None, description="Little-endian float32 bytes of each vector, base64.",
                                     examples=[["Cv55vsyqE74pooc+"]])
    binary: list[list[Annotated[int, Field(ge=-128, le=127)]]] | None = Field(
        None, description="One bit per component (1: positive), packed, as int8.", examples=[[[-54, 17]]])
    ubinary: list[list[Annotated[int, Field(ge=0, le=255)]]] | None = Field(
        None, description="One bit per component (1: positive), packed, as uint8.", examples=[[[74, 145]]])


class CohereApiVersion(_CohereResponse):
    version: Literal["2"] = "2"


class CohereBilledUnits(_CohereResponse):
    input_tokens: int = Field(description="Tokens of every input, as the gateway counts usage.", examples=[22])


class CohereMeta(_CohereResponse):
    api_version: CohereApiVersion = Field(default_factory=CohereApiVersion)
    billed_units: CohereBilledUnits


class CohereEmbedV2Response(_CohereResponse):
    id: str = Field(description="The request id (X-Request-ID).", examples=["d474ecef3ea94a3593f9482a02e69f8a"])
    embeddings: CohereEmbeddings
    texts: list[str] = Field(description="The texts, as sent.", examples=[["how do I bake bread"]])
    meta: CohereMeta
    response_type: Literal["embeddings_by_type"] = "embeddings_by_type"


class CohereRerankV2Request(_CohereRequest):
    """Cohere v2 `POST /v2/rerank`."""

    model: str | None = Field(None, description="Served reranker NAME; optional when one is served.",
                              examples=["bge-reranker"])
    query: Text = Field(examples=["What is Deep Learning?"])
    documents: Annotated[list[Text], Field(min_length=1)] = Field(
        description="The texts to rank.", examples=[["Deep learning is ...", "Paris is ..."]])
    top_n: int | None = Field(None, ge=1, description="Return the best N only (default: all).", examples=[3])

    def to_query(self) -> RerankQuery:
        return RerankQuery(self.query, self.documents, top_n=self.top_n)


class CohereRerankV2Result(_CohereResponse):
    index: int = Field(description="Position of the document in the request.", examples=[1])
    relevance_score: float = Field(examples=[0.8427])


class CohereRerankV2Response(_CohereResponse):
    id: str = Field(description="The request id (X-Request-ID).", examples=["d474ecef3ea94a3593f9482a02e69f8a"])
    results: list[CohereRerankV2Result] = Field(description="Best first.",
                                                examples=[[{"index": 1, "relevance_score": 0.8427}]])
    meta: CohereMeta
