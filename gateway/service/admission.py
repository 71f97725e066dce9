"""Admission by the time the work AHEAD of a request needs: refuse at once only what could not start in time.

A `Backlog` counts the work admitted to one model and not yet done (tokens and rows for a model
step's scheduler, texts for an ensemble) and learns how long the model takes to serve it: a
`ServiceTime` model, seconds = per-call cost + per-unit cost x units, fitted to the calls
themselves. Each call is measured by its share of the model's busy time (time is split evenly
between the calls running together), so calls that overlap on several instances, or queue behind
each other in Triton, count what they really add, and a per-call overhead measured on single
texts is not mistaken for a per-token cost.

A request is refused (`overloaded`, 503, Retry-After = when the work ahead should be done) when
the work ahead of it would take longer than 80% of its remaining deadline, and, unless the client chose that
deadline itself (X-Request-Timeout: a bulk job that would gladly wait), longer than `max_wait_s`; with a hold
(`wait_for_room`, GATEWAY_SHED_PAUSE_S) the refusal comes only when no room appeared while the request was held. The work
ahead of an interactive request is what it cannot overtake: everything but the batch lane's queued rows
(service/batch_queue.py). Its own size never counts: an idle model admits any request within the request limits, and so does a
model whose cost is not measured yet (fewer than MIN_CALLS calls). The check needs no
tokenization, so it runs before any; an admitted request is counted in at once with a guess of
its size from its characters (so that a burst admitted while it is being tokenized is not
invisible to the requests behind it), and corrected once it is tokenized.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, get_args

from gateway.errors import ErrorType, GatewayError

Lane = Literal["interactive", "batch"]  # X-Priority: interactive work is batched first, batch work after it
LANES: tuple[Lane, ...] = get_args(Lane)
ADMIT_FRACTION = 0.8  # share of a request's remaining time it may spend waiting behind others


@dataclass(frozen=True, slots=True)
class Urgency:
    """How a request may wait: its lane, and whether its deadline is the client's own (X-Request-Timeout)."""

    lane: Lane = "interactive"
    own_deadline: bool = False


INTERACTIVE = Urgency()
_HALF_LIFE_CALLS = 64  # the fit forgets older calls by this half-life (the hardware may change: reload, contention)
_DECAY = 0.5 ** (1 / _HALF_LIFE_CALLS)
_MIN_SPREAD = 0.2  # units must vary by this much (coefficient of variation) to split per-call from per-unit cost
# Calls measured before the fit may refuse anything. The first calls of a fresh stack pay one-time costs, and two
# or three of them can dominate the fit: a burst of clients starting at once would be refused by a stack that can
# serve them. Under a real overload 16 calls take well under a second.
MIN_CALLS = 16


class ServiceTime:
    """seconds = per_call_s + per_unit_s x units, fitted by exponentially weighted least squares.

    A fit of small calls says little of larger ones: calls of a few texts, slowed or sped up by what else runs on
    the host, can fit a cost that hardly grows with the tokens, and a burst of many texts would then look like a
    few cheap calls. Calls larger than those measured are therefore costed at least as the device's own cost model
    scales the measured ones (`call_cost_units`: what one more call costs in units; a CPU's calls cost their
    tokens, a GPU's mostly the call), until calls of that size are measured."""

    def __init__(self, call_cost_units: int | None = None) -> None:
        self._w = self._t = self._tt = self._y = self._ty = 0.0
        self.calls = 0
        self.call_cost_units = call_cost_units

    def observe(self, units: float, seconds: float) -> None:
        """One call of `units` that cost `seconds` of the model's time."""
        self._w = _DECAY * self._w + 1.0
        self._t = _DECAY * self._t + units
        self._tt = _DECAY * self._tt + units * units
        self._y = _DECAY * self._y + seconds
        self._ty = _DECAY * self._ty + units * seconds
        self.calls += 1

    @property
    def known(self) -> bool:
        """Whether enough calls were measured to refuse by the fit (MIN_CALLS)."""
        return self.calls >= MIN_CALLS

    def coefficients(self) -> tuple[float, float]:
        """(per_call_s, per_unit_s), both >= 0. While the calls seen so far all had about the same size,
        their cost is taken as per-call (a lone text's time is mostly fixed cost, not tokens)."""
        if not self.calls:
            return 0.0, 0.0
        w, t, tt, y, ty = self._w, self._t, self._tt, self._y, self._ty
        mean_t, mean_y = t / w, y / w
        variance = max(tt / w - mean_t * mean_t, 0.0)
        if mean_t <= 0 or variance < (_MIN_SPREAD * mean_t) ** 2:
            return mean_y, 0.0
        per_unit = (ty / w - mean_t * mean_y) / variance
        per_call = mean_y - per_unit * mean_t
        if per_unit < 0:
            return mean_y, 0.0
        if per_call < 0:  # no fixed cost visible: all of it per unit, through the origin
            return 0.0, ty / tt
        return per_call, per_unit

    def seconds(self, units: float, calls: int) -> float:
        """Expected model time of `units` served in `calls` calls."""
        per_call, per_unit = self.coefficients()
        fitted = calls * per_call + units * per_unit
        if self.call_cost_units is None or not calls or not self._w:
            return fitted
        size, measured = units / calls, self._t / self._w  # units per call: these calls', and the measured ones'
        if size <= measured:
            return fitted
        cost = self.call_cost_units
        return max(fitted, calls * (self._y / self._w) * (cost + size) / (cost + measured))


