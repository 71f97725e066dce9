"""The int8/uint8 quantization ranges of an embedder (ensemble parameter `quantization_ranges`, docs/contract.md).

For every width a request may ask for (the matryoshka dimensions and the full one), the [min; max] of each
component over the builder's calibration set, as the gateway serves the vectors at that width: the array
sentence-transformers' `quantize_embeddings(embeddings, precision, ranges=...)` takes, float32 [2, dim].
Written as a JSON object {"dim": base64 of the array's little-endian float32 bytes, min row first}: compact,
and the exact float32 values back (a decimal text would round them, and so the integers).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping

import numpy as np
import orjson


def encode_ranges(ranges: Mapping[int, np.ndarray]) -> str:
    """The parameter's text of ranges by width, in ascending width."""
    return orjson.dumps({str(dim): base64.b64encode(np.asarray(r, dtype="<f4").tobytes()).decode()
                         for dim, r in sorted(ranges.items())}).decode()


def decode_ranges(text: str) -> dict[int, np.ndarray]:
    """Ranges by width from the parameter's text ("" = none); ValueError when it is malformed."""
    if not text:
        return {}
    try:
        raw = orjson.loads(text)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"quantization ranges are not JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ValueError("quantization ranges must be a JSON object of width -> base64")
    ranges = {}
    for key, value in raw.items():
        if not (isinstance(key, str) and key.isdigit() and int(key) > 0 and isinstance(value, str)):
            raise ValueError(f"quantization ranges: {key!r} is not a width with a base64 value")
        dim = int(key)
        try:
            data = base64.b64decode(value, validate=True)
        except binascii.Error:
            raise ValueError(f"quantization ranges of width {dim} are not base64") from None
        if len(data) != 2 * dim * 4:
            raise ValueError(f"quantization ranges of width {dim} hold {len(data)} bytes, not {2 * dim * 4}")
        array = np.frombuffer(data, dtype="<f4").reshape(2, dim).astype(np.float32)
        if not np.isfinite(array).all() or (array[0] > array[1]).any():
            raise ValueError(f"quantization ranges of width {dim} are not finite [min; max] rows")
        ranges[dim] = array
    return ranges
