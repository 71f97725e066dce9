"""Per-token vectors: `/embed_all` (the encoder's last hidden state for every token of the truncated
encoding, special tokens included, not normalized: TEI's shape, what late chunking builds on) and
`/embed_multi_vector` (ColBERT vectors of models built with bge-m3's `colbert_linear.pt`:
normalize(colbert_linear(hidden)) per token, without the first (CLS) token, as
`BGEM3FlagModel.encode(return_colbert_vecs=True)` gives them)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from contract import COLBERT_VECTORS, TOKEN_EMBEDDINGS, TruncationDirection
from gateway.errors import ErrorType, GatewayError
from gateway.service.inference import Inputs
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


def _has(model: ServedModel, output: str) -> bool:
    return model.task == "embed" and model.endpoint(None).token_width(output) is not None


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
        served = await self.model_with(call, model, lambda m: _has(m, output), spec.what)
        if not _has(served, output):  # 424
            raise GatewayError(ErrorType.OUTPUT_NOT_AVAILABLE, f"model {served.name!r} has no {output} output: "
                               f"{spec.route} serves {spec.served}")
        inputs = Inputs(with_prompt(texts, prompt_text(served, prompt_name)), None, direction,
                        urgency=self.urgency(call))
        result = await self.within_deadline(call, lambda deadline: self.inference.run(
            served, inputs, truncate=truncate, backend=backend, deadline=deadline, output=output))
        return TokenVectors(served.name, [vectors[spec.first:] for vectors in result.per_text], result.tokens)
