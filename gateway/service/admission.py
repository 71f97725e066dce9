"""Admission by expected wait: refuse at once what could not be served in time.

A `Backlog` counts the work admitted to one model and not yet done (tokens for a model step's
scheduler, texts for an ensemble) and measures the rate at which that model serves it. A new
request is admitted when the work ahead of it, at that rate, would be done within
`max_wait_s` and within 80% of the request's remaining deadline; otherwise it gets
`overloaded` (503 with Retry-After) before it costs anything. The queue is bounded by time,
not by a count, so it adapts to the model and the hardware, and a burst never builds a backlog
that outlives it.
"""

from __future__ import annotations

import time

from gateway.errors import ErrorKind, GatewayError

ADMIT_FRACTION = 0.8  # share of a request's remaining time it may spend waiting behind others
_SMOOTHING = 0.3  # weight of the newest measurement in the rate estimate


class Backlog:
    """Work admitted to one model and not yet done, and the measured rate it is served at."""

    def __init__(self, name: str, unit: str, max_wait_s: float) -> None:
        self.name = name
        self.unit = unit
        self.max_wait_s = max_wait_s
        self.pending = 0  # units admitted and not finished
        self.calls = 0  # calls to the model running now (for callers that do not count them themselves)
        self.per_s: float | None = None  # None until a call completed

    def expected_wait_s(self, units: int) -> float:
        """How long `units` more would take behind the pending work (0 while the rate is unknown)."""
        return 0.0 if self.per_s is None else (self.pending + units) / self.per_s

    def admit(self, units: int, deadline: float) -> None:
        """Count `units` in, or raise `overloaded` when they could not be served in time."""
        wait = self.expected_wait_s(units)
        allowed = min(self.max_wait_s, ADMIT_FRACTION * (deadline - time.monotonic()))
        if wait > allowed:
            raise GatewayError(
                ErrorKind.OVERLOADED,
                f"{self.name} is overloaded: about {wait:.1f}s of work ahead, over the {allowed:.1f}s this "
                "request may wait",
                type="overloaded", retry_after_s=max(1.0, wait - allowed),
            )
        self.pending += units

    def served(self, units: int, seconds: float, concurrency: int) -> None:
        """`units` were served by one call of `seconds` that shared the model with `concurrency - 1` others."""
        self.pending -= units
        rate = units * max(concurrency, 1) / max(seconds, 1e-6)
        self.per_s = rate if self.per_s is None else self.per_s + _SMOOTHING * (rate - self.per_s)

    def dropped(self, units: int) -> None:
        """`units` left without being served (their caller gave up, or the call failed)."""
        self.pending -= units
