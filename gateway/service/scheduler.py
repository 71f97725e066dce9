"""Length-aware batching of tokenized texts for one model step (the text-embeddings-inference router design).

Callers submit tokenized texts; every text is a row in one queue per model step. While fewer
than `max_in_flight` batches of this step are running, the next batch is formed at once from
the queue (no timer: batches fill up while earlier ones run): the rows are sorted by length
and cut by contract/batching.py's rule (token budget, row limit, bounded padding, each batch
padded only to its own longest row), and the batch holding the oldest row goes first. When a
batch returns, its output rows are scattered back to their callers, in order.

Admission (service/admission.py): the scheduler measures how many tokens per second the step
serves. A caller whose rows would, behind the queued and running ones, not be served in time is
refused at once (`overloaded`, with a retry hint) instead of queueing work nobody will wait for.
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
# (a per-token output: [rows, width, ...], of which each row's first `length` tokens are its own)
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

    def __init__(self, future: asyncio.Future[np.ndarray], outputs: np.ndarray | list[np.ndarray | None],
                 deadline: float) -> None:
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

    def __init__(self, name: str, width: int, policy: BatchPolicy, run_batch: RunBatch, metrics: BatchMetrics,
                 per_token: bool = False) -> None:
        self.name = name
        self.width = width
        self.per_token = per_token  # outputs are per token: each text gets its own [length, ...] rows
        self.policy = policy
        self._run_batch = run_batch
        self._metrics = metrics
        self._queue: list[_Row] = []
        self._in_flight = 0
        self.backlog = Backlog(name, "tokens", policy.max_queue_wait_s)  # queued and running tokens
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def queued(self) -> int:
        """Rows waiting for a batch."""
        return len(self._queue)

    async def submit(self, encoded: EncodedTexts, deadline: float) -> np.ndarray:
        """Outputs [n, width] float32 of the tokenized texts, in order (per token: a list of [length, ...]
        arrays); `overloaded` at once when they could not be served before `deadline` (time.monotonic())."""
        self.backlog.admit(sum(len(ids) for ids in encoded.ids), deadline)
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        outputs: np.ndarray | list[np.ndarray | None] = (
            [None] * len(encoded) if self.per_token else np.empty((len(encoded), self.width), dtype=np.float32))
        caller = _Caller(future, outputs, deadline)
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
        queue = [row for row in self._queue if not row.caller.future.done()]
        if len(queue) < len(self._queue):
            self._metrics.queued(len(queue) - len(self._queue))
            self.backlog.dropped(sum(row.length for row in self._queue if row.caller.future.done()))
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
        concurrency = self._in_flight  # batches sharing the step while this one runs
        start = time.perf_counter()
        try:
            ids, mask, types = self._tensors(batch, rows)
            self._metrics.observe(rows=ids.shape[0], width=ids.shape[1], real=tokens, waited=start - batch[0].since)
            with tracing.batch(self.name, (row.caller.trace for row in batch), rows=len(batch), tokens=tokens,
                               padded_rows=ids.shape[0], width=ids.shape[1]):
                outputs = await self._run_batch(ids, mask, types, max(row.caller.deadline for row in batch))
            self.backlog.served(tokens, time.perf_counter() - start, concurrency)
            handle.served = True
            for row, output in zip(batch, outputs):
                caller = row.caller
                caller.outputs[row.index] = output[: row.length] if self.per_token else output
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

    def _batch_done(self, task: asyncio.Task[None], batch: list[_Row], tokens: int, handle: _Batch) -> None:
        self._tasks.discard(task)
        self._in_flight -= 1
        if not handle.served:  # failed or cancelled
            self.backlog.dropped(tokens)
        for caller in {id(row.caller): row.caller for row in batch}.values():
            caller.batches.remove(handle)
        self._dispatch()

    async def close(self) -> None:
        """Fail what is queued and wait for running batches."""
        for row in self._queue:
            if not row.caller.future.done():
                row.caller.future.set_exception(unavailable("gateway is shutting down", type="shutting_down"))
        self._metrics.queued(-len(self._queue))
        self.backlog.dropped(sum(row.length for row in self._queue))
        self._queue = []
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
