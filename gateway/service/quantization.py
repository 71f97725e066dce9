"""Embedding types: the float32 vectors a request gets, as int8 or uint8 (one byte per component, on the model's
ranges calibrated at build: contract/ranges.py) or as binary or ubinary (one bit per component, 1 when positive,
packed 8 to a byte), exactly as sentence-transformers' `quantize_embeddings(vectors, precision, ranges=...)`."""

from __future__ import annotations

from collections.abc import Collection
from typing import Literal, get_args

import numpy as np

from gateway.errors import ErrorType, invalid
from gateway.service.registry import ServedModel

EmbeddingType = Literal["float", "int8", "uint8", "binary", "ubinary"]
EMBEDDING_TYPES: tuple[EmbeddingType, ...] = get_args(EmbeddingType)
CALIBRATED: frozenset[EmbeddingType] = frozenset({"int8", "uint8"})  # these need the model's ranges


def calibrated_ranges(model: ServedModel, types: Collection[EmbeddingType], width: int, normalize: bool | None
                      ) -> np.ndarray | None:
    """The ranges [2, width] that `types` need (None when they need none). 400 when the model was built without
    them, or when the request's normalization is not the model's own, which the ranges describe."""
    if not CALIBRATED.intersection(types):
        return None
    if normalize is not None and normalize != model.normalize:
        state = "L2-normalized" if model.normalize else "not normalized"
        raise invalid(f"int8 and uint8 of model {model.name!r} are calibrated on its vectors as served by default "
                      f"({state}): leave `normalize` unset with them", type=ErrorType.UNSUPPORTED_OPTION)
    ranges = model.quantization_ranges.get(width)
    if ranges is None:
        raise invalid(f"model {model.name!r} has no int8/uint8 ranges: they are calibrated when the model is built; "
                      "rebuild it with this repository's builder (`python -m builder build ...`, optionally "
                      "`--calibration-texts FILE` with texts like the ones you embed)", type=ErrorType.NOT_CALIBRATED)
    return ranges


def quantize(vectors: np.ndarray, embedding_type: EmbeddingType, ranges: np.ndarray | None) -> np.ndarray:
    """[n, dim] float32 vectors as `embedding_type`: float32 as they are, int8/uint8 [n, dim] on `ranges`
    (calibrated_ranges), binary/ubinary [n, ceil(dim / 8)] int8/uint8."""
    if embedding_type == "float":
        return vectors
    if embedding_type in CALIBRATED:
        if ranges is None:
            raise ValueError(f"{embedding_type} needs the model's ranges (calibrated_ranges)")
        starts = ranges[0, :]
        steps = (ranges[1, :] - starts) / 255
        steps = np.where(steps == 0, 1, steps)  # a component constant over the calibration set
        buckets = np.clip(np.floor((vectors - starts) / steps), 0, 255)
        return buckets.astype(np.uint8) if embedding_type == "uint8" else (buckets - 128).astype(np.int8)
    bits = np.packbits(vectors > 0, axis=-1)
    return bits if embedding_type == "ubinary" else (bits.astype(np.int16) - 128).astype(np.int8)
