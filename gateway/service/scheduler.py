"""Length-aware batching of tokenized texts for one model step (the text-embeddings-inference router design).

Callers submit tokenized texts; every text is a row in one queue per model step. While fewer
than `max_in_flight` batches of this step are running, the next batch is formed at once from
the queue (no timer: batches fill up while earlier ones run): the rows are sorted by length
and cut by contract/batching.py's rule (token budget, row limit, bounded padding, each batch
padded only to its own longest row), and the batch holding the oldest row goes first. When a
batch returns, its output rows are scattered back to their callers, in order.

Admission (service/admission.py): the scheduler's `backlog` counts the queued and running tokens and
learns what a call of the step costs (per call + per token); the caller checks it before
tokenizing (`backlog.check`), so a request the work ahead would keep waiting too long is refused at
once (`overloaded`, with a retry hint) instead of queueing work nobody will wait for.
A caller that gives up (deadline, disconnect) leaves its rows behind; they are dropped before
the next batch forms, and a running batch none of whose callers still waits is cancelled
(the Triton call with it). A failed batch fails every caller with a row in it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import numpy as np

from contract.batching import Shapes, plan_batches
from contract.tokenization import EncodedTexts
from gateway import tracing
from gateway.errors import ErrorKind, GatewayError, unavailable
from gateway.metrics import BatchMetrics
from gateway.service.admission import Backlog

log = logging.getLogger("gateway.scheduler")

# (input_ids, attention_mask, token_type_ids) [rows, width] int32, deadline -> outputs [rows, width_out] float32
RunBatch = Callable[[np.ndarray, np.ndarray, np.ndarray, float], Awaitable[np.ndarray]]


@dataclass(frozen=True)
class BatchPolicy:
    """How one model step's batches are formed."""

    max_rows: int
    max_tokens: int
    max_in_flight: int
    shapes: Shapes  # the widths and row counts batches take (the step's declared ones, or any)
    call_cost_tokens: int  # what one more model call costs, in tokens (contract/batching.py)
    pad_id: int
    max_queue_wait_s: float = 2.0  # admit only what is expected to be served within this (and its deadline)


class _Batch:
    __slots__ = ("live", "served", "task")

    def __init__(self, live: int) -> None:
        self.task: asyncio.Task[None] | None = None
        self.live = live  # callers of this batch still waiting
        self.served = False  # its tokens left the backlog as served


class _Caller:
    """One submit(): where its rows' outputs go, how many are still missing, and by when."""

    __slots__ = ("future", "outputs", "remaining", "deadline", "batches", "trace")

    def __init__(self, future: asyncio.Future[np.ndarray], outputs: np.ndarray, deadline: float) -> None:
        self.future = future
        self.outputs = outputs
        self.remaining = len(outputs)
        self.deadline = deadline
        self.batches: list[_Batch] = []
        self.trace: tracing.Waiting | None = None  # its `queue` span and request context, when tracing
        future.add_done_callback(self._gone)

    def _gone(self, future: asyncio.Future[np.ndarray]) -> None:
        if not future.cancelled():
            return
        for batch in self.batches:
            batch.live -= 1
            if batch.live == 0 and batch.task is not None:
                batch.task.cancel()  # nobody waits for it: stop the Triton call


class _Row:
    __slots__ = ("caller", "index", "ids", "types", "length", "since")

    def __init__(self, caller: _Caller, index: int, ids: np.ndarray, types: np.ndarray | None, since: float) -> None:
        self.caller = caller
        self.index = index
        self.ids = ids
        self.types = types
        self.length = len(ids)
        self.since = since


