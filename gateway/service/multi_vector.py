"""Per-token vectors: `/embed_all` (the encoder's last hidden state for every token of the truncated
encoding, special tokens included, not normalized: TEI's shape, what late chunking builds on) and
`/embed_multi_vector` (ColBERT vectors of models built with bge-m3's `colbert_linear.pt`:
normalize(colbert_linear(hidden)) per token, without the first (CLS) token, as
`BGEM3FlagModel.encode(return_colbert_vecs=True)` gives them)."""

from __future__ import annotations

import numpy as np

from contract import COLBERT_VECTORS, TOKEN_EMBEDDINGS
from gateway.errors import ErrorType, GatewayError
from gateway.service.inference import Inference, Inputs
from gateway.service.registry import Backend, ServedModel


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
