"""Per-token vectors: `/embed_all` (the encoder's last hidden state for every token of the truncated
encoding, special tokens included, not normalized: TEI's shape, what late chunking builds on) and
`/embed_multi_vector` (ColBERT vectors of models built with bge-m3's `colbert_linear.pt`:
normalize(colbert_linear(hidden)) per token, without the first (CLS) token, as
`BGEM3FlagModel.encode(return_colbert_vecs=True)` gives them).

A request of a few short texts would make an answer of tokens x floats per token: GATEWAY_MAX_TOKEN_VALUES bounds
what one answer may hold, checked before inference (413 `answer_too_large`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from contract import COLBERT_VECTORS, TOKEN_EMBEDDINGS, TruncationDirection
from gateway.errors import ErrorType, GatewayError
from gateway.service.inference import Inference, Inputs
from gateway.service.prompts import prompt_text, with_prompt
from gateway.service.registry import Backend, ServedModel
from gateway.service.serving import Call, Service


@dataclass(frozen=True, slots=True)
class _PerToken:
    """A per-token output: its route, which models serve it, what it is, and the leading tokens left out."""

    route: str
    served: str
    what: str
    first: int


_OUTPUTS = {
    TOKEN_EMBEDDINGS: _PerToken("/embed_all", "embedders built by this builder (rebuild older ones)",
                                "per-token hidden states", 0),
    COLBERT_VECTORS: _PerToken("/embed_multi_vector", "embedders built with bge-m3's colbert_linear.pt",
                               "ColBERT vectors", 1),  # the CLS token's vector is left out, as FlagEmbedding does
}


def has_output(model: ServedModel, output: str) -> bool:
    return model.task == "embed" and model.endpoint(None).token_width(output) is not None


def leading_tokens_left_out(output: str) -> int:
    """How many leading tokens the per-token `output`'s answer leaves out (ColBERT: the CLS token)."""
    return _OUTPUTS[output].first


@dataclass(frozen=True, slots=True)
class TokenVectors:
    model: str
    vectors: list[np.ndarray]  # [tokens_i, dim] float32 per input, in order
    tokens: int  # billed


class MultiVectorService(Service):
    """Vectors per token: /embed_all (TOKEN_EMBEDDINGS) and /embed_multi_vector (COLBERT_VECTORS)."""

    async def embed_tokens(
        self, call: Call, output: str, model: str | None, texts: list[str], *, prompt_name: str | None = None,
        truncate: bool = True, direction: TruncationDirection = "right", backend: Backend | None = None,
    ) -> TokenVectors:
        """The per-token `output` of every text; `model` None: the only served model that returns it."""
        spec = _OUTPUTS[output]
        self.check_texts(call, texts)
        served = await self.model_with(call, model, lambda m: has_output(m, output), spec.what)
        if not has_output(served, output):  # 424
            raise GatewayError(ErrorType.OUTPUT_NOT_AVAILABLE, f"model {served.name!r} has no {output} output: "
                               f"{spec.route} serves {spec.served}")
        inputs = Inputs(with_prompt(texts, prompt_text(served, prompt_name)), None, direction,
                        urgency=self.urgency(call))
        await check_answer_size(self.inference, self.max_token_values, served, output, inputs)
        result = await self.within_deadline(call, lambda deadline: self.inference.run(
            served, inputs, truncate=truncate, backend=backend, deadline=deadline, outputs=(output,)))
        return TokenVectors(served.name, [vectors[spec.first:] for vectors in result.per_text], result.tokens)



async def check_answer_size(inference: Inference, limit: int, model: ServedModel, output: str, inputs: Inputs) -> None:
    """413 `answer_too_large` when the per-token `output` of `inputs` would hold more than `limit` floats
    (GATEWAY_MAX_TOKEN_VALUES): every input's tokens after truncation (less the leading ones left out) x the
    output's floats per token. Bounded by max_seq_len tokens per input first; the texts are tokenized to count only
    when that bound is over."""
    width, first = model.endpoint(None).token_width(output) or 1, _OUTPUTS[output].first
    per_input = max(model.max_seq_len - first, 0)
    tokenizer = inference.tokenizer_for(model)
    if len(inputs) * per_input * width <= limit or tokenizer is None:  # None: the pipeline answers 501
        return
    counts = (await tokenizer.encode(inputs.texts, None, inputs.direction)).num_tokens
    tokens = int((np.minimum(counts, model.max_seq_len) - first).clip(min=0).sum())
    if tokens * width > limit:
        raise GatewayError(ErrorType.ANSWER_TOO_LARGE, f"the answer would hold {tokens * width:,} floats ({tokens:,} "
                           f"tokens x {width} per token), over the {limit:,} one request may ask for "
                           f"(GATEWAY_MAX_TOKEN_VALUES): send at most {limit // width:,} tokens per request, "
                           f"e.g. {max(1, limit // (width * max(per_input, 1)))} texts of {model.max_seq_len} tokens")
