"""Request and response models of text-embeddings-inference's HTTP API, served per model at /tei/{model}.

The shapes are TEI 1.x's (router/src/http/types.rs and router/src/lib.rs of TEI_VERSION, and its OpenAPI
document): bare arrays for /embed, /predict, /rerank, /tokenize and /decode, `Info` for /info, and the error
body `{"error", "error_type"}`. As in TEI, unknown request fields are ignored; field types are strict.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, RootModel

from contract import TruncationDirection
from gateway.api.schemas import FloatMatrix, Token, texts_of
from gateway.errors import invalid
from gateway.service.classify import ClassifyQuery
from gateway.service.embed import EmbedQuery
from gateway.service.prompts import Prompt
from gateway.service.rerank import RerankQuery

TEI_VERSION = "1.9.3"  # the TEI release whose HTTP API these models follow; /info reports it as `version`

TeiErrorType = Literal["Unhealthy", "Backend", "Overloaded", "Validation", "Tokenizer", "Empty"]


class _TeiRequest(BaseModel):
    """TEI's request bodies: unknown fields are ignored (serde's default), types are strict."""

    model_config = ConfigDict(extra="ignore", strict=True)


class _TeiResponse(BaseModel):
    """Responses are built field by field and checked: a field TEI does not have is a bug."""

    model_config = ConfigDict(extra="forbid")


Direction = Annotated[
    Literal["right", "left", "Right", "Left"],
    Field(description="Which end of an over-long input is cut off (TEI accepts both spellings).", examples=["right"]),
]
Truncate = Annotated[
    bool | None,
    Field(description="Truncate inputs over max_input_length tokens (default: true, /info's auto_truncate); "
          "false: 422 for an input that is too long.", examples=[True]),
]
PromptName = Annotated[
    str | None,
    Field(description="A prompt of the model (sentence-transformers' `prompts`) prepended to every input; "
          "default: the model's default prompt, if any.", examples=["query"]),
]
Texts = Annotated[
    str | list[str],
    Field(description="One text or a list (an empty text or list: 400 `Empty`).", examples=["What is Deep Learning?"]),
]
Sequence = Annotated[list[str], Field(min_length=1, max_length=2)]
PredictInputs = Annotated[
    str | Sequence | Annotated[list[Sequence], Field(min_length=1)],
    Field(description="One text, one pair [text, text_pair], or a batch of [text] and [text, text_pair] lists.",
          examples=["I like you", [["A man is eating.", "Someone eats food."]]]),
]
TokenId = Annotated[int, Field(ge=0)]


def direction(value: str) -> TruncationDirection:
    return "left" if value.lower() == "left" else "right"


class TeiEmbedRequest(_TeiRequest):
    """`POST /tei/{model}/embed`, and `POST /tei/{model}` for an embedding model."""

    inputs: Texts
    truncate: Truncate = None
    truncation_direction: Direction = "right"
    prompt_name: PromptName = None
    normalize: bool = Field(True, description="L2-normalize the vectors (TEI's default: true).", examples=[True])
    dimensions: int | None = Field(
        None, ge=1, description="Keep the first N components, then normalize: one of the dimensions the model "
        "was built for (GET /v1/models lists them).", examples=[16])

    def to_query(self) -> EmbedQuery:
        """TEI truncates (and cuts texts over the character limit) unless `truncate` is false."""
        truncate = self.truncate is not False
        return EmbedQuery(texts_of(self.inputs), prompt=Prompt(self.prompt_name), normalize=self.normalize,
                          dimensions=self.dimensions, truncate=truncate, direction=direction(self.truncation_direction),
                          cut=truncate)


class TeiPredictRequest(_TeiRequest):
    """`POST /tei/{model}/predict`, and `POST /tei/{model}` for a classifier."""

    inputs: PredictInputs
    truncate: Truncate = None
    truncation_direction: Direction = "right"
    raw_scores: bool = Field(False, description="The logits instead of the softmax probabilities.", examples=[False])
    parameters: dict[str, Any] | None = Field(
        None, description="The Hugging Face Inference API's task parameters (huggingface_hub's "
        "`text_classification` sends them): their values are ignored. On `POST /tei/{model}` a request that has "
        "them gets that API's answer, one list of predictions per input.", examples=[{}])

    @property
    def single(self) -> bool:
        """One input (a text or a pair), not a batch."""
        return isinstance(self.inputs, str) or isinstance(self.inputs[0], str)

    def to_query(self) -> ClassifyQuery:
        """Texts and, for pairs, second texts; a 400 for a batch that mixes both."""
        raw = self.inputs
        rows = [[raw]] if isinstance(raw, str) else [cast(list[str], raw)] if self.single else cast(list[list[str]], raw)
        if len({len(r) for r in rows}) > 1:
            raise invalid("a batch mixes single texts and pairs: send all [text] or all [text, text_pair]")
        truncate = self.truncate is not False
        return ClassifyQuery([r[0] for r in rows], [r[1] for r in rows if len(r) == 2] or None, truncate,
                             direction(self.truncation_direction), raw_scores=self.raw_scores, cut=truncate)


class TeiRerankRequest(_TeiRequest):
    """`POST /tei/{model}/rerank`, and `POST /tei/{model}` for a reranker."""

    query: str = Field(examples=["What is Deep Learning?"])
    texts: list[str] = Field(description="The texts to rank (an empty list: 400 `Empty`).",
                             examples=[["Deep Learning is ...", "Paris is ..."]])
    truncate: Truncate = None
    truncation_direction: Direction = "right"
    raw_scores: bool = Field(False, description="The model's logit instead of its score.", examples=[False])
    return_text: bool = Field(False, description="Repeat each text in its result.", examples=[True])

    def to_query(self) -> RerankQuery:
        truncate = self.truncate is not False
        return RerankQuery(self.query, self.texts, raw_scores=self.raw_scores, truncate=truncate,
                           direction=direction(self.truncation_direction), cut=truncate)


class TeiEmbedSparseRequest(_TeiRequest):
    """`POST /tei/{model}/embed_sparse`, and `POST /tei/{model}` for a SPLADE model."""

    inputs: Texts
    truncate: Truncate = None
    truncation_direction: Direction = "right"
    prompt_name: PromptName = None


class TeiEmbedAllRequest(TeiEmbedSparseRequest):
    """`POST /tei/{model}/embed_all`."""


class TeiSimilarityInput(_TeiRequest):
    source_sentence: str = Field(description="The text the others are compared with.",
                                 examples=["What is Deep Learning?"])
    sentences: list[str] = Field(description="The texts compared with it (an empty list: 400 `Empty`).",
                                 examples=[["What is Machine Learning?"]])


class TeiSimilarityParameters(_TeiRequest):
    truncate: Truncate = None
    truncation_direction: Direction = "right"
    prompt_name: PromptName = None


class TeiSimilarityRequest(_TeiRequest):
    """`POST /tei/{model}/similarity`, and `POST /tei/{model}` for an embedding model when `inputs` is an object
    (huggingface_hub's `sentence_similarity`)."""

    inputs: TeiSimilarityInput
    parameters: TeiSimilarityParameters | None = None

    def to_query(self) -> EmbedQuery:
        """The source sentence first, then the sentences, as unit vectors."""
        p = self.parameters or TeiSimilarityParameters()
        truncate = p.truncate is not False
        return EmbedQuery([self.inputs.source_sentence, *self.inputs.sentences], prompt=Prompt(p.prompt_name),
                          normalize=True, truncate=truncate, direction=direction(p.truncation_direction), cut=truncate)


class TeiTokenizeRequest(_TeiRequest):
    """`POST /tei/{model}/tokenize`."""

    inputs: Texts
    add_special_tokens: bool = Field(True, examples=[True])
    prompt_name: str | None = Field(None, description="Tokenize with this prompt of the model prepended.",
                                    examples=["query"])


class TeiDecodeRequest(_TeiRequest):
    """`POST /tei/{model}/decode`."""

    ids: list[TokenId] | list[list[TokenId]] = Field(description="Token ids, or a list of them.",
                                                     examples=[[2, 59, 60, 3]])
    skip_special_tokens: bool = Field(True, examples=[True])


class TeiVertexRequest(_TeiRequest):
    """`POST /tei/{model}/vertex`, Google Vertex AI's prediction body."""

    instances: list[dict[str, Any]] = Field(
        description="Each one the body of the route the model's kind takes, as TEI's `POST /`: /embed, "
        "/embed_sparse (SPLADE), /predict (classifiers), /rerank; one with `query` and `texts` is a /rerank body.",
        examples=[[{"inputs": "What is Deep Learning?"}, {"inputs": ["Paris", "Berlin"], "normalize": False}]],
    )


class TeiEmbedResponse(RootModel[FloatMatrix]):
    """One vector per input, also for a single text."""


class TeiSparseValue(_TeiResponse):
    index: int = Field(description="A vocabulary id.", examples=[2003])
    value: float = Field(examples=[0.71])


class TeiEmbedSparseResponse(RootModel[list[list[TeiSparseValue]]]):
    """One list per input of its non-zero values, ascending index."""


class TeiEmbedAllResponse(RootModel[list[FloatMatrix]]):
    """Per input, the last hidden state of every token of its (truncated) encoding, special tokens included."""


class TeiSimilarityResponse(RootModel[list[float]]):
    """The cosine similarity of `source_sentence` with each of `sentences`, in order."""


class TeiPrediction(_TeiResponse):
    score: float = Field(examples=[0.5])
    label: str = Field(examples=["positive"])


class TeiPredictResponse(RootModel[list[TeiPrediction] | list[list[TeiPrediction]]]):
    """Every label, best first: one list for a single input, a list of them for a batch."""


class TeiRank(_TeiResponse):
    index: int = Field(description="Position of the text in the request.", examples=[1])
    text: str | None = Field(None, description="With return_text only (absent otherwise).", examples=["Paris is ..."])
    score: float = Field(examples=[0.8427])


class TeiRerankResponse(RootModel[list[TeiRank]]):
    """Best first."""


class TeiVertexResponse(_TeiResponse):
    predictions: list[TeiEmbedResponse | TeiEmbedSparseResponse | TeiPredictResponse | TeiRerankResponse] = Field(
        description="Each instance's answer, in order: its route's answer.")


class TeiTokenizeResponse(RootModel[list[list[Token]]]):
    """The tokens of every input."""


class TeiDecodeResponse(RootModel[list[str]]):
    """One text per list of ids."""


class TeiEmbeddingModel(_TeiResponse):
    pooling: str = Field(description="cls, mean, last_token, or splade for a SPLADE model.", examples=["mean"])


class TeiClassifierModel(_TeiResponse):
    id2label: dict[str, str] = Field(examples=[{"0": "negative", "1": "positive"}])
    label2id: dict[str, int] = Field(examples=[{"negative": 0, "positive": 1}])


class TeiEmbeddingType(_TeiResponse):
    embedding: TeiEmbeddingModel


class TeiClassifierType(_TeiResponse):
    classifier: TeiClassifierModel


class TeiRerankerType(_TeiResponse):
    reranker: TeiClassifierModel


class TeiInfo(_TeiResponse):
    """`GET /tei/{model}/info`: TEI's `Info`, filled in from the served model and the gateway's settings."""

    model_id: str = Field(description="What the model was built from (a hub id or a path).",
                          examples=["intfloat/multilingual-e5-small"])
    model_sha: str | None = Field(None, examples=[None])
    model_dtype: str = Field(examples=["float16"])
    served_model_name: str = Field(description="The model NAME in /tei/{model} and in `model` fields.",
                                   examples=["e5"])
    model_type: TeiEmbeddingType | TeiClassifierType | TeiRerankerType
    max_concurrent_requests: int = Field(description="GATEWAY_MAX_IN_FLIGHT (per worker).", examples=[512])
    max_input_length: int = Field(description="The model's max_seq_len, in tokens.", examples=[512])
    max_batch_tokens: int = Field(description="GATEWAY_MAX_BATCH_TOKENS.", examples=[16384])
    max_batch_requests: int | None = Field(description="Most texts in one batch of the model step.", examples=[64])
    max_client_batch_size: int = Field(description="GATEWAY_MAX_INPUTS.", examples=[2048])
    auto_truncate: bool = Field(description="`truncate` when a request does not say.", examples=[True])
    tokenization_workers: int = Field(description="GATEWAY_WORKERS (each tokenizes in one thread).", examples=[1])
    version: str = Field(description="The TEI release whose HTTP API these routes follow.", examples=[TEI_VERSION])
    sha: str | None = Field(None, examples=[None])
    docker_label: str | None = Field(None, examples=[None])


class TeiError(_TeiResponse):
    """Every error under /tei/ (but its OpenAI routes'): TEI's shape and, where TEI has one, its status code."""

    error: str = Field(examples=["`inputs` cannot be empty"])
    error_type: TeiErrorType = Field(examples=["Empty"])


class TeiOpenAIError(_TeiResponse):
    """An error of TEI's OpenAI routes (/tei/{model}/v1/embeddings, /embeddings): TEI's OpenAICompatErrorResponse,
    the message, the status code and TEI's error type."""

    message: str = Field(examples=["`inputs` cannot be empty"])
    code: int = Field(examples=[400])
    type: TeiErrorType = Field(examples=["Empty"])
