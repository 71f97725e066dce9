"""The batching rule (contract/batching.py) and the BatchScheduler's queue semantics, in-process.

The scheduler's `run_batch` here is a plain coroutine standing in for the model step, so the
tests can hold batches open and fail them at will; the real Triton path is in test_scheduler.py.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract.batching import PAD_RATIO_LIMIT, padded_width, plan_batches
from contract.tokenization import EncodedTexts
from gateway.api.errors import GatewayError
from gateway.metrics import BatchMetrics
from gateway.service.scheduler import BatchPolicy, BatchScheduler


@settings(max_examples=300, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 512), min_size=1, max_size=300),
    max_rows=st.integers(1, 64),
    max_tokens=st.integers(512, 20000),
    pad_multiple=st.sampled_from([1, 8]),
    call_cost=st.sampled_from([0, 64, 2048]),
)
def test_plan_covers_every_row_once_within_limits(
    lengths: list[int], max_rows: int, max_tokens: int, pad_multiple: int, call_cost: int
) -> None:
    plan = plan_batches(lengths, max_rows=max_rows, max_tokens=max_tokens, pad_multiple=pad_multiple,
                        max_width=512, call_cost_tokens=call_cost)
    seen = sorted(i for members, _ in plan for i in members)
    assert seen == list(range(len(lengths)))
    previous_max = 0
    for members, width in plan:
        rows = [lengths[i] for i in members]
        assert rows == sorted(rows) and min(rows) >= previous_max  # batches follow length order
        previous_max = max(rows)
        assert width == padded_width(max(rows), pad_multiple, 512) and width >= max(rows)
        assert len(members) <= max_rows and (len(members) == 1 or len(members) * width <= max_tokens)
        if len(members) > 1:
            alone = sum(padded_width(n, pad_multiple, 512) for n in rows)
            assert len(members) * width <= PAD_RATIO_LIMIT * alone + call_cost


def test_plan_keeps_short_and_long_texts_apart_but_merges_what_a_call_costs() -> None:
    short, long = [12, 9, 15, 11] * 4, [480, 500, 470]
    lengths = short + long
    plan = plan_batches(lengths, max_rows=64, max_tokens=16384, pad_multiple=8, max_width=512, call_cost_tokens=2048)
    assert [sorted(lengths[i] for i in members) for members, _ in plan] == [sorted(short), sorted(long)]
    assert [width for _, width in plan] == [16, 504]
    # Four short rows padded to 472 cost less than a second model call (2048 tokens): one batch.
    few = [12, 9, 15, 11, 470]
    plan = plan_batches(few, max_rows=64, max_tokens=16384, pad_multiple=8, max_width=512, call_cost_tokens=2048)
    assert len(plan) == 1 and plan[0][1] == 472


def encoded(*lengths: int) -> EncodedTexts:
    ids = [np.arange(1, n + 1, dtype=np.int32) for n in lengths]
    return EncodedTexts(ids, None, np.array(lengths, dtype=np.int32))


def policy(**overrides: int) -> BatchPolicy:
    values = {"max_rows": 64, "max_tokens": 4096, "max_in_flight": 1, "pad_multiple": 8, "call_cost_tokens": 0,
              "max_width": 128, "pad_id": 0}
    values.update(overrides)
    return BatchPolicy(**values)  # type: ignore[arg-type]


class StepDouble:
    """Records every batch and answers each row with (its first id, its length); batches wait for `gate`."""

    def __init__(self) -> None:
        self.batches: list[np.ndarray] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail_next = False

    async def __call__(self, ids: np.ndarray, mask: np.ndarray, types: np.ndarray) -> np.ndarray:
        self.batches.append(ids)
        await self.gate.wait()
        if self.fail_next:
            self.fail_next = False
            raise GatewayError("model step failed", status=502, type="triton_error")
        return np.stack([ids[:, 0], mask.sum(1)], axis=1).astype(np.float32)


@pytest.mark.anyio
async def test_rows_come_back_to_their_callers_in_order() -> None:
    step = StepDouble()
    step.gate.clear()
    scheduler = BatchScheduler("m", 2, policy(), step, BatchMetrics("unit"))
    first = asyncio.create_task(scheduler.submit(encoded(5)))
    await asyncio.sleep(0)
    rest = [asyncio.create_task(scheduler.submit(encoded(*lengths))) for lengths in ([90, 3], [7], [100, 4, 60])]
    await asyncio.sleep(0)
    assert len(step.batches) == 1 and scheduler.queued == 6  # one batch in flight, the rest wait
    step.gate.set()
    results = await asyncio.gather(first, *rest)
    for result, lengths in zip(results, ([5], [90, 3], [7], [100, 4, 60])):
        assert result[:, 1].tolist() == lengths
    widths = [b.shape[1] for b in step.batches]
    assert widths[0] == 8 and sorted(widths[1:]) == [8, 104]  # 3, 4, 7 together; 60, 90, 100 together


@pytest.mark.anyio
async def test_abandoned_rows_are_dropped_and_failures_reach_every_caller_of_the_batch() -> None:
    step = StepDouble()
    step.gate.clear()
    scheduler = BatchScheduler("m", 2, policy(), step, BatchMetrics("unit"))
    running = asyncio.create_task(scheduler.submit(encoded(4)))
    await asyncio.sleep(0)
    gone = asyncio.create_task(scheduler.submit(encoded(6, 6)))
    kept = [asyncio.create_task(scheduler.submit(encoded(5))) for _ in range(3)]
    await asyncio.sleep(0)
    gone.cancel()  # the caller timed out while queued
    step.fail_next = True  # the batch in flight fails
    step.gate.set()
    with pytest.raises(GatewayError, match="model step failed"):
        await running
    results = await asyncio.gather(*kept)
    assert all(r[:, 1].tolist() == [5] for r in results)
    assert sum(len(b) for b in step.batches) == 1 + 3  # the cancelled caller's rows never ran
    assert scheduler.queued == 0
