"""Request and response models of the routes of sparse, per-token and several outputs (api/vectors.py):
`/embed_sparse`, `/embed_all`, `/embed_multi_vector` in text-embeddings-inference's shapes, and `/encode`."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, Field

from contract import ApiBackend as Backend
from gateway.api.schemas import Direction, Inputs, Usage, _Request, texts_of
from gateway.service.encode import ENCODE_OUTPUTS, EncodeOutput, EncodeQuery


class _TeiOutputRequest(_Request):
    """The fields of text-embeddings-inference's `/embed_sparse` and `/embed_all` (plus `backend`)."""

    inputs: Inputs = Field(examples=[["what is deep learning"]])
    truncate: bool = Field(True, description="Truncate texts over max_seq_len (else 413).")
    truncation_direction: Direction = "right"
    prompt_name: str | None = Field(None, description="A prompt of the model prepended to every input; default: "
                                    "the model's default prompt, if any.", examples=["query"])
    backend: Backend | None = None


class EmbedSparseRequest(_TeiOutputRequest):
    """text-embeddings-inference's `POST /embed_sparse` (plus `model` and `backend`)."""

    model: str | None = Field(None, description="Served model NAME; optional when one model with a sparse output "
                              "is served.", examples=["splade"])


class SparseValue(BaseModel):
    index: int = Field(description="Vocabulary index (token id).", examples=[2129])
    value: float = Field(description="Its weight (non-zero).", examples=[1.37])


class EmbedAllRequest(_TeiOutputRequest):
    """text-embeddings-inference's `POST /embed_all` (plus `model` and `backend`); also `/embed_multi_vector`."""

    model: str | None = Field(None, description="Served model NAME; optional when one model with per-token "
                              "outputs is served.", examples=["bge-m3"])


class EncodeRequest(_TeiOutputRequest):
    """`POST /encode`: several outputs of one forward pass (bge-m3's dense, sparse and ColBERT outputs)."""

    model: str | None = Field(None, description="Served model NAME; optional when one model with any of the outputs "
                              "is served.", examples=["bge-m3"])
    outputs: Annotated[list[EncodeOutput], Field(min_length=1)] = Field(
        list(ENCODE_OUTPUTS), description="What to compute, from one execution of the model: `dense` (what /embed "
        "answers), `sparse` (/embed_sparse), `multi_vector` (/embed_multi_vector). A model without one of them: 424.",
        examples=[["dense", "sparse"]])
    normalize: bool | None = Field(None, description="dense: L2-normalize; default: as the model was trained.")
    dimensions: int | None = Field(None, ge=1, description="dense: keep the first N components, then normalize "
                                   "(matryoshka models).")

    def to_query(self) -> EncodeQuery:
        return EncodeQuery(texts_of(self.inputs), tuple(dict.fromkeys(self.outputs)), self.prompt_name,
                           self.normalize, self.dimensions, self.truncate, self.truncation_direction, self.backend)


class EncodeResponse(BaseModel):
    """The outputs asked for, each in its own route's shape, one entry per input in order (null: not asked for)."""

    model: str
    dense: list[list[float]] | None = Field(None, description="As /embed's `embeddings`.")
    sparse: list[list[SparseValue]] | None = Field(None, description="As /embed_sparse's answer.")
    multi_vector: list[list[list[float]]] | None = Field(None, description="As /embed_multi_vector's answer.")
    usage: Usage
