"""Token-budget batching of tokenized texts for one model step (the text-embeddings-inference router design).

Callers submit tokenized texts; every text is a row in one queue per model step. While fewer
than `max_in_flight` batches of this step are running, the next batch is formed at once from
the queue (no timer: batches fill up while earlier ones run). How depends on the step's layout
(docs/contract.md):

- packed (a step that computes only real tokens): rows are taken in arrival order until the
  token budget or the row limit is reached, and sent back to back with their `cu_seqlens`;
  no padding, no sorting, and forming a batch costs O(its rows) whatever the queue holds.
- padded (TensorRT profiles, CPU builds, older builds): rows wait in one queue per padded width
  (each in arrival order). A batch is grown around the oldest queued row: the rows of its width,
  oldest first, then of the next wider widths, then of the narrower ones, for as long as
  contract/batching.py's limits hold (token budget, row limit, bounded padding, padded only to its
  own longest row, in a declared shape). Like the packed layout (and text-embeddings-inference's
  queue), forming a batch costs O(its rows), however many rows are queued, and the oldest row
  always goes in the next batch.

When a batch returns, the next one leaves first (its slot is free), then its output rows are scattered back to
their callers, in order: woken callers write their answers, and a whole batch of them would keep the step idle.

Admission (service/admission.py): the scheduler's `backlog` counts the queued and running tokens and
learns what a call of the step costs (per call + per token); the caller checks it before
tokenizing (`backlog.check`), so a request the work ahead would keep waiting too long is refused at
once (`overloaded`, with a retry hint) instead of queueing work nobody will wait for.
A caller that gives up (deadline, disconnect) has its queued rows dropped and counted out at once;
a running batch none of whose callers still waits is cancelled (the Triton call with it). A
queued caller whose deadline a batch could no longer meet is answered 504 before its rows are
computed. A failed batch fails every caller with a row in it.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

from contract import INPUT_IDS, Layout
from contract.batching import Shapes, within_limits
from contract.tokenization import EncodedTexts
from gateway import tracing
from gateway.errors import ErrorType, GatewayError, unavailable
from gateway.metrics import BatchMetrics
from gateway.service.admission import LANES, Backlog, Lane
from gateway.service.batch_queue import BATCHED, QUEUED, Batch, Caller, LaneQueue, Outputs, Row, RowOutput, deliver
from gateway.service.batch_tensors import StepOutputs, outputs_by_row, packed_tensors, padded_tensors

log = logging.getLogger("gateway.scheduler")

# (named int32 input tensors, rows, deadline) -> outputs [rows, width_out] float32 (a per-token scheduler: its
# per-token output, or several outputs of one call)
RunBatch = Callable[[dict[str, np.ndarray], int, float], Awaitable[np.ndarray | StepOutputs]]
# A batch-lane row leads a batch once its deadline is this many calls away (each call's time as the backlog has
# measured it), or this many seconds, whichever is later: it waits behind interactive work, never past its deadline.
DUE_CALLS = 4
DUE_S = 0.05


@dataclass(frozen=True)
class BatchPolicy:
    """How one model step's batches are formed."""

    max_rows: int
    max_tokens: int
    max_in_flight: int
    shapes: Shapes  # padded: the widths and row counts batches take (the step's declared ones, or any)
    call_cost_tokens: int  # what one more model call costs, in tokens: padded batches' planning, admission's estimate
    pad_id: int
    max_queue_wait_s: float = 2.0  # admit only what the work ahead lets start within this (and its deadline)
    layout: Layout = "padded"


