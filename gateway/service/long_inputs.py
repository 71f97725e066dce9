"""Long inputs chunked and pooled instead of truncated (`truncate: "chunk"`, or GATEWAY_LONG_INPUTS=chunk).

A text's tokens (its prompt included: the prompt is part of the first window) are cut into windows of the model's
length, each with the model's special tokens around it and GATEWAY_CHUNK_OVERLAP_TOKENS tokens repeated from the
window before. Every window is a row of the model's batches like any other text: admission, the token budget and the
priority lanes count each one. The text's vector is the token-weighted mean of its windows' pooled vectors, a
window's weight being the tokens it ran with (vLLM's chunked processing), before `dimensions` and normalization. A
text within the model's window is one window, whose vector is the one a plain request gets. Usage counts every
window's tokens (overlaps and each window's special tokens included): what the model computed."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from contract.tokenization import TextEncoder, clean_text
from gateway.errors import ErrorType, GatewayError
from gateway.service.inference import Inference, Inputs
from gateway.service.registry import Backend, ServedModel


@dataclass(frozen=True, slots=True)
class Windows:
    """The windows of a request's texts, text by text."""

    rows: list[list[int]]  # each window's token ids, without the special tokens every window gets
    owners: np.ndarray  # [windows] int: the text each window belongs to
    weights: np.ndarray  # [windows] float64: the tokens each window runs with, special tokens included


def can_chunk(inference: Inference, model: ServedModel, backend: Backend | None) -> bool:
    """Whether the gateway tokenizes for `model` and schedules its batches: windows are rows of token ids."""
    return inference.pipeline_of(model, model.endpoint(backend)) == "scheduler"


def unchunkable(model: ServedModel) -> GatewayError:
    return GatewayError(ErrorType.PIPELINE_UNSUPPORTED, f"long inputs of {model.name!r} cannot be chunked here: that "
                        "needs the gateway's scheduler pipeline, which must read the model's tokenizer "
                        "(GATEWAY_REPOSITORY)")


def content_ids(encoder: TextEncoder, texts: list[str]) -> list[list[int]]:
    """Every text's token ids, untruncated, without the special tokens it starts and ends with."""
    contents = []
    for encoding in encoder.tokenizer.encode_batch_fast([clean_text(t) for t in texts], add_special_tokens=True):
        special, ids = encoding.special_tokens_mask, encoding.ids
        head = next((i for i, s in enumerate(special) if not s), len(ids))
        tail = next((i for i, s in enumerate(reversed(special)) if not s), 0)
        contents.append(ids[head:len(ids) - tail])
    return contents


def windows(contents: list[list[int]], room: int, overlap: int, specials: int) -> Windows:
    """`room` content tokens per window, each window starting `room - overlap` tokens after the one before
    (`overlap` kept within half a window); `specials`: the special tokens every window adds."""
    overlap = min(overlap, room // 2)
    step = room - overlap
    rows: list[list[int]] = []
    owners: list[int] = []
    for text, ids in enumerate(contents):
        starts = range(0, max(len(ids) - overlap, 1), step)
        rows += (ids[start:start + room] for start in starts)
        owners += [text] * len(starts)
    weights = np.fromiter((len(row) + specials for row in rows), dtype=np.float64, count=len(rows))
    return Windows(rows, np.asarray(owners, dtype=np.int64), weights)


def combine(vectors: np.ndarray, windows: Windows, texts: int) -> np.ndarray:
    """[texts, dim] float32: each text's token-weighted mean of its windows' vectors."""
    sums = np.zeros((texts, vectors.shape[1]), dtype=np.float64)
    np.add.at(sums, windows.owners, vectors.astype(np.float64) * windows.weights[:, None])
    totals = np.bincount(windows.owners, weights=windows.weights, minlength=texts)
    return (sums / totals[:, None]).astype(np.float32)


async def embed_chunked(
    inference: Inference, model: ServedModel, inputs: Inputs, *, backend: Backend | None, overlap: int,
    max_tokens: int, deadline: float,
) -> tuple[np.ndarray, int]:
    """The pooled vectors [n, width] of `inputs` (texts with their prompts, or token ids without special tokens),
    each the weighted mean of its windows, and the billed tokens; 413 when the inputs hold more than `max_tokens`
    tokens in all."""
    tokenizer = inference.tokenizer_for(model)
    if tokenizer is None or not can_chunk(inference, model, backend):
        raise unchunkable(model)
    encoder, texts = tokenizer.encoder, inputs.texts
    if inputs.token_ids is not None:
        contents = inputs.token_ids
    else:
        contents = await tokenizer.call(lambda: content_ids(encoder, texts), sum(map(len, texts)))
    head, tail = encoder.special_ids()
    specials = len(head) + len(tail)
    total = sum(len(ids) + specials for ids in contents)
    if total > max_tokens:
        raise GatewayError(ErrorType.INPUT_TOO_LONG, f"the inputs hold {total:,} tokens, over the {max_tokens:,} one "
                           "request may bring when long inputs are chunked (GATEWAY_MAX_CHUNKED_TOKENS): send fewer "
                           "or shorter texts per request")
    parts = windows(contents, max(model.max_seq_len - specials, 1), overlap, specials)
    result = await inference.run(model, Inputs([], token_ids=parts.rows, urgency=inputs.urgency), truncate=True,
                                 backend=backend, deadline=deadline)
    return combine(result.rows, parts, len(contents)), result.tokens
