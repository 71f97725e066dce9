"""What the result cache keeps per text, the same way in either store: one bytes value holding the epoch of the
model it was computed under, the text's token count and the model step's pooled float32 row."""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass
from typing import Protocol

import numpy as np

EPOCH_BYTES = 8
_HEADER = struct.Struct(f"<{EPOCH_BYTES}si")  # epoch, the text's token count before truncation


def new_epoch() -> bytes:
    """A fresh epoch: random, so that an epoch lost and made again (an evicted Redis key, a restarted worker)
    can never bring back the entries of one before it."""
    return os.urandom(EPOCH_BYTES)


@dataclass(frozen=True, slots=True)
class Entry:
    """One text's cached result."""

    row: np.ndarray  # [width] float32, read-only
    num_tokens: int  # before truncation: usage and `truncate: false` need it


def pack(epoch: bytes, row: np.ndarray, num_tokens: int) -> bytes:
    return _HEADER.pack(epoch, num_tokens) + np.ascontiguousarray(row, dtype=np.float32).tobytes()


def unpack(value: bytes | None, epoch: bytes, width: int) -> Entry | None:
    """The entry `value` holds, or None: no value, another epoch's, or not `width` floats wide."""
    if value is None or len(value) != _HEADER.size + 4 * width:
        return None
    stored, num_tokens = _HEADER.unpack_from(value)
    if stored != epoch:
        return None
    return Entry(np.frombuffer(value, dtype=np.float32, offset=_HEADER.size), num_tokens)


class Store(Protocol):
    """Where entries live: keys are digests (keys.py), values `pack`ed bytes; each model has an epoch, and a new
    one makes every entry of the model stored before it unreachable."""

    async def get(self, model: str, keys: list[bytes]) -> tuple[list[bytes | None], bytes | None]:
        """The values of `keys` (None: absent) and the model's current epoch (None: the store cannot say now;
        then nothing is stored either)."""
        ...

    async def put(self, items: list[tuple[bytes, bytes]]) -> None:
        """Store (key, value) pairs; failures are counted, never raised."""
        ...

    async def invalidate(self, model: str) -> None:
        """Give `model` a new epoch."""
        ...

    async def close(self) -> None: ...
