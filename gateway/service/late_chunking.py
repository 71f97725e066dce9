"""Late chunking (Günther et al., 2024): the model runs once over the whole document, and each chunk's vector is the
mean of the encoder's last hidden state (the step's TOKEN_EMBEDDINGS output) over the chunk's tokens, so that every
chunk carries the context of the whole document.

A request gives, per input, its chunks as [start, end) character offsets into the text as sent: the model's prompt,
put before the text, shifts nothing. A token belongs to a chunk when its characters overlap the chunk's, so a token
that a chunk's boundary cuts belongs to the chunks on both sides (an empty token counts as the one character at its
position). Special tokens ([CLS], [SEP], <s>, ...) and tokens of the prompt alone belong to no chunk. A chunk that no
token overlaps is refused (400), and so is a document, prompt included, longer than the model's window (413: one run
must see it whole, whatever `truncate` says). Usage counts each document's tokens once: one run per document."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from tokenizers import Encoding

from contract import TOKEN_EMBEDDINGS
from contract.tokenization import clean_text
from gateway.errors import ErrorType, GatewayError, invalid
from gateway.service.admission import Urgency
from gateway.service.inference import Inference, Inputs
from gateway.service.registry import Backend, ServedModel

Span = Sequence[int]  # [start, end)


@dataclass(frozen=True, slots=True)
class Document:
    """One tokenized document: its ids without the leading and trailing special tokens, and for each of those
    tokens its character range in the user's text (prompt removed) or None for a special token."""

    content: list[int]
    starts: np.ndarray  # [content tokens] int64; special tokens: -1
    ends: np.ndarray  # [content tokens] int64, at least start + 1; special tokens: -1
    tokens: int  # with the special tokens


def check_spans(texts: Sequence[str], chunks: Sequence[Sequence[Span]]) -> None:
    """400 unless there is one list of chunks per text and each is a non-empty range within its text."""
    if len(chunks) != len(texts):
        raise invalid(f"`chunks` has {len(chunks)} lists for {len(texts)} inputs: give one list of [start, end] "
                      "character offsets per input")
    for i, (text, spans) in enumerate(zip(texts, chunks)):
        for j, (start, end) in enumerate(spans):
            if not 0 <= start < end <= len(text):
                raise invalid(f"chunk {j} of input {i} is [{start}, {end}]: a chunk is [start, end] with "
                              f"0 <= start < end <= {len(text)} (the input's length in characters)")


def documents(encodings: list[Encoding], shift: int) -> list[Document]:
    """Each encoding as a Document; `shift`: the prompt's characters before the user's text."""
    found = []
    for encoding in encodings:
        special = np.asarray(encoding.special_tokens_mask, dtype=bool)
        head = int(np.argmin(special)) if not special.all() else len(special)
        tail = int(np.argmin(special[::-1])) if not special.all() else 0
        inner = slice(head, len(special) - tail)
        offsets = np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2)[inner] - shift
        starts, ends = offsets[:, 0], np.maximum(offsets[:, 1], offsets[:, 0] + 1)
        mask = special[inner]
        starts[mask], ends[mask] = -1, -1
        found.append(Document(encoding.ids[inner], starts, ends, len(encoding.ids)))
    return found


def pool(hidden: np.ndarray, document: Document, spans: Sequence[Span], input_index: int) -> np.ndarray:
    """[chunks, dim] float32: the mean of `hidden` ([content tokens, dim]) over each chunk's tokens; 400 for a
    chunk without any. Token ranges are ordered, so each chunk's tokens are one run of them, found by bisection
    (and summed from running totals) whatever the number of chunks."""
    keep = document.starts >= 0
    starts, ends = document.starts[keep], document.ends[keep]
    if np.any(np.diff(starts) < 0) or np.any(np.diff(ends) < 0):  # a tokenizer whose offsets go back: by mask
        return _pool_by_mask(hidden[keep], starts, ends, spans, input_index)
    bounds = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
    first = np.searchsorted(ends, bounds[:, 0], side="right")  # the first token ending after the chunk's start
    stop = np.searchsorted(starts, bounds[:, 1], side="left")  # past the last token starting before its end
    counts = stop - first
    _check_counts(counts, spans, input_index)
    totals = np.zeros((len(starts) + 1, hidden.shape[1]), dtype=np.float64)
    np.cumsum(hidden[keep], axis=0, dtype=np.float64, out=totals[1:])
    return ((totals[stop] - totals[first]) / counts[:, None]).astype(np.float32)


def _pool_by_mask(hidden: np.ndarray, starts: np.ndarray, ends: np.ndarray, spans: Sequence[Span],
                  input_index: int) -> np.ndarray:
    vectors = np.empty((len(spans), hidden.shape[1]), dtype=np.float32)
    counts = np.empty(len(spans), dtype=np.int64)
    for j, (start, end) in enumerate(spans):
        mask = (starts < end) & (ends > start)
        counts[j] = mask.sum()
        vectors[j] = hidden[mask].mean(axis=0, dtype=np.float64) if counts[j] else 0
    _check_counts(counts, spans, input_index)
    return vectors


def _check_counts(counts: np.ndarray, spans: Sequence[Span], input_index: int) -> None:
    empty = np.flatnonzero(counts <= 0)
    if empty.size:
        j = int(empty[0])
        raise invalid(f"chunk {j} of input {input_index} ({list(spans[j])}) covers no token of the text: a chunk "
                      "needs at least one token whose characters it overlaps")


async def late_chunk(
    inference: Inference, model: ServedModel, texts: list[str], prefix: str, chunks: Sequence[Sequence[Span]], *,
    urgency: Urgency, backend: Backend | None, deadline: float,
) -> tuple[np.ndarray, list[int], int]:
    """Every chunk's vector [chunks, hidden width] (input by input, chunk by chunk), the chunk count of each input,
    and the billed tokens."""
    check_spans(texts, chunks)
    tokenizer = inference.tokenizer_for(model)
    if tokenizer is None:
        raise GatewayError(ErrorType.PIPELINE_UNSUPPORTED, f"late chunking of {model.name!r} needs the gateway's "
                           "scheduler pipeline: it must read the model's tokenizer (GATEWAY_REPOSITORY)")
    encoder = tokenizer.encoder
    full = [clean_text(prefix + text) for text in texts]
    docs = documents(await tokenizer.call(lambda: encoder.tokenizer.encode_batch(full, add_special_tokens=True),
                                          sum(map(len, full))), len(prefix))
    for i, doc in enumerate(docs):
        if doc.tokens > model.max_seq_len:
            prompt = " with its prompt" if prefix else ""
            raise GatewayError(ErrorType.INPUT_TOO_LONG, f"input {i} has {doc.tokens} tokens{prompt}, over the "
                               f"model's window of {model.max_seq_len}: late chunking runs the whole document at "
                               "once; split it into documents of at most that many tokens")
    result = await inference.run(model, Inputs([], token_ids=[doc.content for doc in docs], urgency=urgency),
                                 truncate=True, backend=backend, deadline=deadline, outputs=(TOKEN_EMBEDDINGS,))
    head = len(encoder.special_ids()[0])
    vectors = [pool(hidden[head:head + len(doc.content)], doc, spans, i)
               for i, (hidden, doc, spans) in enumerate(zip(result.per_text, docs, chunks))]
    return np.concatenate(vectors), [len(spans) for spans in chunks], result.tokens
