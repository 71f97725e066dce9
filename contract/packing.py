"""The packed layout of a batch (docs/contract.md "Packed model steps"): rows back to back, no pad token.

    input_ids, token_type_ids  [T]      int32  every row's real tokens, row 0 first
    cu_seqlens                 [B + 1]  int32  0, end of row 0, ..., T (strictly increasing: no empty row)

The packed graph also reads index tensors derived from cu_seqlens (`PackedRows.feed`), computed here on
the host with numpy in microseconds rather than in the graph, where they took ~45 small GPU and CPU
nodes and a device-to-host copy per call:

    token_offset               [B, S]   int32  onnxruntime's RemovePadding layout (S: the longest row)
    position_ids               [T]      int32  each token's position in its row, from 0
    token_rows                 [T]      int32  each token's row (mean pooling only)
    row_ids                    [B]      int32  0 .. B-1 (mean pooling only)

One definition for everyone who makes or reads that layout: the gateway (which packs its batches),
the python-backend runner (which packs padded requests, checks packed ones, merges every request of
an execute() call and cuts the result into runs under a token budget) and the builder (its parity
feeds). The builder copies this file next to the runner's model.py, so only the standard library
and numpy may be imported here; the tensor names below equal contract/__init__.py's (a test checks).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

INPUT_IDS = "input_ids"
TOKEN_TYPE_IDS = "token_type_ids"
CU_SEQLENS = "cu_seqlens"
TOKEN_OFFSET = "token_offset"
POSITION_IDS = "position_ids"
TOKEN_ROWS = "token_rows"
ROW_IDS = "row_ids"
GRAPH_INPUTS = (INPUT_IDS, TOKEN_TYPE_IDS, CU_SEQLENS, TOKEN_OFFSET, POSITION_IDS, TOKEN_ROWS, ROW_IDS)
# A run's rows x tokens, bounded: a packed graph's mean pooling multiplies a [rows, tokens] float32
# membership matrix with the hidden states (one deterministic GEMM); 2**26 cells are 256 MiB.
MAX_RUN_CELLS = 1 << 26
# Token counts a run on the GPU is filled up to (`filled_tokens`): 32 sizes per doubling, exact below 64 tokens. Every
# GEMM of the graph has the run's token count as its row count, and cuBLAS chooses an algorithm per new shape on the
# host: with raw token counts (nearly every call a new one) that choice would take most of a step's time under load.
FILL_SIZES_PER_DOUBLING = 32
FILLER_MIN_ROW = 8  # a filler row's length when every real row is shorter


class PackingError(ValueError):
    """A request that breaks the packed-input contract; the message says how (bounded in size)."""


@dataclass(frozen=True)
class PackedRows:
    """Rows in the packed layout (int32 arrays; `cu_seqlens` checked by whoever made it)."""

    input_ids: np.ndarray
    token_type_ids: np.ndarray
    cu_seqlens: np.ndarray

    @property
    def rows(self) -> int:
        return len(self.cu_seqlens) - 1

    @property
    def tokens(self) -> int:
        return len(self.input_ids)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.cu_seqlens)

    def feed(self, names: Collection[str] = GRAPH_INPUTS) -> dict[str, np.ndarray]:
        """The packed graph's inputs named in `names` (a session's input names: a graph without mean pooling
        reads no token_rows/row_ids, and onnxruntime refuses inputs a graph does not declare)."""
        lengths = self.lengths
        feed = {INPUT_IDS: self.input_ids, TOKEN_TYPE_IDS: self.token_type_ids, CU_SEQLENS: self.cu_seqlens}
        if TOKEN_OFFSET in names:
            feed[TOKEN_OFFSET] = token_offset(lengths)
        if POSITION_IDS in names:  # a token's index minus its row's first
            starts = np.repeat(self.cu_seqlens[:-1], lengths)
            feed[POSITION_IDS] = (np.arange(self.tokens, dtype=np.int32) - starts).astype(np.int32, copy=False)
        if TOKEN_ROWS in names:
            feed[TOKEN_ROWS] = np.repeat(np.arange(self.rows, dtype=np.int32), lengths)
        if ROW_IDS in names:
            feed[ROW_IDS] = np.arange(self.rows, dtype=np.int32)
        return {name: value for name, value in feed.items() if name in names}

    def filled(self, tokens: int, max_row: int) -> PackedRows:
        """These rows, then filler rows (token id 0, type 0) up to `tokens` tokens in all. Each row attends and
        pools only within itself, so the filler leaves the real rows' outputs as they are; theirs are the first
        `rows` rows (and `tokens` tokens) of the result. A filler row is no longer than `max_row` (max_seq_len)
        nor than the longest row here (at least FILLER_MIN_ROW), so that the widest row, which sizes
        token_offset and the attention's padded views, stays the same."""
        extra = tokens - self.tokens
        if extra <= 0:
            return self
        longest = int(self.lengths.max()) if self.rows else max_row
        max_row = max(1, min(max_row, max(longest, FILLER_MIN_ROW)))
        lengths = [max_row] * (extra // max_row) + ([extra % max_row] if extra % max_row else [])
        filler = np.zeros(extra, np.int32)
        return PackedRows(np.concatenate([self.input_ids, filler]), np.concatenate([self.token_type_ids, filler]),
                          cu_seqlens_of(np.concatenate([self.lengths, np.asarray(lengths, np.int64)])))

    def slice_rows(self, start: int, stop: int) -> PackedRows:
        """Rows start..stop-1 as a batch of their own (cu_seqlens re-based to 0)."""
        first, last = int(self.cu_seqlens[start]), int(self.cu_seqlens[stop])
        return PackedRows(self.input_ids[first:last], self.token_type_ids[first:last],
                          (self.cu_seqlens[start:stop + 1] - first).astype(np.int32))


def token_offset(lengths: np.ndarray) -> np.ndarray:
    """onnxruntime's RemovePadding layout [rows, S] for rows of `lengths` (S: the longest): the padded slot
    b*S+s of every real token in packed order, then every padding slot in order (getTokenOffset in its
    contrib_ops/cuda/bert/bert_padding.cu). PackedMultiHeadAttention reads S from this tensor's shape."""
    rows, width = len(lengths), int(lengths.max()) if len(lengths) else 0
    slots = np.arange(rows * width, dtype=np.int32).reshape(rows, width)
    real = np.arange(width)[None, :] < lengths[:, None]
    return np.concatenate([slots[real], slots[~real]]).reshape(rows, width)


def cu_seqlens_of(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    """[0, l0, l0 + l1, ...] as int32."""
    cu = np.zeros(len(lengths) + 1, np.int32)
    if len(lengths):
        cu[1:] = np.cumsum(np.asarray(lengths, np.int64))
    return cu


def from_rows(input_ids: Sequence[Sequence[int] | np.ndarray],
              token_type_ids: Sequence[Sequence[int] | np.ndarray] | None = None) -> PackedRows:
    """Rows of token ids (and their token types; zeros when absent) in the packed layout, e.g. a batch the
    gateway formed. Every row needs at least one token."""
    lengths = [len(row) for row in input_ids]
    if not lengths or min(lengths) < 1:
        raise PackingError("a packed batch needs at least one row, and every row at least one token")
    ids = np.concatenate([np.asarray(row, np.int32) for row in input_ids])
    types = (np.zeros_like(ids) if token_type_ids is None
             else np.concatenate([np.asarray(row, np.int32) for row in token_type_ids]))
    if types.shape != ids.shape:
        raise PackingError(f"token_type_ids hold {types.size} tokens, input_ids {ids.size}")
    return PackedRows(ids, types, cu_seqlens_of(lengths))


def _show(values: np.ndarray) -> str:
    """At most 8 values of an array, for error messages."""
    flat = values.ravel()
    text = ", ".join(str(int(v)) for v in flat[:8])
    return f"[{text}{', ...' if flat.size > 8 else ''}] ({flat.size} values)"


def check_cu_seqlens(cu_seqlens: np.ndarray, tokens: int, max_row: int | None = None) -> None:
    """Raise PackingError unless `cu_seqlens` is 0, ..., `tokens`, strictly increasing, and (with `max_row`)
    no row is longer than `max_row` tokens."""
    cu = np.asarray(cu_seqlens)
    if cu.ndim != 1 or cu.size < 2:
        raise PackingError(f"cu_seqlens must hold rows + 1 >= 2 values, got shape {list(cu.shape)}")
    if int(cu[0]) != 0:
        raise PackingError(f"cu_seqlens must start at 0: {_show(cu)}")
    if int(cu[-1]) != tokens:
        raise PackingError(f"cu_seqlens must end at the token count {tokens}: {_show(cu)}")
    lengths = np.diff(cu.astype(np.int64))
    empty = np.flatnonzero(lengths < 1)
    if empty.size:
        raise PackingError(f"cu_seqlens must be strictly increasing (every row at least one token); row "
                           f"{int(empty[0])} has {int(lengths[empty[0]])}: {_show(cu)}")
    if max_row is not None and int(lengths.max()) > max_row:
        longest = int(lengths.argmax())
        raise PackingError(f"row {longest} has {int(lengths[longest])} tokens, more than max_seq_len {max_row}")


def packed_request(input_ids: np.ndarray, token_type_ids: np.ndarray, cu_seqlens: np.ndarray,
                   max_row: int | None = None) -> PackedRows:
    """A packed request as Triton hands it over (input_ids, token_type_ids [1, T]; cu_seqlens [1, rows + 1]),
    checked; PackingError says what is wrong."""
    ids, types, cu = (np.asarray(a) for a in (input_ids, token_type_ids, cu_seqlens))
    if ids.ndim != 2 or ids.shape[0] != 1 or cu.ndim != 2 or cu.shape[0] != 1:
        raise PackingError(f"a packed request has batch 1: input_ids [1, T] and cu_seqlens [1, rows + 1], got "
                           f"{list(ids.shape)} and {list(cu.shape)}")
    if types.shape != ids.shape:
        raise PackingError(f"token_type_ids {list(types.shape)} must have the shape of input_ids {list(ids.shape)}")
    check_cu_seqlens(cu[0], ids.shape[1], max_row)
    return PackedRows(ids[0].astype(np.int32, copy=False), types[0].astype(np.int32, copy=False),
                      cu[0].astype(np.int32, copy=False))


def pack_padded(input_ids: np.ndarray, attention_mask: np.ndarray, token_type_ids: np.ndarray,
                max_row: int | None = None) -> PackedRows:
    """Right-padded rows [rows, width] (attention_mask 1 on a row's tokens, then 0) in the packed layout."""
    ids, mask, types = (np.asarray(a) for a in (input_ids, attention_mask, token_type_ids))
    if ids.ndim != 2 or mask.shape != ids.shape or types.shape != ids.shape:
        raise PackingError(f"input_ids, attention_mask and token_type_ids must be [rows, width] of one shape, got "
                           f"{list(ids.shape)}, {list(mask.shape)} and {list(types.shape)}")
    lengths = (mask != 0).sum(axis=1)
    if (lengths < 1).any():
        raise PackingError(f"row {int(np.flatnonzero(lengths < 1)[0])} has no token (attention_mask all 0)")
    real = np.arange(ids.shape[1])[None, :] < lengths[:, None]
    if not np.array_equal(real, mask == 1):
        row = int(np.flatnonzero((real != (mask == 1)).any(axis=1))[0])
        raise PackingError(f"attention_mask must be 1 on a row's tokens then 0 (right padding); row {row} is "
                           f"{_show(mask[row])}")
    cu = cu_seqlens_of(lengths)
    if max_row is not None:
        check_cu_seqlens(cu, int(cu[-1]), max_row)
    return PackedRows(ids[real].astype(np.int32, copy=False), types[real].astype(np.int32, copy=False), cu)


def check_ids(rows: PackedRows, vocab_size: int | None = None, type_vocab_size: int | None = None) -> None:
    """Raise PackingError when a token id or token type falls outside the model's embedding tables (on a GPU an
    out-of-range lookup is not an error but a wrong answer or a fault)."""
    for name, values, size in ((INPUT_IDS, rows.input_ids, vocab_size), (TOKEN_TYPE_IDS, rows.token_type_ids,
                                                                         type_vocab_size)):
        if size and values.size and (int(values.min()) < 0 or int(values.max()) >= size):
            bad = values[(values < 0) | (values >= size)]
            raise PackingError(f"{name} must be in 0..{size - 1}: found {_show(bad)}")


def concat(parts: Sequence[PackedRows]) -> PackedRows:
    """The rows of every part, in order, as one batch."""
    if len(parts) == 1:
        return parts[0]
    lengths = np.concatenate([p.lengths for p in parts])
    return PackedRows(np.concatenate([p.input_ids for p in parts]).astype(np.int32, copy=False),
                      np.concatenate([p.token_type_ids for p in parts]).astype(np.int32, copy=False),
                      cu_seqlens_of(lengths))


def filled_tokens(tokens: int, limit: int) -> int:
    """The token count a run of `tokens` is filled up to: the next multiple of 1/32 of the power of two at or below
    `tokens` (at most 1/32 more tokens; `tokens` itself below 64); never past max(tokens, limit)."""
    step = max(1, (1 << (tokens.bit_length() - 1)) // FILL_SIZES_PER_DOUBLING)
    return min(-(-tokens // step) * step, max(tokens, limit))


def fill_sizes(limit: int) -> list[int]:
    """Every token count `filled_tokens` gives for runs of 1 to `limit` tokens, ascending."""
    sizes: list[int] = []
    tokens = 1
    while tokens <= limit:
        sizes.append(filled_tokens(tokens, limit))
        tokens = sizes[-1] + 1
    return sizes


def cut_runs(lengths: Sequence[int] | np.ndarray, max_tokens: int, max_cells: int = MAX_RUN_CELLS
             ) -> list[tuple[int, int]]:
    """Row ranges [start, stop) of consecutive rows (arrival order: no padding, so no sorting) holding at most
    `max_tokens` tokens and `max_cells` rows x tokens each; a row longer than the budget is a run of its own."""
    runs: list[tuple[int, int]] = []
    start = tokens = 0
    for index, length in enumerate(int(n) for n in lengths):
        rows = index - start + 1
        if index > start and (tokens + length > max_tokens or rows * (tokens + length) > max_cells):
            runs.append((start, index))
            start, tokens = index, 0
        tokens += length
    if len(lengths):
        runs.append((start, len(lengths)))
    return runs
