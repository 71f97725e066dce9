"""How token sequences of different lengths are cut into padded batches.

One rule for the gateway's scheduler (which forms the batches it sends to a model step) and the
python-backend runner (which re-plans merged ragged batches): the builder copies this file next
to the runner's model.py, so only the standard library may be imported here.

Rows are taken in length order; a batch is padded to its own longest row (rounded up to
`pad_multiple`, never past `max_width`) and grows while it stays within `max_rows`,
`max_tokens` padded tokens, and a padding bound: padded tokens <= PAD_RATIO_LIMIT x the tokens
its rows would take alone (each rounded up on its own) + `call_cost_tokens`. The additive term is what one more model call costs, in tokens:
on a GPU a call has a fixed cost of a few thousand tokens of compute, so small batches merge
freely there, while long and short texts still go to different batches.
"""

from __future__ import annotations

from collections.abc import Sequence

PAD_RATIO_LIMIT = 1.25


def padded_width(length: int, pad_multiple: int, max_width: int) -> int:
    """`length` rounded up to a multiple of `pad_multiple`, capped at `max_width`."""
    return min(-(-max(length, 1) // pad_multiple) * pad_multiple, max_width)


def plan_batches(
    lengths: Sequence[int],
    *,
    max_rows: int,
    max_tokens: int,
    pad_multiple: int,
    max_width: int,
    call_cost_tokens: int,
) -> list[tuple[list[int], int]]:
    """Indices of `lengths` sorted by length and cut into batches: a list of (indices, padded width)."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    batches: list[tuple[list[int], int]] = []
    members: list[int] = []
    width = alone = 0
    for index in order:
        new_width = padded_width(lengths[index], pad_multiple, max_width)
        rows = len(members) + 1
        padded = rows * new_width
        if members and (
            rows > max_rows
            or padded > max_tokens
            or padded > PAD_RATIO_LIMIT * (alone + new_width) + call_cost_tokens
        ):
            batches.append((members, width))
            members, alone = [], 0
        members.append(index)
        width = new_width
        alone += new_width
    if members:
        batches.append((members, width))
    return batches
