"""The batching rule (contract/batching.py) and the BatchScheduler's queue semantics, in-process.

The scheduler's `run_batch` here is a plain coroutine standing in for the model step, so the
tests can hold batches open and fail them at will; the real Triton path is in test_scheduler.py.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contract import ATTENTION_MASK, CU_SEQLENS, INPUT_IDS
from contract.batching import PAD_RATIO_LIMIT, Shapes, default_rows, default_widths, plan_batches, within_limits
from contract.tokenization import EncodedTexts
from gateway.errors import ErrorKind, ErrorType, GatewayError
from gateway.metrics import BatchMetrics
from gateway.service.admission import MIN_CALLS
from gateway.service.scheduler import BatchPolicy, BatchScheduler
from tests.fixtures.waiting import until


@settings(max_examples=300, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 512), min_size=1, max_size=300),
    max_rows=st.integers(1, 64),
    max_tokens=st.integers(512, 20000),
    declared=st.booleans(),
    call_cost=st.sampled_from([0, 64, 2048]),
)
def test_plan_covers_every_row_once_within_limits(
    lengths: list[int], max_rows: int, max_tokens: int, declared: bool, call_cost: int
) -> None:
    shapes = Shapes(512, default_widths(512), default_rows(max_rows)) if declared else Shapes(512)
    plan = plan_batches(lengths, shapes, max_rows=max_rows, max_tokens=max_tokens, call_cost_tokens=call_cost)
    seen = sorted(i for members, _ in plan for i in members)
    assert seen == list(range(len(lengths)))
    previous_max = 0
    for members, width in plan:
        rows = [lengths[i] for i in members]
        assert rows == sorted(rows) and min(rows) >= previous_max  # batches follow length order
        previous_max = max(rows)
        assert width == shapes.width(max(rows)) and width >= max(rows)
        assert width in shapes.widths if declared else width == max(rows)
        assert len(members) <= max_rows and (len(members) == 1 or len(members) * width <= max_tokens)
        if len(members) > 1:
            alone = sum(shapes.width(n) for n in rows)
            assert len(members) * width <= PAD_RATIO_LIMIT * alone + call_cost
        take, run = shapes.fit_rows(len(members))
        assert 1 <= take <= len(members) and run >= take and (not declared or run in shapes.rows)
        assert run - take <= 0.25 * take


def test_plan_keeps_short_and_long_texts_apart_but_merges_what_a_call_costs() -> None:
    short, long = [12, 9, 15, 11] * 4, [480, 500, 470]
    lengths = short + long
    shapes = Shapes(512, default_widths(512), default_rows(64))
    plan = plan_batches(lengths, shapes, max_rows=64, max_tokens=16384, call_cost_tokens=2048)
    assert [sorted(lengths[i] for i in members) for members, _ in plan] == [sorted(short), sorted(long)]
    assert [width for _, width in plan] == [16, 512]
    # Four short rows padded to 512 cost less than a second model call (2048 tokens): one batch.
    few = [12, 9, 15, 11, 470]
    plan = plan_batches(few, shapes, max_rows=64, max_tokens=16384, call_cost_tokens=2048)
    assert len(plan) == 1 and plan[0][1] == 512


def test_declared_shapes() -> None:
    shapes = Shapes(300, default_widths(300), default_rows(48))
    assert shapes.widths[-1] == 300 and shapes.rows == (1, 2, 4, 8, 16, 32, 48)
    assert [shapes.width(n) for n in (1, 8, 9, 65, 257, 300, 999)] == [8, 8, 16, 80, 300, 300, 300]
    # 7 rows: one dummy row to 8 (14%); 5 rows: 8 would be 60% dummies, so 4 go and 1 waits.
    assert shapes.fit_rows(7) == (7, 8) and shapes.fit_rows(5) == (4, 4) and shapes.fit_rows(48) == (48, 48)
    assert (1, 8) in shapes.warm_shapes(16384) and (48, 300) not in shapes.warm_shapes(8192)
    assert Shapes(64).fit_rows(5) == (5, 5) and Shapes(64).width(17) == 17


def encoded(*lengths: int) -> EncodedTexts:
    ids = [np.arange(1, n + 1, dtype=np.int32) for n in lengths]
    return EncodedTexts(ids, None, np.array(lengths, dtype=np.int32))


def policy(**overrides: object) -> BatchPolicy:
    values: dict[str, object] = {"max_rows": 64, "max_tokens": 4096, "max_in_flight": 1, "call_cost_tokens": 0,
                                 "shapes": Shapes(128, tuple(range(8, 129, 8))), "pad_id": 0}
    values.update(overrides)
    return BatchPolicy(**values)  # type: ignore[arg-type]


class StepDouble:
    """Records every batch and answers each row with (its first id, its length); batches wait for `gate`."""

    def __init__(self) -> None:
        self.batches: list[np.ndarray] = []  # input_ids of each call
        self.calls: list[dict[str, np.ndarray]] = []
        self.deadlines: list[float] = []
        self.cancelled = 0
        self.tasks: list[asyncio.Task[object]] = []  # the task of each call (a cancel request shows on it at once)
        self.gate = asyncio.Event()
        self.gate.set()
        self.fail_next = False

    async def __call__(self, tensors: dict[str, np.ndarray], rows: int, deadline: float) -> np.ndarray:
        ids = tensors[INPUT_IDS]
        self.batches.append(ids)
        self.calls.append(tensors)
        self.deadlines.append(deadline)
        task = asyncio.current_task()
        assert task is not None
        self.tasks.append(task)
        try:
            await self.gate.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        if self.fail_next:
            self.fail_next = False
            raise GatewayError(ErrorType.TRITON_ERROR, "model step failed")
        if CU_SEQLENS in tensors:  # packed: rows back to back
            cu = tensors[CU_SEQLENS][0]
            assert len(cu) == rows + 1 and cu[-1] == ids.shape[1]
            return np.stack([ids[0, cu[:-1]], np.diff(cu)], axis=1).astype(np.float32)
        mask = tensors[ATTENTION_MASK]
        assert ids.shape[0] == rows
        return np.stack([ids[:, 0], mask.sum(1)], axis=1).astype(np.float32)


def later(seconds: float = 60.0) -> float:
    """A deadline `seconds` from now."""
    return time.monotonic() + seconds


async def bulk_then_quick_behind_a_running_batch(step: StepDouble, scheduler: BatchScheduler) -> None:
    """Six 20-token batch-lane rows, then two interactive ones (first ids 1, lengths 30 and 31), queued behind the one
    batch in flight; then every batch runs."""
    running = asyncio.ensure_future(scheduler.submit(encoded(10), later()))  # holds the one batch in flight
    await until(lambda: len(step.batches) == 1)
    bulk = asyncio.ensure_future(scheduler.submit(encoded(*[20] * 6), later(), lane="batch"))
    quick = asyncio.ensure_future(scheduler.submit(encoded(30, 31), later()))
    await until(lambda: scheduler.queued == 8)
    step.gate.set()
    await asyncio.gather(running, bulk, quick)


def held_scheduler(**overrides: object) -> tuple[StepDouble, BatchScheduler]:
    """A scheduler (one batch in flight) whose model step holds every batch until `step.gate` is set."""
    step = StepDouble()
    step.gate.clear()
    return step, BatchScheduler("m", 2, policy(**overrides), step, BatchMetrics("unit"))


@pytest.mark.anyio
async def test_rows_come_back_to_their_callers_in_order() -> None:
    step, scheduler = held_scheduler()
    first = asyncio.create_task(scheduler.submit(encoded(5), later()))
    await until(lambda: len(step.batches) == 1, "the first batch in flight")
    rest = [asyncio.create_task(scheduler.submit(encoded(*lengths), later())) for lengths in ([90, 3], [7], [100, 4, 60])]
    await until(lambda: scheduler.queued == 6, "the other rows queued")
    assert len(step.batches) == 1  # one batch in flight, the rest wait
    step.gate.set()
    results = await asyncio.gather(first, *rest)
    for result, lengths in zip(results, ([5], [90, 3], [7], [100, 4, 60])):
        assert result[:, 1].tolist() == lengths
    widths = [b.shape[1] for b in step.batches]
    assert widths[0] == 8 and sorted(widths[1:]) == [8, 104]  # 3, 4, 7 together; 60, 90, 100 together


@pytest.mark.anyio
async def test_the_next_batch_is_sent_before_the_callers_of_the_last_one_wake() -> None:
    """A woken caller writes its answer at once; a batch's worth of them would keep the step waiting. So when a
    batch returns, the queued rows go out first, and its callers wake after that call has started."""
    step, scheduler = held_scheduler()
    calls_seen_by: dict[str, int] = {}

    async def caller(name: str, lengths: tuple[int, ...]) -> None:
        await scheduler.submit(encoded(*lengths), later())
        calls_seen_by[name] = len(step.batches)

    first = asyncio.create_task(caller("first", (5, 6)))
    await until(lambda: len(step.batches) == 1, "the first batch in flight")
    second = asyncio.create_task(caller("second", (7,)))
    await until(lambda: scheduler.queued == 1, "the next row queued")
    step.gate.set()
    await asyncio.gather(first, second)
    assert calls_seen_by == {"first": 2, "second": 2}


@pytest.mark.anyio
async def test_abandoned_rows_are_dropped_and_failures_reach_every_caller_of_the_batch() -> None:
    step, scheduler = held_scheduler()
    running = asyncio.create_task(scheduler.submit(encoded(4), later()))
    await until(lambda: len(step.batches) == 1, "the first batch in flight")
    gone = asyncio.create_task(scheduler.submit(encoded(6, 6), later()))
    kept = [asyncio.create_task(scheduler.submit(encoded(5), later())) for _ in range(3)]
    await until(lambda: scheduler.queued == 5, "the other rows queued")
    gone.cancel()  # the caller timed out while queued
    step.fail_next = True  # the batch in flight fails
    step.gate.set()
    with pytest.raises(GatewayError, match="model step failed"):
        await running
    results = await asyncio.gather(*kept)
    assert all(r[:, 1].tolist() == [5] for r in results)
    assert sum(len(b) for b in step.batches) == 1 + 3  # the cancelled caller's rows never ran
    assert scheduler.queued == 0


@pytest.mark.anyio
async def test_batches_keep_to_declared_shapes() -> None:
    step, scheduler = held_scheduler(shapes=Shapes(128, (16, 32, 64, 128), (1, 2, 4, 8)), max_rows=8)
    first = asyncio.create_task(scheduler.submit(encoded(5), later()))
    await until(lambda: len(step.batches) == 1, "the first batch in flight")
    five = [asyncio.create_task(scheduler.submit(encoded(3 + i), later())) for i in range(5)]  # 5 rows: 4 go, then 1
    await until(lambda: scheduler.queued == 5, "the five rows queued")
    step.gate.set()
    assert (await first)[:, 1].tolist() == [5]
    assert [(await t)[:, 1].tolist() for t in five] == [[3], [4], [5], [6], [7]]
    assert [b.shape for b in step.batches] == [(1, 16), (4, 16), (1, 16)]
    assert step.batches[1][:, 0].tolist() == [1, 1, 1, 1]  # the four oldest, each its own real row
    step.batches.clear()
    seven = await scheduler.submit(encoded(*range(20, 27)), later())  # 7 rows: one dummy row makes 8
    assert seven[:, 1].tolist() == list(range(20, 27)) and [b.shape for b in step.batches] == [(8, 32)]


def numbered(first: int, *lengths: int) -> EncodedTexts:
    """Rows whose first id is their number (first, first + 1, ...) and whose other ids are 1."""
    ids = [np.array([first + k] + [1] * (n - 1), dtype=np.int32) for k, n in enumerate(lengths)]
    return EncodedTexts(ids, None, np.array(lengths, dtype=np.int32))


@settings(max_examples=60, deadline=None)
@given(
    callers=st.lists(st.lists(st.integers(1, 128), min_size=1, max_size=12), min_size=1, max_size=25),
    max_rows=st.integers(1, 16),
    max_tokens=st.sampled_from([128, 512, 4096]),
    declared=st.booleans(),
    call_cost=st.sampled_from([0, 64, 1024]),
)
def test_padded_batches_keep_the_rule_serve_the_oldest_row_first_and_every_row_once(
    callers: list[list[int]], max_rows: int, max_tokens: int, declared: bool, call_cost: int
) -> None:
    shapes = Shapes(128, default_widths(128), default_rows(max_rows)) if declared else Shapes(128)

    async def scenario() -> None:
        step, scheduler = held_scheduler(shapes=shapes, max_rows=max_rows, max_tokens=max_tokens,
                                         call_cost_tokens=call_cost)
        tasks, first = [], 1
        for lengths in callers:  # the first caller's batch runs (held), the others queue behind it
            tasks.append(asyncio.create_task(scheduler.submit(numbered(first, *lengths), later())))
            first += len(lengths)
            await until(lambda: len(step.batches) == 1, "the first batch in flight")
        step.gate.set()
        results = await asyncio.gather(*tasks)
        for result, lengths in zip(results, callers):
            assert result[:, 1].tolist() == lengths  # every row answered with its own length, in order
        served: list[int] = []
        for k, call in enumerate(step.calls):
            ids, mask = call[INPUT_IDS], call[ATTENTION_MASK]
            real = ids[:, 0] > 0
            numbers, lengths = ids[real, 0].tolist(), mask[real].sum(1).tolist()
            waiting = [n for n in range(1, first) if n not in served]
            assert k == 0 or min(numbers) == waiting[0]  # the oldest row still queued is in the next batch
            widths = [shapes.width(n) for n in lengths]
            assert ids.shape[1] == shapes.width(max(lengths))  # padded only to its own longest row
            assert within_limits(len(numbers), ids.shape[1], sum(widths), max_rows=max_rows, max_tokens=max_tokens,
                                 call_cost_tokens=call_cost)
            assert not declared or ids.shape[0] in shapes.rows
            served += numbers
        assert sorted(served) == list(range(1, first))  # each row once
        assert scheduler.queued == 0 and scheduler.backlog.pending == 0

    asyncio.run(scenario())


@pytest.mark.anyio
async def test_forming_a_padded_batch_looks_at_its_own_rows_not_the_whole_queue(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows by width: a batch taken out of 5,000 queued rows examines about as many rows as it takes (the
    queue's depth never counts)."""
    widths = default_widths(512)
    step, scheduler = held_scheduler(shapes=Shapes(512, widths, default_rows(64)), max_tokens=16384,
                                     call_cost_tokens=1024)
    running = asyncio.create_task(scheduler.submit(encoded(5), later()))
    await until(lambda: len(step.batches) == 1, "the first batch in flight")
    lengths = np.random.default_rng(7).integers(3, 512, 5000).tolist()
    queued = [asyncio.create_task(scheduler.submit(encoded(*lengths[k:k + 50]), later())) for k in range(0, 5000, 50)]
    await until(lambda: scheduler.queued == 5000, "5,000 rows queued")
    looked = 0
    batches: list[tuple[int, int, int]] = []  # (rows queued, rows taken, rows looked at) of each batch formed
    late, next_batch = BatchScheduler._late, BatchScheduler._next_batch

    def counted_late(row: object, latest: float) -> bool:
        nonlocal looked
        looked += 1
        return late(row, latest)  # type: ignore[arg-type]

    def counted_batch(self: BatchScheduler) -> object:
        nonlocal looked
        looked, depth = 0, self.queued
        taken, rows = next_batch(self)
        batches.append((depth, len(taken), looked))
        return taken, rows

    monkeypatch.setattr(BatchScheduler, "_late", staticmethod(counted_late))
    monkeypatch.setattr(BatchScheduler, "_next_batch", counted_batch)
    step.gate.set()
    await asyncio.gather(running, *queued)
    assert sum(taken for _, taken, _ in batches) == 5000 and all(1 <= taken <= 64 for _, taken, _ in batches)
    depth, taken, looked = batches[0]
    assert depth == 5000 and looked <= taken + 2 + len(widths), batches[0]
    # a batched row is looked at once more when it reaches the front of the arrival order: twice per row in all
    assert sum(looked for *_, looked in batches) <= 2 * 5000 + len(batches) * (2 + len(widths)), batches


