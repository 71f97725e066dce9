"""Run a list of texts through a served model: split by max batch, run chunks concurrently, reassemble."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import numpy as np

from gateway.api.errors import InputTooLong
from gateway.service.registry import Backend, ServedModel
from gateway.triton.client import TritonClient


@dataclass(frozen=True)
class BatchResult:
    """Model outputs for every input, in input order, and the billed token count."""

    outputs: np.ndarray  # [n, width] float32
    num_tokens: np.ndarray  # [n] int32, before truncation
    tokens: int  # sum of min(num_tokens, max_seq_len)


async def run_texts(
    client: TritonClient, model: ServedModel, texts: list[str], *, truncate: bool, backend: Backend | None
) -> BatchResult:
    """Infer all `texts` (any count) on `model`; 413 when `truncate` is off and a text is too long."""
    endpoint = model.endpoint(backend)
    encoded = [t.encode() for t in texts]
    size = endpoint.max_batch_size
    chunks = [encoded[i : i + size] for i in range(0, len(encoded), size)]
    if len(chunks) == 1:
        parts = [await client.infer(model, endpoint, chunks[0])]
    else:
        parts = await asyncio.gather(*(client.infer(model, endpoint, c) for c in chunks))
    outputs = parts[0][0] if len(parts) == 1 else np.concatenate([p[0] for p in parts])
    num_tokens = parts[0][1] if len(parts) == 1 else np.concatenate([p[1] for p in parts])
    if not truncate:
        over = np.flatnonzero(num_tokens > model.max_seq_len)
        if over.size:
            i = int(over[0])
            raise InputTooLong(
                f"input {i} has {int(num_tokens[i])} tokens, over the model's limit of {model.max_seq_len} "
                "(send truncate: true to truncate)"
            )
    tokens = int(np.minimum(num_tokens, model.max_seq_len).sum())
    return BatchResult(outputs, num_tokens, tokens)