class BatchScheduler:
    """The queue and batch former of one model step in one gateway worker."""

    def __init__(self, name: str, width: int, policy: BatchPolicy, run_batch: RunBatch, metrics: BatchMetrics,
                 per_token: bool = False) -> None:
        self.name = name
        self.width = width
        self.per_token = per_token  # outputs are per token: each text gets its own [length, ...] array
        self.policy = policy
        self._run_batch = run_batch
        self._metrics = metrics
        self._lanes = {lane: LaneQueue(policy.shapes) for lane in LANES}  # interactive first, then batch
        self._seq = itertools.count()
        self._in_flight = 0
        self.backlog = Backlog(name, "tokens", policy.max_queue_wait_s, call_units=policy.max_tokens,
                               call_rows=policy.max_rows, call_cost_units=policy.call_cost_tokens)  # queued, running
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def queued(self) -> int:
        """Rows waiting for a batch."""
        return sum(lane.queued for lane in self._lanes.values())

    async def submit(self, encoded: EncodedTexts, deadline: float, counted: bool = False,
                     lane: Lane = "interactive") -> Outputs:
        """Outputs [n, width] float32 of the tokenized texts, in order, served before `deadline`
        (time.monotonic()) or cancelled with the caller; `lane`: the queue they wait in (service/batch_queue.py).
        Admission (`backlog.check`) is the caller's; `counted`: the caller has counted the texts' tokens and rows
        into the backlog already."""
        if not counted:
            self.backlog.add(sum(len(ids) for ids in encoded.ids), len(encoded), lane=lane)
        future: asyncio.Future[Outputs] = asyncio.get_running_loop().create_future()
        outputs: Outputs = (
            [None] * len(encoded) if self.per_token else np.empty((len(encoded), self.width), dtype=np.float32))
        caller = Caller(future, outputs, deadline, lane, self._dropped)
        caller.trace = tracing.queued(self.name, len(encoded), future)
        now = time.perf_counter()
        types = encoded.type_ids
        caller.rows = [Row(caller, i, ids, types[i] if types is not None else None, now, next(self._seq))
                       for i, ids in enumerate(encoded.ids)]
        self._lanes[lane].append(caller.rows, self.policy.layout == "padded")
        self._metrics.queued(len(caller.rows))
        self._dispatch()
        return await future

    def _dropped(self, rows: list[Row]) -> None:
        """Queued rows whose caller is gone: out of the count and the backlog (skipped when reached)."""
        lane = rows[0].lane
        self._lanes[lane].queued -= len(rows)
        self._metrics.queued(-len(rows))
        self.backlog.done(sum(row.length for row in rows), len(rows), queued_in=lane)

    def _dispatch(self) -> bool:
        """Send batches while the in-flight limit allows and rows are queued; whether any left."""
        sent = False
        while self._in_flight < self.policy.max_in_flight and self.queued:
            members, rows = self._next_batch()
            if not members:
                return sent
            sent = True
            self._in_flight += 1
            tokens = sum(row.length for row in members)
            callers = {id(row.caller): row.caller for row in members}.values()
            batch = Batch(len(callers))
            for caller in callers:
                caller.batches.append(batch)
            task = asyncio.get_running_loop().create_task(self._run(members, rows, tokens, batch))
            batch.task = task
            self._tasks.add(task)
            # bookkeeping in a callback, not a `finally`: a task cancelled before it started runs no code
            task.add_done_callback(functools.partial(self._batch_done, batch=members, tokens=tokens, handle=batch))
        return sent

    def _next_batch(self) -> tuple[list[Row], int]:
        """Take the next batch out of the queues, and the row count it runs with (padded: a declared one, dummy
        rows fill the rest; packed: its own). The interactive lane leads, and the batch lane fills the room it
        leaves (packed: up to a call's fixed cost, `_fill_budget`); a batch-lane row whose deadline is near leads
        instead."""
        now = time.monotonic()
        latest = now + self.backlog.call_latency_s
        interactive, bulk = self._lanes["interactive"], self._lanes["batch"]
        due = now + max(DUE_CALLS * self.backlog.call_latency_s, DUE_S)
        head = self._head(bulk, latest)
        lanes = (bulk, interactive) if head is not None and head.caller.deadline <= due else (interactive, bulk)
        if self.policy.layout == "packed":
            batch: list[Row] = []
            self._take_in_arrival_order(lanes[0], batch, latest, self.policy.max_tokens)
            self._take_in_arrival_order(lanes[1], batch, latest, self._fill_budget(lanes[0], batch))
            rows = len(batch)
        else:
            batch, rows = self._take_planned(lanes, latest)
        for row in batch:
            row.state = BATCHED
            self._lanes[row.lane].queued -= 1
        self._metrics.queued(-len(batch))
        if batch:
            self.backlog.started([row.length for row in batch if row.lane == "batch"])
        return batch, rows

    def _head(self, lane: LaneQueue, latest: float) -> Row | None:
        """The oldest live row of `lane` (rows of callers gone or too late are dropped on the way)."""
        queue = lane.arrivals
        while queue and self._late(queue[0], latest):
            queue.popleft()
        return queue[0] if queue else None

    @staticmethod
    def _late(row: Row, latest: float) -> bool:
        """Whether `row`'s caller is gone, or is answered 504 now because a batch could not serve it in time.
        Its queued rows are counted out by the caller's done-callback (which runs soon, not at once)."""
        future = row.caller.future
        if row.state != QUEUED or future.done():
            return True
        if row.caller.deadline < latest:
            future.set_exception(GatewayError(ErrorType.TIMEOUT, "the request would not be answered before its deadline"))
            return True
        return False

    def _fill_budget(self, lead: LaneQueue, batch: list[Row]) -> int:
        """The tokens a batch may grow to with the other lane's rows. Batch-lane rows joining interactive ones keep
        it within a call's fixed cost (`call_cost_tokens`): the interactive rows' call then takes at most about
        twice its own time, while batch work fills batches of its own."""
        if not batch or lead is self._lanes["batch"]:
            return self.policy.max_tokens
        return max(sum(row.length for row in batch), self.policy.call_cost_tokens)

    def _take_in_arrival_order(self, lane: LaneQueue, batch: list[Row], latest: float, budget: int) -> None:
        """Packed layout: rows of `lane` in arrival order into `batch`, within `budget` tokens and the row limit."""
        p, queue = self.policy, lane.arrivals
        tokens = sum(row.length for row in batch)
        while queue and len(batch) < p.max_rows:
            row = queue[0]
            if self._late(row, latest):
                queue.popleft()
                continue
            if batch and tokens + row.length > budget:
                return
            queue.popleft()
            batch.append(row)
            tokens += row.length

    def _take_planned(self, lanes: tuple[LaneQueue, LaneQueue], latest: float) -> tuple[list[Row], int]:
        """Padded layout: the batch around the oldest live row of the leading lane, grown with its rows and then
        the other lane's, and the row count it runs with."""
        lead = next((row for row in (self._head(lane, latest) for lane in lanes) if row is not None), None)
        if lead is None:
            for lane in lanes:
                lane.by_width.clear()  # what is left there was given up on
            return [], 0
        batch: list[Row] = []
        width = alone = 0
        start = lanes[0].by_width.width(lead)
        room = True
        for lane in lanes:
            by_width = lane.by_width
            for w in by_width.around(start):  # the lead's width and wider ones, then narrower ones
                width, alone, room = self._fill(batch, by_width.rows[w], w, width, alone, latest)
                if not room:
                    break
            by_width.prune()
            if not room:
                break
        take, rows = self.policy.shapes.fit_rows(len(batch))
        if take < len(batch):
            # A declared row count: the rows added first go (the oldest live row leads, and each prefix of the
            # batch passed the limits as it grew); the others wait where they were.
            for row in reversed(batch[take:]):
                self._lanes[row.lane].by_width.put_back(row)
            del batch[take:]
        return batch, rows

    def _fill(self, batch: list[Row], queue: deque[Row], w: int, width: int, alone: int,
              latest: float) -> tuple[int, int, bool]:
        """Move rows of width `w` (oldest first) into `batch` (padded to `width` so far) while it stays within
        contract/batching.py's limits: (its width now, the tokens its rows take alone, whether all fitted)."""
        p = self.policy
        while queue:
            row = queue[0]
            if self._late(row, latest):
                queue.popleft()
                continue
            if batch and not within_limits(len(batch) + 1, max(width, w), alone + w, max_rows=p.max_rows,
                                           max_tokens=p.max_tokens, call_cost_tokens=p.call_cost_tokens):
                return width, alone, False
            batch.append(queue.popleft())
            width, alone = max(width, w), alone + w
        return width, alone, True

    async def _run(self, batch: list[Row], rows: int, tokens: int, handle: Batch) -> None:
        start = time.perf_counter()
        mark = self.backlog.call_started()
        results: list[RowOutput] | None = None
        try:
            p, ids, types = self.policy, [row.ids for row in batch], [row.types for row in batch]
            if p.layout == "packed":
                tensors = packed_tensors(ids, types)
                computed, width = tokens, max(row.length for row in batch)
            else:
                tensors = padded_tensors(ids, types, rows, p.shapes, p.pad_id)
                computed, width = tensors[INPUT_IDS].size, tensors[INPUT_IDS].shape[1]
            self._metrics.observe(rows=rows, computed=computed, real=tokens, waited=start - batch[0].since)
            for lane in LANES:  # each lane's oldest row in this batch
                oldest = next((row for row in batch if row.lane == lane), None)
                if oldest is not None:
                    self._metrics.lane_waited(lane, start - oldest.since)
            with tracing.batch(self.name, (row.caller.trace for row in batch), rows=len(batch), tokens=tokens,
                               padded_rows=rows, width=width, computed_tokens=computed):
                outputs = await self._run_batch(tensors, rows, max(row.caller.deadline for row in batch))
            self.backlog.observe_latency(time.perf_counter() - start)
            self.backlog.served(tokens, len(batch), mark)
            handle.served = True
            results = outputs_by_row(outputs, [row.length for row in batch], tensors, self.per_token)
        except Exception as exc:  # noqa: BLE001 - every caller of the batch must hear about any failure
            if not isinstance(exc, GatewayError):
                log.exception("batch of %s failed", self.name)
                exc = GatewayError(ErrorType.INTERNAL_ERROR, "internal error while running a batch")
            for row in batch:
                if not row.caller.future.done():
                    row.caller.future.set_exception(exc)
        finally:
            if not handle.served:
                self.backlog.call_ended(mark)
        if results is not None:
            # The next batch goes to Triton before this one's callers wake: woken now, each would write its answer
            # first (a whole batch of them, a few ms of the event loop under load) while the step waits for work.
            # So when a next batch left, the callers wake in the next turn of the loop, after its call has started.
            sent = False
            try:
                sent = self._release(handle)
            finally:
                if sent:
                    asyncio.get_running_loop().call_soon(deliver, batch, results)
                else:
                    deliver(batch, results)

    def _release(self, handle: Batch) -> bool:
        """Free the in-flight slot of a batch whose call has ended, and send the next batch; whether one left."""
        if handle.released:
            return False
        handle.released = True
        self._in_flight -= 1
        return self._dispatch()

    def _batch_done(self, task: asyncio.Task[None], batch: list[Row], tokens: int, handle: Batch) -> None:
        self._tasks.discard(task)
        if not handle.served:  # failed or cancelled
            self.backlog.done(tokens, len(batch))
        for caller in {id(row.caller): row.caller for row in batch}.values():
            caller.batches.remove(handle)
        self._release(handle)

    async def close(self) -> None:
        """Fail what is queued and wait for running batches."""
        self.backlog.shedding = False  # a scheduler that is gone refuses nothing
        for lane in self._lanes.values():
            for row in list(lane.arrivals):
                if row.state == QUEUED and not row.caller.future.done():
                    row.caller.future.set_exception(unavailable("gateway is shutting down", type=ErrorType.SHUTTING_DOWN))
            lane.clear()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
