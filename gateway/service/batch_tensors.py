"""A batch's rows as a model step's input tensors (docs/contract.md), in the step's layout, and the step's output
back as one output per row."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from contract import ATTENTION_MASK, CU_SEQLENS, INPUT_IDS, TOKEN_TYPE_IDS
from contract.batching import Shapes
from gateway.service.batch_queue import RowOutput


def _types(ids: Sequence[np.ndarray], types: Sequence[np.ndarray | None]) -> np.ndarray | None:
    """The rows' token types back to back (zeros for a row without), or None when no row has any."""
    if all(t is None for t in types):
        return None
    return np.concatenate([t if t is not None else np.zeros(len(i), np.int32) for i, t in zip(ids, types)])


def padded_tensors(ids: Sequence[np.ndarray], types: Sequence[np.ndarray | None], rows: int, shapes: Shapes,
                   pad_id: int) -> dict[str, np.ndarray]:
    """input_ids, attention_mask, token_type_ids [rows, width] of a batch, in a declared shape: dummy rows (one
    unmasked pad token each, outputs dropped) bring it to a declared row count."""
    lengths = np.zeros(rows, dtype=np.int64)
    lengths[: len(ids)] = [len(i) for i in ids]
    width = shapes.width(int(lengths.max()))
    real = np.arange(width) < lengths[:, None]
    input_ids = np.full((rows, width), pad_id, dtype=np.int32)
    input_ids[real] = np.concatenate(ids)
    token_types = np.zeros((rows, width), dtype=np.int32)
    flat_types = _types(ids, types)
    if flat_types is not None:
        token_types[real] = flat_types
    mask = real.astype(np.int32)
    mask[len(ids):, 0] = 1
    return {INPUT_IDS: input_ids, ATTENTION_MASK: mask, TOKEN_TYPE_IDS: token_types}


def packed_tensors(ids: Sequence[np.ndarray], types: Sequence[np.ndarray | None]) -> dict[str, np.ndarray]:
    """input_ids, token_type_ids [1, T] (the rows back to back) and cu_seqlens [1, rows + 1]."""
    input_ids = np.concatenate(ids).astype(np.int32, copy=False)
    flat_types = _types(ids, types)
    token_types = np.zeros(len(input_ids), np.int32) if flat_types is None else flat_types.astype(np.int32, copy=False)
    cu = np.zeros(len(ids) + 1, np.int32)
    np.cumsum([len(i) for i in ids], out=cu[1:])
    return {INPUT_IDS: input_ids[None], TOKEN_TYPE_IDS: token_types[None], CU_SEQLENS: cu[None]}


@dataclass(frozen=True, slots=True)
class StepOutputs:
    """Several outputs of one step call (one forward pass), each pooled ([rows, ...]) or per token."""

    arrays: tuple[np.ndarray, ...]
    per_token: tuple[bool, ...]


def outputs_by_row(outputs: np.ndarray | StepOutputs, lengths: Sequence[int], tensors: dict[str, np.ndarray],
                   per_token: bool) -> list[RowOutput]:
    """Each row's output: its row of a pooled output; its own tokens of a per-token one ([rows, width, ...]
    padded, [T, ...] packed); of several outputs, a tuple of those."""
    if isinstance(outputs, StepOutputs):
        split = [outputs_by_row(array, lengths, tensors, each) for array, each in zip(outputs.arrays, outputs.per_token)]
        return list(zip(*split))
    if not per_token:
        return list(outputs)
    if CU_SEQLENS in tensors:
        cu = tensors[CU_SEQLENS][0]
        return [outputs[cu[k]:cu[k + 1]] for k in range(len(lengths))]
    return [outputs[k, :length] for k, length in enumerate(lengths)]
