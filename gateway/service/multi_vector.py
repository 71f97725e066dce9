"""Per-token vectors: `/embed_all` (the encoder's last hidden state for every token of the truncated
encoding, special tokens included, not normalized: TEI's shape, what late chunking builds on) and
`/embed_multi_vector` (ColBERT vectors of models built with bge-m3's `colbert_linear.pt`:
normalize(colbert_linear(hidden)) per token, without the first (CLS) token, as
`BGEM3FlagModel.encode(return_colbert_vecs=True)` gives them)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

from contract import COLBERT_VECTORS, TOKEN_EMBEDDINGS, TruncationDirection
from gateway.errors import ErrorType, GatewayError
from gateway.service.inference import Inference, Inputs
from gateway.service.prompts import prompt_text, with_prompt
from gateway.service.registry import Backend, ServedModel
from gateway.service.serving import Call, Service


def _check(model: ServedModel, output: str, route: str, served: str) -> None:
    if model.task != "embed" or model.endpoint(None).token_width(output) is None:
        raise GatewayError(ErrorType.OUTPUT_NOT_AVAILABLE, f"model {model.name!r} has no {output} output: {route} "
                           f"serves {served}")


def check_embed_all(model: ServedModel) -> None:
    """424 unless the model step returns its hidden states."""
    _check(model, TOKEN_EMBEDDINGS, "/embed_all", "embedders built by this builder (rebuild older ones)")


def check_multi_vector(model: ServedModel) -> None:
    """424 unless the model step returns ColBERT vectors."""
    _check(model, COLBERT_VECTORS, "/embed_multi_vector", "embedders built with bge-m3's colbert_linear.pt")


async def embed_all(
    inference: Inference, model: ServedModel, inputs: Inputs, *, truncate: bool, backend: Backend | None,
    deadline: float,
) -> tuple[list[np.ndarray], int]:
    """[tokens_i, hidden] float32 per input (every token of its truncated encoding), and the billed tokens."""
    check_embed_all(model)
    result = await inference.run(model, inputs, truncate=truncate, backend=backend, deadline=deadline,
                                 output=TOKEN_EMBEDDINGS)
    return list(result.outputs), result.tokens


async def embed_multi_vector(
    inference: Inference, model: ServedModel, inputs: Inputs, *, truncate: bool, backend: Backend | None,
    deadline: float,
) -> tuple[list[np.ndarray], int]:
    """[tokens_i - 1, dim] float32 ColBERT vectors per input (the CLS token's left out), and the billed tokens."""
    check_multi_vector(model)
    result = await inference.run(model, inputs, truncate=truncate, backend=backend, deadline=deadline,
                                 output=COLBERT_VECTORS)
    return [vectors[1:] for vectors in result.outputs], result.tokens


@dataclass(frozen=True, slots=True)
class TokenVectors:
    model: str
    vectors: list[np.ndarray]  # [tokens_i, dim] float32 per input, in order
    tokens: int  # billed


Run = Callable[..., Awaitable[tuple[list[np.ndarray], int]]]
# per-token output -> the check that a model has it, the call, and what it is (for "no model with ... is served")
_OUTPUTS: dict[str, tuple[Callable[[ServedModel], None], Run, str]] = {
    TOKEN_EMBEDDINGS: (check_embed_all, embed_all, "per-token hidden states"),
    COLBERT_VECTORS: (check_multi_vector, embed_multi_vector, "ColBERT vectors"),
}


def _has(check: Callable[[ServedModel], None]) -> Callable[[ServedModel], bool]:
    def has(model: ServedModel) -> bool:
        try:
            check(model)
        except GatewayError:
            return False
        return True
    return has


class MultiVectorService(Service):
    """Vectors per token: /embed_all (TOKEN_EMBEDDINGS) and /embed_multi_vector (COLBERT_VECTORS)."""

    async def embed_tokens(
        self, call: Call, output: str, model: str | None, texts: list[str], *, prompt_name: str | None = None,
        truncate: bool = True, direction: TruncationDirection = "right", backend: Backend | None = None,
    ) -> TokenVectors:
        """The per-token `output` of every text; `model` None: the only served model that returns it."""
        check, run, what = _OUTPUTS[output]
        self.check_texts(call, texts)
        served = await self.model_with(call, model, _has(check), what)
        check(served)
        inputs = Inputs(with_prompt(texts, prompt_text(served, prompt_name)), None, direction)
        vectors, tokens = await self.within_deadline(lambda deadline: run(
            self.inference, served, inputs, truncate=truncate, backend=backend, deadline=deadline))
        return TokenVectors(served.name, vectors, tokens)