class BusyClock:
    """Processor-sharing time of one model: advances 1/n seconds per second while n calls run."""

    def __init__(self, now: Callable[[], float] = time.perf_counter) -> None:
        self.running = 0
        self._now = now
        self._virtual = 0.0
        self._last = now()

    def _advance(self) -> float:
        now = self._now()
        if self.running:
            self._virtual += (now - self._last) / self.running
        self._last = now
        return self._virtual

    def start(self) -> float:
        """A call starts: the mark to pass to `stop`."""
        mark = self._advance()
        self.running += 1
        return mark

    def stop(self, mark: float) -> float:
        """A call ended: its share of the model's busy time, in seconds."""
        share = self._advance() - mark
        self.running -= 1
        return share


class Backlog:
    """Work admitted to one model and not yet done, and what serving it costs."""

    shedding_models = 0  # backlogs of this process whose last check refused (the shedding gate's quick test)

    def __init__(self, name: str, unit: str, max_wait_s: float, call_units: int | None, call_rows: int = 0,
                 call_cost_units: int | None = None) -> None:
        self.name = name
        self.unit = unit
        self.max_wait_s = max_wait_s
        # Most units one call carries (the scheduler's token budget), when the gateway forms the calls; None when
        # callers make the calls and Triton merges them (the ensemble pipeline): pending calls are counted.
        self.call_units = call_units
        self.call_rows = call_rows  # most rows one call carries (0: rows do not limit a call)
        self.pending = 0  # units admitted and not finished
        self.pending_rows = 0
        self.pending_calls = 0  # call_units None: calls admitted and not finished
        self.queued_batch = 0  # of those, the batch lane's units still queued: interactive work goes first
        self.queued_batch_rows = 0
        self.service = ServiceTime(call_cost_units)
        self.clock = BusyClock()
        self.call_latency_s = 0.0  # moving average of a call's wall time (queueing in Triton included)
        self.units_per_char = 0.3  # tokens per character of text, learned: sizes a request before it is tokenized
        self._shedding = False  # the last check refused a request; cleared when one is admitted
        self._held: list[tuple[int, asyncio.Future[None]]] = []  # requests held for room, by arrival (`wait_for_room`)
        self._arrivals = itertools.count()

    @property
    def shedding(self) -> bool:
        return self._shedding

    @shedding.setter
    def shedding(self, value: bool) -> None:
        if value != self._shedding:
            Backlog.shedding_models += 1 if value else -1
            self._shedding = value

    def _call_count(self, units: int, rows: int) -> int:
        """Calls that serving `units` in `rows` takes (at the least, where the gateway forms them)."""
        if units <= 0:
            return 0
        if self.call_units is None:
            return self.pending_calls
        calls = math.ceil(units / self.call_units)
        return max(calls, math.ceil(rows / self.call_rows)) if self.call_rows else calls

    def pending_call_count(self) -> int:
        """Calls that serving the pending work takes."""
        return self._call_count(self.pending, self.pending_rows)

    def wait_s(self, lane: Lane = "batch") -> float:
        """Expected time until the work ahead of a request of `lane` is served: all pending work, or for an
        interactive request all but the batch lane's queued rows (0 while the cost is unknown)."""
        units, rows = self.pending, self.pending_rows
        if lane == "interactive":
            units, rows = units - self.queued_batch, rows - self.queued_batch_rows
        if units <= 0 or not self.service.known:
            return 0.0
        return self.service.seconds(units, self._call_count(units, rows))

    def check(self, deadline: float, urgency: Urgency = INTERACTIVE) -> None:
        """Raise `overloaded` when the work ahead would not be served before a request due at `deadline`
        (time.monotonic()) could start: more than 80% of its remaining time, or than `max_wait_s` where the
        deadline is not the client's own."""
        wait = self.wait_s(urgency.lane)
        if wait <= 0.0:
            self.shedding = False
            return
        allowed = ADMIT_FRACTION * (deadline - time.monotonic())
        if not urgency.own_deadline:
            allowed = min(self.max_wait_s, allowed)
        if wait > allowed:
            self.shedding = True
            raise GatewayError(
                ErrorType.OVERLOADED,
                f"{self.name} is overloaded: about {wait:.1f}s of work ahead, over the {max(allowed, 0.0):.1f}s this "
                "request may wait; retry after it, or say how long it may wait (X-Request-Timeout)",
                retry_after_s=wait,
            )
        self.shedding = False

    async def wait_for_room(self, deadline: float, urgency: Urgency = INTERACTIVE, hold_s: float = 0.0) -> None:
        """`check`, holding a request it refuses up to `hold_s` (and its deadline): each time work leaves, the
        held requests are checked again, the latest first, so that a request refused at a burst's peak is served
        by the room the burst leaves instead of being sent back to retry, and a request that arrives once a storm
        has passed is not served after the storm's own. Raises the last refusal when the hold ends without room."""
        until: float | None = None
        arrival = next(self._arrivals)
        while True:
            try:
                self.check(deadline, urgency)
                return
            except GatewayError:
                now = time.monotonic()
                until = min(now + hold_s, deadline) if until is None else until
                if now >= until:
                    raise
            woken = asyncio.get_running_loop().create_future()
            entry = (arrival, woken)
            bisect.insort(self._held, entry, key=lambda held: held[0])
            try:
                await asyncio.wait_for(woken, until - now)
            except TimeoutError:
                pass
            finally:
                if entry in self._held:  # not woken: the hold ended, or the caller left
                    self._held.remove(entry)

    def guess_units(self, chars: int) -> int:
        """What a text of `chars` characters is likely to bring, before it is tokenized."""
        return max(1, round(chars * self.units_per_char))

    def learn_units_per_char(self, chars: int, units: int) -> None:
        if chars > 0:
            self.units_per_char += 0.1 * (units / chars - self.units_per_char)

    def add(self, units: int, rows: int = 0, calls: int = 0, lane: Lane = "interactive") -> None:
        """Count an admitted request's work in (`calls`: the calls it makes, where callers make them)."""
        self.pending += units
        self.pending_rows += rows
        self.pending_calls += calls
        if lane == "batch":
            self.queued_batch += units
            self.queued_batch_rows += rows

    async def admit(self, units: int, deadline: float, rows: int = 0, calls: int = 0, urgency: Urgency = INTERACTIVE,
                    hold_s: float = 0.0) -> None:
        """`wait_for_room`, then `add`."""
        await self.wait_for_room(deadline, urgency, hold_s)
        self.add(units, rows, calls, urgency.lane)

    def started(self, batch_lane_lengths: list[int]) -> None:
        """Rows of the batch lane went into a batch: interactive work can no longer overtake them."""
        self.queued_batch -= sum(batch_lane_lengths)
        self.queued_batch_rows -= len(batch_lane_lengths)

    def call_started(self) -> float:
        """A call of this model starts: the mark for `served` / `call_ended`."""
        return self.clock.start()

    def observe_latency(self, seconds: float) -> None:
        """The wall time of a call that succeeded."""
        self.call_latency_s = seconds if not self.call_latency_s else self.call_latency_s + 0.2 * (
            seconds - self.call_latency_s)

    def call_ended(self, mark: float) -> float:
        """A call ended without a measurement (failed, cancelled): its share of busy time."""
        return self.clock.stop(mark)

    def served(self, units: int, rows: int, mark: float) -> None:
        """A call that started at `mark` served `units` in `rows`: learn its cost, count its work out."""
        self.service.observe(units, self.clock.stop(mark))
        self.done(units, rows, 1 if self.call_units is None else 0)

    def done(self, units: int, rows: int = 0, calls: int = 0, queued_in: Lane | None = None) -> None:
        """Work that left without a measurement (served elsewhere, failed, or its caller gave up; `queued_in`: the
        lane of rows that left while queued)."""
        self.pending -= units
        self.pending_rows -= rows
        self.pending_calls -= calls
        if queued_in == "batch":
            self.queued_batch -= units
            self.queued_batch_rows -= rows
        held, self._held = self._held, []
        for _, woken in reversed(held):  # the latest first: their checks run in this order
            if not woken.done():
                woken.set_result(None)
