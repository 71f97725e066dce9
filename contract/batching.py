"""How token sequences of different lengths are cut into padded batches, and which shapes batches take.

One rule for the gateway's scheduler (which forms the batches it sends to a model step) and the
python-backend runner (which re-plans merged ragged batches, and warms its shapes up at load):
the builder copies this file next to the runner's model.py, so only the standard library may be
imported here.

Shapes. A model step may declare the widths and row counts its batches take (config parameters
`batch_widths`, `batch_rows`): onnxruntime's CUDA provider spends tens of milliseconds on the first
run of every new input shape of the fused fp16 BERT graph, so a GPU step keeps to a few shapes, warmed
at load. Without them a batch is padded to its own longest
row and takes any row count (the CPU provider has no such cost).

Cutting. A batch is padded to its own longest row (rounded up to a declared width) and grows while it
stays `within_limits`: at most `max_rows` rows and `max_tokens` padded tokens, and a padding bound:
padded tokens <= PAD_RATIO_LIMIT x the tokens its rows would take alone (each rounded up on its own)
+ `call_cost_tokens`, what one more model call costs in tokens. `plan_batches` cuts a whole set of
rows taken in length order (the runner); the gateway's scheduler grows one batch at a time around its
oldest queued row under the same limits (gateway/service/scheduler.py).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

PAD_RATIO_LIMIT = 1.25
ROW_PAD_LIMIT = 0.25  # dummy rows allowed to reach a declared row count, as a share of the real ones
GPU_WIDTHS = (8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512)
# Long-context models (8,192 positions): the same <= 25% padding step above 512, so that a 600-token text is not
# padded to max_seq_len. Shapes wider than the token budget allows only run with one row (Shapes.warm_shapes).
LONG_WIDTHS = (640, 768, 896, 1024, 1280, 1536, 1792, 2048, 2560, 3072, 3584, 4096, 5120, 6144, 7168, 8192,
               10240, 12288, 14336, 16384, 20480, 24576, 28672, 32768)


def parse_sizes(text: str) -> tuple[int, ...]:
    """"8,16,32" -> (8, 16, 32), sorted and unique; "" -> ()."""
    return tuple(sorted({int(x) for x in text.split(",") if x.strip()}))


def default_widths(max_width: int) -> tuple[int, ...]:
    """The GPU width set, capped at and ending with `max_width` (~9% padding on a realistic length mix)."""
    return tuple(sorted({w for w in (*GPU_WIDTHS, *LONG_WIDTHS) if w < max_width} | {max_width}))


def default_rows(max_rows: int) -> tuple[int, ...]:
    """Powers of two up to and ending with `max_rows`."""
    return tuple(sorted({1 << k for k in range(max_rows.bit_length()) if 1 << k < max_rows} | {max_rows}))


@dataclass(frozen=True)
class Shapes:
    """The widths and row counts batches take (empty = any), and the widest row."""

    max_width: int
    widths: tuple[int, ...] = ()
    rows: tuple[int, ...] = ()

    def width(self, length: int) -> int:
        """The padded width of a batch whose longest row is `length` tokens."""
        if not self.widths:
            return min(max(length, 1), self.max_width)
        return self.widths[min(bisect.bisect_left(self.widths, length), len(self.widths) - 1)]

    def fit_rows(self, n: int) -> tuple[int, int]:
        """(rows to take out of `n`, rows to run): pad up with dummy rows to the next declared count when
        that adds at most ROW_PAD_LIMIT, else take the largest declared count below (the rest waits)."""
        if not self.rows or n in self.rows:
            return n, n
        i = bisect.bisect_left(self.rows, n)
        if i < len(self.rows) and self.rows[i] - n <= ROW_PAD_LIMIT * n:
            return n, self.rows[i]
        below = self.rows[i - 1] if i > 0 else n
        return below, below

    def warm_shapes(self, max_tokens: int) -> list[tuple[int, int]]:
        """Every (rows, width) a batch can take: what a step runs once at load."""
        return [(r, w) for w in self.widths for r in self.rows if r == 1 or r * w <= max_tokens]


def within_limits(rows: int, width: int, alone: int, *, max_rows: int, max_tokens: int, call_cost_tokens: int) -> bool:
    """Whether `rows` rows padded to `width` may run as one batch, `alone` being the tokens they would take
    each in a batch of its own (their widths summed). A single row always may."""
    padded = rows * width
    return rows == 1 or (
        rows <= max_rows and padded <= max_tokens and padded <= PAD_RATIO_LIMIT * alone + call_cost_tokens
    )


def plan_batches(
    lengths: Sequence[int],
    shapes: Shapes,
    *,
    max_rows: int,
    max_tokens: int,
    call_cost_tokens: int,
) -> list[tuple[list[int], int]]:
    """Indices of `lengths` sorted by length and cut into batches: a list of (indices, padded width)."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    batches: list[tuple[list[int], int]] = []
    members: list[int] = []
    width = alone = 0
    for index in order:
        new_width = shapes.width(lengths[index])
        if members and not within_limits(len(members) + 1, new_width, alone + new_width, max_rows=max_rows,
                                         max_tokens=max_tokens, call_cost_tokens=call_cost_tokens):
            batches.append((members, width))
            members, alone = [], 0
        members.append(index)
        width = new_width
        alone += new_width
    if members:
        batches.append((members, width))
    return batches
