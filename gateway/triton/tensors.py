"""The tensors of one Triton call: the inputs it sends, the outputs it asks for, and the check of the shapes
that come back."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from gateway.triton.errors import contract_mismatch
from gateway.triton.shm_pool import serialize_texts


@dataclass(frozen=True)
class Output:
    """The output a call asks for: tensor name, row width (fp32), and the model label of its metrics.

    A per-token output (docs/contract.md) is [rows, tokens, width], or [rows, tokens] when width is 0."""

    name: str
    width: int
    label: str
    per_token: bool = False

    def shape(self, rows: int, tokens: int) -> tuple[int, ...]:
        """The output's shape for a batch of `rows` rows padded to `tokens` tokens."""
        if not self.per_token:
            return (rows, self.width)
        return (rows, tokens) if self.width == 0 else (rows, tokens, self.width)


@dataclass(frozen=True)
class Tensor:
    """An input of a call: int32 token tensors, or texts (a BYTES [n, 1] tensor)."""

    name: str
    data: np.ndarray | list[bytes]

    @property
    def shape(self) -> list[int]:
        return list(self.data.shape) if isinstance(self.data, np.ndarray) else [len(self.data), 1]

    @property
    def datatype(self) -> str:
        return "INT32" if isinstance(self.data, np.ndarray) else "BYTES"

    def array(self) -> np.ndarray:
        """The tensor as gRPC sends it."""
        if isinstance(self.data, np.ndarray):
            return self.data
        return np.array(self.data, dtype=np.object_).reshape(len(self.data), 1)

    def payload(self) -> bytes | np.ndarray:
        """The tensor as a shared-memory slot holds it (Triton's BYTES serialization for texts)."""
        return self.data if isinstance(self.data, np.ndarray) else serialize_texts(self.data)


@dataclass(frozen=True)
class Wanted:
    """An output a call asks for, and the shape and dtype it must come back in."""

    name: str
    dtype: type
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize  # math.prod: a tuple of ints needs no array


def check_shape(shape: list[int] | None, model: str, want: Wanted) -> None:
    """A contract-mismatch error when Triton's answer gave output `want` no shape or another one: in shared memory
    the bytes alone cannot tell a narrower output from a right one. Shapes agree when they do but for sizes of 1
    (Triton's [n, 1] is a [n] column)."""
    if shape is None:
        raise contract_mismatch(model, f"no output {want.name!r}")
    if [d for d in shape if d != 1] != [d for d in want.shape if d != 1]:
        raise contract_mismatch(model, f"output {want.name!r} has shape {shape}, expected {list(want.shape)}")