@pytest.mark.anyio
async def test_only_the_work_ahead_refuses_a_caller_never_its_own_size() -> None:
    step, scheduler = held_scheduler()
    backlog = scheduler.backlog
    backlog.check(later(0.01))  # nothing measured yet: everything is admitted
    for tokens, seconds in ((10, 0.1), (100, 1.0)) * (MIN_CALLS // 2):  # as if measured: 10 ms a token, no fixed cost
        backlog.service.observe(tokens, seconds)
    backlog.check(later(0.01))  # idle: admitted, however large it is and however little time it has
    running = asyncio.create_task(scheduler.submit(encoded(50), later()))  # 0.5 s of work ahead from now
    await until(lambda: len(step.batches) == 1, "the batch in flight")
    with pytest.raises(GatewayError) as refused:
        backlog.check(later(0.6))  # 0.5 s ahead is over 80% of 0.6 s
    assert refused.value.kind is ErrorKind.OVERLOADED and backlog.shedding
    assert refused.value.retry_after_s == pytest.approx(0.5)  # when the work ahead should be done
    assert scheduler.queued == 0  # nothing was queued for it
    backlog.check(later(5))  # the same work ahead, time enough to wait for it: admitted
    assert not backlog.shedding
    admitted = asyncio.create_task(scheduler.submit(encoded(*[10] * 40), later(5)))
    await until(lambda: scheduler.queued == 40, "the admitted rows queued")
    assert backlog.pending == 50 + 400 and backlog.pending_rows == 41
    step.gate.set()
    assert (await running)[:, 1].tolist() == [50] and (await admitted)[:, 1].tolist() == [10] * 40
    assert backlog.pending == 0 and backlog.pending_rows == 0
    assert backlog.service.calls == MIN_CALLS + 2  # learned from both batches


@pytest.mark.anyio
async def test_a_running_batch_nobody_waits_for_is_cancelled_and_carries_the_latest_deadline() -> None:
    step, scheduler = held_scheduler()
    blocker = asyncio.create_task(scheduler.submit(encoded(4), later()))
    await until(lambda: len(step.batches) == 1, "the blocker's batch in flight")
    deadlines = [later(5), later(9)]
    first = asyncio.create_task(scheduler.submit(encoded(5), deadlines[0]))
    second = asyncio.create_task(scheduler.submit(encoded(6), deadlines[1]))
    await until(lambda: scheduler.queued == 2, "both rows queued")
    assert len(step.batches) == 1
    blocker.cancel()  # its only caller gave up: the batch is cancelled and the next one starts
    await until(lambda: step.cancelled == 1 and len(step.batches) == 2, "the blocker's batch cancelled, the next sent")
    assert step.batches[1].shape[0] == 2 and step.deadlines[1] == deadlines[1]  # both callers, the later deadline
    first.cancel()
    await asyncio.gather(first, return_exceptions=True)  # its caller's bookkeeping has run
    assert not step.tasks[1].cancelling()  # the second caller still waits for it: no cancel was asked
    second.cancel()
    await asyncio.gather(second, return_exceptions=True)
    assert step.tasks[1].cancelling()  # nobody waits: the call is cancelled
    await asyncio.gather(step.tasks[1], return_exceptions=True)
    assert step.cancelled == 2
    step.gate.set()
    third = await scheduler.submit(encoded(7), later())
    assert third[:, 1].tolist() == [7] and scheduler.queued == 0
    assert scheduler.backlog.pending == 0  # served, dropped and cancelled tokens all left the backlog


@pytest.mark.anyio
async def test_packed_batches_take_rows_in_arrival_order_under_the_token_budget_with_no_padding() -> None:
    step, scheduler = held_scheduler(layout="packed", max_tokens=100, max_rows=3)
    first = asyncio.create_task(scheduler.submit(encoded(5), later()))
    await until(lambda: len(step.batches) == 1, "the first batch in flight")
    rest = [asyncio.create_task(scheduler.submit(encoded(*lengths), later())) for lengths in ([90, 3], [7, 1, 2], [60])]
    await until(lambda: scheduler.queued == 6, "the other rows queued")
    step.gate.set()
    results = await asyncio.gather(first, *rest)
    for result, lengths in zip(results, ([5], [90, 3], [7, 1, 2], [60])):
        assert result[:, 1].tolist() == lengths and result[:, 0].tolist() == [1] * len(lengths)
    # arrival order, cut by the budget (100 tokens) and the row limit (3), never sorted or padded
    assert [np.diff(c[CU_SEQLENS][0]).tolist() for c in step.calls] == [[5], [90, 3, 7], [1, 2, 60]]
    assert all(c[INPUT_IDS].shape == (1, int(c[CU_SEQLENS][0, -1])) and ATTENTION_MASK not in c for c in step.calls)
    assert scheduler.backlog.pending == 0 and scheduler.queued == 0


@pytest.mark.anyio
async def test_a_packed_callers_rows_leave_the_backlog_the_moment_it_gives_up() -> None:
    step, scheduler = held_scheduler(layout="packed")
    running = asyncio.create_task(scheduler.submit(encoded(4), later()))
    await until(lambda: len(step.batches) == 1, "the first batch in flight")
    leaver = asyncio.create_task(scheduler.submit(encoded(30, 40), later()))
    stays = asyncio.create_task(scheduler.submit(encoded(6), later()))
    await until(lambda: scheduler.queued == 3, "both callers' rows queued")
    assert scheduler.backlog.pending == 80
    leaver.cancel()
    await asyncio.gather(leaver, return_exceptions=True)  # its future's done-callback ran before the task woke
    assert scheduler.backlog.pending == 10 and scheduler.queued == 1  # counted out before any batch forms
    step.gate.set()
    assert (await running)[:, 1].tolist() == [4] and (await stays)[:, 1].tolist() == [6]
    assert [np.diff(c[CU_SEQLENS][0]).tolist() for c in step.calls] == [[4], [6]]  # the leaver's rows never ran
    assert scheduler.backlog.pending == 0


# --- lanes: interactive first, batch work in the room left and never past its deadline ---------------------------
@pytest.mark.anyio
@pytest.mark.parametrize("layout", ["padded", "packed"])
async def test_interactive_rows_go_first_and_batch_rows_fill_the_room(layout: str) -> None:
    # packed: batch-lane rows fill an interactive batch up to a call's fixed cost, here 101 tokens (room for two)
    step, scheduler = held_scheduler(max_rows=4, layout=layout, call_cost_tokens=101 if layout == "packed" else 0)
    await bulk_then_quick_behind_a_running_batch(step, scheduler)
    firsts = [sorted(int(n) for n in (b[0, :] if layout == "packed" else b[:, 0])) for b in step.batches[1:]]
    # the interactive rows (first ids 1, lengths 30 and 31) lead the second batch; bulk rows fill its room
    lengths = [sorted(int(x) for x in (np.diff(c[CU_SEQLENS][0]) if layout == "packed" else c[ATTENTION_MASK].sum(1)))
               for c in step.calls[1:]]
    assert lengths[0] == [20, 20, 30, 31] and sorted(sum(lengths[1:], [])) == [20] * 4, (lengths, firsts)


@pytest.mark.anyio
@pytest.mark.parametrize(("cost", "joined"), [(0, 0), (81, 1), (101, 2), (4096, 6)])
async def test_batch_rows_fill_an_interactive_batch_up_to_a_calls_cost(cost: int, joined: int) -> None:
    """Packed: an interactive batch takes batch-lane rows while it holds at most `call_cost_tokens` tokens (its
    interactive rows alone may hold more); the others wait for batches of their own."""
    step, scheduler = held_scheduler(max_rows=8, layout="packed", call_cost_tokens=cost)
    await bulk_then_quick_behind_a_running_batch(step, scheduler)
    lengths = [sorted(int(x) for x in np.diff(c[CU_SEQLENS][0])) for c in step.calls[1:]]
    assert lengths[0] == sorted([30, 31, *[20] * joined])
    assert sorted(sum(lengths[1:], [])) == [20] * (6 - joined)


@pytest.mark.anyio
async def test_a_batch_row_near_its_deadline_leads_over_interactive_rows() -> None:
    step, scheduler = held_scheduler(max_rows=2, layout="packed")
    running = asyncio.ensure_future(scheduler.submit(encoded(10), later()))
    await until(lambda: len(step.batches) == 1)
    soon = asyncio.ensure_future(scheduler.submit(encoded(20), time.monotonic() + 5.0, lane="batch"))
    relaxed = asyncio.ensure_future(scheduler.submit(encoded(21), later(), lane="batch"))
    quick = asyncio.ensure_future(scheduler.submit(encoded(30, 31, 32, 33), later()))
    await until(lambda: scheduler.queued == 6)
    scheduler.backlog.call_latency_s = 2.0  # as measured: a call takes 2 s, so the first bulk row is due within 4
    step.gate.set()
    await asyncio.gather(running, soon, relaxed, quick)
    lengths = [sorted(int(x) for x in np.diff(c[CU_SEQLENS][0])) for c in step.calls[1:]]
    assert lengths[0] == [20, 21]  # the bulk lane leads (its first row is due), its other row fills the room
    assert sorted(sum(lengths[1:], [])) == [30, 31, 32, 33]


@pytest.mark.anyio
async def test_the_backlog_counts_queued_batch_work_out_of_an_interactive_requests_wait() -> None:
    step, scheduler = held_scheduler(max_rows=4, layout="packed")
    backlog = scheduler.backlog
    for _ in range(MIN_CALLS):
        backlog.service.observe(100, 0.1)  # as if measured: 1 ms a token
    running = asyncio.ensure_future(scheduler.submit(encoded(10), later()))
    await until(lambda: len(step.batches) == 1)
    bulk = asyncio.ensure_future(scheduler.submit(encoded(*[100] * 8), later(), lane="batch"))
    await until(lambda: scheduler.queued == 8)
    assert backlog.wait_s("interactive") < backlog.wait_s("batch")  # 800 queued bulk tokens it overtakes
    assert backlog.queued_batch == 800
    step.gate.set()
    await asyncio.gather(running, bulk)
    assert backlog.pending == backlog.queued_batch == backlog.queued_batch_rows == 0


@pytest.mark.parametrize(("on_gpu", "instances", "workers", "setting", "expected"), [
    (True, 4, 1, "auto", 8),  # a GPU instance keeps a batch ready behind the one it runs
    (True, 4, 8, "auto", 1),  # shared by the workers, at least 1 each
    (False, 1, 1, "auto", 1),  # a CPU instance: one, and the texts behind it form the next batch
    (False, 2, 1, "3", 6),  # a number is per instance on any device
])
def test_batches_in_flight_follow_the_device_and_the_instances(on_gpu: bool, instances: int, workers: int,
                                                               setting: str, expected: int) -> None:
    from gateway.service.inference.pipeline import batches_in_flight
    from gateway.service.registry import Endpoint
    from gateway.settings import GatewaySettings

    endpoint = Endpoint("m_ensemble", "onnx", 8, step_model="m_onnx", step_on_gpu=on_gpu, step_instances=instances)
    settings = GatewaySettings(max_batches_in_flight=setting, workers=workers)  # type: ignore[arg-type]
    assert batches_in_flight(settings, endpoint) == expected