class BatchScheduler:
    """The queue and batch former of one model step in one gateway worker."""

    def __init__(self, name: str, width: int, policy: BatchPolicy, run_batch: RunBatch, metrics: BatchMetrics) -> None:
        self.name = name
        self.width = width
        self.policy = policy
        self._run_batch = run_batch
        self._metrics = metrics
        self._queue: list[_Row] = []
        self._in_flight = 0
        self.backlog = Backlog(name, "tokens", policy.max_queue_wait_s, call_units=policy.max_tokens,
                               call_rows=policy.max_rows)  # queued and running tokens and rows
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def queued(self) -> int:
        """Rows waiting for a batch."""
        return len(self._queue)

    async def submit(self, encoded: EncodedTexts, deadline: float) -> np.ndarray:
        """Outputs [n, width] float32 of the tokenized texts, in order, served before `deadline`
        (time.monotonic()) or cancelled with the caller. Admission (`backlog.check`) is the caller's."""
        self.backlog.add(sum(len(ids) for ids in encoded.ids), len(encoded))
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        caller = _Caller(future, np.empty((len(encoded), self.width), dtype=np.float32), deadline)
        caller.trace = tracing.queued(self.name, len(encoded), future)
        now = time.perf_counter()
        types = encoded.type_ids
        rows = [_Row(caller, i, ids, types[i] if types is not None else None, now) for i, ids in enumerate(encoded.ids)]
        self._queue.extend(rows)
        self._metrics.queued(len(rows))
        self._dispatch()
        return await future

    def _dispatch(self) -> None:
        while self._in_flight < self.policy.max_in_flight and self._queue:
            members, rows = self._next_batch()
            if not members:
                return
            self._in_flight += 1
            tokens = sum(row.length for row in members)
            batch = _Batch(len({id(row.caller) for row in members}))
            for caller in {id(row.caller): row.caller for row in members}.values():
                caller.batches.append(batch)
            task = asyncio.get_running_loop().create_task(self._run(members, rows, tokens, batch))
            batch.task = task
            self._tasks.add(task)
            # bookkeeping in a callback, not a `finally`: a task cancelled before it started runs no code
            task.add_done_callback(lambda done, m=members, t=tokens, b=batch: self._batch_done(done, m, t, b))

    def _next_batch(self) -> tuple[list[_Row], int]:
        """Take the batch that holds the oldest row out of the queue (rows in queue order, so the oldest
        first), and the row count it runs with (a declared one: dummy rows fill the rest)."""
        self._expire_late_callers()
        queue = [row for row in self._queue if not row.caller.future.done()]
        if len(queue) < len(self._queue):
            self._metrics.queued(len(queue) - len(self._queue))
            gone = [row.length for row in self._queue if row.caller.future.done()]
            self.backlog.done(sum(gone), len(gone))
        if not queue:
            self._queue = []
            return [], 0
        p = self.policy
        plan = plan_batches([row.length for row in queue], p.shapes, max_rows=p.max_rows, max_tokens=p.max_tokens,
                            call_cost_tokens=p.call_cost_tokens)
        members = next(indices for indices, _ in plan if 0 in indices) if len(plan) > 1 else plan[0][0]
        take, rows = p.shapes.fit_rows(len(members))
        members = sorted(members)[:take]  # a declared row count: the oldest rows go, the others wait
        chosen = set(members)
        self._queue = [row for i, row in enumerate(queue) if i not in chosen]
        batch = [queue[i] for i in members]
        self._metrics.queued(-len(members))
        return batch, rows

    def _expire_late_callers(self) -> None:
        """Answer 504 now to queued callers that a batch could no longer serve before their deadline:
        computing their rows would only delay the callers behind them."""
        latest = time.monotonic() + self.backlog.call_latency_s
        for row in self._queue:
            future = row.caller.future
            if not future.done() and row.caller.deadline < latest:
                future.set_exception(GatewayError(ErrorKind.TIMEOUT, "the request would not be answered before its "
                                                  "deadline"))

    def _tensors(self, batch: list[_Row], rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """input_ids, attention_mask, token_type_ids of a batch, in a declared shape: dummy rows (one
        unmasked pad token each, outputs dropped) bring it to a declared row count."""
        p = self.policy
        lengths = np.zeros(rows, dtype=np.int64)
        lengths[: len(batch)] = [row.length for row in batch]
        width = p.shapes.width(int(lengths.max()))
        real = np.arange(width) < lengths[:, None]
        ids = np.full((rows, width), p.pad_id, dtype=np.int32)
        ids[real] = np.concatenate([row.ids for row in batch])
        types = np.zeros((rows, width), dtype=np.int32)
        if any(row.types is not None for row in batch):
            types[real] = np.concatenate([
                row.types if row.types is not None else np.zeros(row.length, np.int32) for row in batch
            ])
        mask = real.astype(np.int32)
        mask[len(batch):, 0] = 1
        return ids, mask, types

    async def _run(self, batch: list[_Row], rows: int, tokens: int, handle: _Batch) -> None:
        start = time.perf_counter()
        mark = self.backlog.call_started()
        try:
            ids, mask, types = self._tensors(batch, rows)
            self._metrics.observe(rows=ids.shape[0], width=ids.shape[1], real=tokens, waited=start - batch[0].since)
            with tracing.batch(self.name, (row.caller.trace for row in batch), rows=len(batch), tokens=tokens,
                               padded_rows=ids.shape[0], width=ids.shape[1]):
                outputs = await self._run_batch(ids, mask, types, max(row.caller.deadline for row in batch))
            self.backlog.observe_latency(time.perf_counter() - start)
            self.backlog.served(tokens, len(batch), mark)
            handle.served = True
            for row, output in zip(batch, outputs):
                caller = row.caller
                caller.outputs[row.index] = output
                caller.remaining -= 1
                if caller.remaining == 0 and not caller.future.done():
                    caller.future.set_result(caller.outputs)
        except Exception as exc:  # noqa: BLE001 - every caller of the batch must hear about any failure
            if not isinstance(exc, GatewayError):
                log.exception("batch of %s failed", self.name)
                exc = GatewayError(ErrorKind.INTERNAL, "internal error while running a batch")
            for row in batch:
                if not row.caller.future.done():
                    row.caller.future.set_exception(exc)
        finally:
            if not handle.served:
                self.backlog.call_ended(mark)

    def _batch_done(self, task: asyncio.Task[None], batch: list[_Row], tokens: int, handle: _Batch) -> None:
        self._tasks.discard(task)
        self._in_flight -= 1
        if not handle.served:  # failed or cancelled
            self.backlog.done(tokens, len(batch))
        for caller in {id(row.caller): row.caller for row in batch}.values():
            caller.batches.remove(handle)
        self._dispatch()

    async def close(self) -> None:
        """Fail what is queued and wait for running batches."""
        for row in self._queue:
            if not row.caller.future.done():
                row.caller.future.set_exception(unavailable("gateway is shutting down", type="shutting_down"))
        self._metrics.queued(-len(self._queue))
        self.backlog.done(sum(row.length for row in self._queue), len(self._queue))
        self._queue = []
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
