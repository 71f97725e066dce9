"""A first-come-first-served bound on the work one worker keeps in flight to one Triton model.

The ensemble pipeline sends texts to Triton in chunks; beyond what fills Triton's next batches,
more in flight only lengthens Triton's queue, where a request whose caller gave up is still
tokenized and computed. Chunks over the bound wait here instead, in arrival order, and a caller
that gives up (deadline, disconnect) leaves before Triton ever sees its texts.
"""

from __future__ import annotations

import asyncio
from collections import deque


class InFlightLimit:
    """At most `limit` units in flight; `acquire` waits its turn (FIFO), `release` gives units back."""

    def __init__(self, limit: int) -> None:
        self.limit = max(limit, 1)
        self.used = 0
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    @property
    def waiting(self) -> int:
        return sum(n for n, future in self._waiters if not future.done())

    async def acquire(self, units: int) -> int:
        """Take `units` (at most `limit`) once they fit behind every earlier caller; returns what was taken."""
        units = min(units, self.limit)
        if not self._waiters and self.used + units <= self.limit:
            self.used += units
            return units
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((units, future))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():  # granted, then cancelled before it ran
                self.release(units)
            else:
                self._wake()  # a waiter ahead of others left: the next may fit now
            raise
        return units

    def release(self, units: int) -> None:
        self.used -= units
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            units, future = self._waiters[0]
            if future.done():
                self._waiters.popleft()
                continue
            if self.used + units > self.limit:
                return
            self._waiters.popleft()
            self.used += units
            future.set_result(None)
