"""Result models and latency statistics of one load step."""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import BaseModel, Field


class StepSettings(BaseModel):
    """One load step: closed loop at `concurrency`, or open loop at `rate` requests/s."""

    mode: Literal["closed", "open"] = "closed"
    concurrency: int = Field(1, ge=1, description="Closed loop: requests in flight. Open loop: most in flight.")
    rate: float | None = Field(None, gt=0, description="Open loop: arrivals per second (Poisson).")
    duration_s: float = Field(10.0, gt=0)
    warmup_s: float = Field(1.0, ge=0)
    batch: int = Field(1, ge=1, description="Texts per request.")
    procs: int = Field(1, ge=1, description="Client processes sharing the load.")
    seed: int = 1234


class Latency(BaseModel):
    """Latency percentiles in milliseconds."""

    mean: float
    p50: float
    p90: float
    p95: float
    p99: float
    max: float

    @classmethod
    def of(cls, seconds: np.ndarray) -> Latency:
        if seconds.size == 0:
            return cls(mean=0, p50=0, p90=0, p95=0, p99=0, max=0)
        ms = seconds * 1000.0
        p50, p90, p95, p99 = np.percentile(ms, [50, 90, 95, 99])
        return cls(mean=float(ms.mean()), p50=float(p50), p90=float(p90), p95=float(p95),
                   p99=float(p99), max=float(ms.max()))


class StepResult(BaseModel):
    """What one step measured. Throughput counts requests completed inside the window."""

    label: str
    settings: StepSettings
    requests: int
    errors: int
    warmup_errors: int = Field(0, description="Failures of requests sent during the warm-up (not in the window).")
    dropped: int = Field(0, description="Open loop: arrivals not sent because `concurrency` were in flight.")
    items: int = Field(description="Texts completed (requests x batch).")
    window_s: float
    throughput_rps: float
    items_per_s: float
    latency_ms: Latency
    client_cpu_us_per_request: float = Field(
        description="Client CPU time per request (all client processes); 1e6 / this = one client core's ceiling."
    )
    error_samples: list[str] = Field(default_factory=list)

    @property
    def client_ceiling_rps(self) -> float:
        """Requests/s one client core could drive at this cost (the generator's own limit)."""
        return 1e6 / self.client_cpu_us_per_request if self.client_cpu_us_per_request else float("inf")


class RawStep(BaseModel):
    """One client process's raw measurements (merged across processes into a StepResult)."""

    latencies_s: list[float]
    errors: int
    warmup_errors: int = 0
    dropped: int
    window_s: float
    cpu_s: float = Field(description="Client CPU seconds over the whole step, warm-up included.")
    calls: int = Field(description="Requests finished over the whole step, warm-up included.")
    error_samples: list[str]


def merge(label: str, settings: StepSettings, raws: list[RawStep]) -> StepResult:
    """Combine per-process raw measurements into one StepResult."""
    lat = np.array([x for r in raws for x in r.latencies_s], dtype=np.float64)
    window = max(r.window_s for r in raws)
    requests = int(lat.size)
    errors = sum(r.errors for r in raws)
    cpu = sum(r.cpu_s for r in raws)
    done = sum(r.calls for r in raws)
    return StepResult(
        label=label,
        settings=settings,
        requests=requests,
        errors=errors,
        warmup_errors=sum(r.warmup_errors for r in raws),
        dropped=sum(r.dropped for r in raws),
        items=requests * settings.batch,
        window_s=window,
        throughput_rps=requests / window if window else 0.0,
        items_per_s=requests * settings.batch / window if window else 0.0,
        latency_ms=Latency.of(lat),
        client_cpu_us_per_request=cpu / done * 1e6 if done else 0.0,
        error_samples=[s for r in raws for s in r.error_samples][:5],
    )
