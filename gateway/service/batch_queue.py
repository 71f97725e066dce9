"""The rows a model step's scheduler queues (service/scheduler.py): each text of a request is a row, kept in its
caller's lane, in arrival order and, for the padded layout, by the width a batch pads it to.

Two lanes (`Lane`): `interactive` rows go into batches first; `batch` rows fill batches of their own (and join
interactive ones only up to a call's fixed cost), and lead a batch themselves once their deadline is near, so that
bulk work waits behind interactive work but never past its deadline.
"""

from __future__ import annotations

import asyncio
import bisect
from collections import deque
from collections.abc import Callable, Iterable

import numpy as np

from contract.batching import Shapes
from gateway import tracing
from gateway.service.admission import Lane

# What one text gets of a per-token scheduler: its [tokens_i, ...] array, or one array per output when a call asks
# the step for several (service/batch_tensors.py StepOutputs).
RowOutput = np.ndarray | tuple[np.ndarray, ...]
# what a caller gets: [n, width] float32, or per token (`per_token`) one RowOutput per text
Outputs = np.ndarray | list[RowOutput | None]
QUEUED, BATCHED, DROPPED = 0, 1, 2


class Batch:
    """One batch in flight, as its callers see it."""

    __slots__ = ("live", "served", "released", "task")

    def __init__(self, live: int) -> None:
        self.task: asyncio.Task[None] | None = None
        self.live = live  # callers of this batch still waiting
        self.served = False  # its tokens left the backlog as served
        self.released = False  # its in-flight slot is free again


class Row:
    __slots__ = ("caller", "index", "ids", "types", "length", "since", "seq", "state")

    def __init__(self, caller: Caller, index: int, ids: np.ndarray, types: np.ndarray | None, since: float,
                 seq: int) -> None:
        self.caller = caller
        self.index = index
        self.ids = ids
        self.types = types
        self.length = len(ids)
        self.since = since
        self.seq = seq  # arrival order
        self.state = QUEUED

    @property
    def lane(self) -> Lane:
        return self.caller.lane


class Caller:
    """One submit(): where its rows' outputs go, how many are still missing, by when, and in which lane."""

    __slots__ = ("future", "outputs", "remaining", "deadline", "lane", "batches", "trace", "rows", "on_gone")

    def __init__(self, future: asyncio.Future[Outputs], outputs: Outputs, deadline: float, lane: Lane,
                 on_gone: Callable[[list[Row]], None]) -> None:
        self.future = future
        self.outputs = outputs
        self.remaining = len(outputs)
        self.deadline = deadline
        self.lane = lane
        self.batches: list[Batch] = []
        self.trace: tracing.Waiting | None = None  # its `queue` span and request context, when tracing
        self.rows: list[Row] = []
        self.on_gone = on_gone
        future.add_done_callback(self._done)

    def _done(self, future: asyncio.Future[Outputs]) -> None:
        queued = [row for row in self.rows if row.state == QUEUED]
        for row in queued:
            row.state = DROPPED
        if queued:
            self.on_gone(queued)  # the caller gave up or failed: its queued rows leave at once
        if not future.cancelled():
            return
        for batch in self.batches:
            batch.live -= 1
            if batch.live == 0 and batch.task is not None:
                batch.task.cancel()  # nobody waits for it: stop the Triton call


def deliver(batch: list[Row], results: list[RowOutput]) -> None:
    """Each row's output to its caller; a caller whose rows are all in is woken with them (unless it gave up)."""
    for row, output in zip(batch, results):
        caller = row.caller
        caller.outputs[row.index] = output
        caller.remaining -= 1
        if caller.remaining == 0 and not caller.future.done():
            caller.future.set_result(caller.outputs)


class WidthQueues:
    """The padded layout's queue: rows by the width a batch pads them to, each width in arrival order,
    and the widths that have rows, sorted (rows given up on stay until a batch reaches them)."""

    def __init__(self, shapes: Shapes) -> None:
        self.shapes = shapes
        self.rows: dict[int, deque[Row]] = {}
        self.widths: list[int] = []

    def width(self, row: Row) -> int:
        return self.shapes.width(row.length)

    def _queue(self, width: int) -> deque[Row]:
        queue = self.rows.get(width)
        if queue is None:
            queue = self.rows[width] = deque()
            bisect.insort(self.widths, width)
        return queue

    def append(self, row: Row) -> None:
        self._queue(self.width(row)).append(row)

    def put_back(self, row: Row) -> None:
        """Return a row taken from the front of its queue to the front."""
        self._queue(self.width(row)).appendleft(row)

    def around(self, width: int) -> Iterable[int]:
        """The widths with rows: `width` and wider ones first (narrowest first), then the narrower ones."""
        start = bisect.bisect_left(self.widths, width)
        return [*self.widths[start:], *reversed(self.widths[:start])]

    def prune(self) -> None:
        """Forget the widths whose queues are empty."""
        for width in [w for w in self.widths if not self.rows[w]]:
            del self.rows[width]
            self.widths.remove(width)

    def clear(self) -> None:
        self.rows.clear()
        self.widths.clear()


class LaneQueue:
    """One lane's queued rows: in arrival order, and (padded layout) by width."""

    def __init__(self, shapes: Shapes) -> None:
        self.arrivals: deque[Row] = deque()  # rows batched or given up on are skipped when reached
        self.by_width = WidthQueues(shapes)
        self.queued = 0  # rows still wanted

    def append(self, rows: list[Row], padded: bool) -> None:
        self.arrivals.extend(rows)
        if padded:
            for row in rows:
                self.by_width.append(row)
        self.queued += len(rows)

    def clear(self) -> None:
        self.arrivals.clear()
        self.by_width.clear()
