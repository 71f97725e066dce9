"""Sweeps: a list of steps (concurrency or rate values, optionally several series) run in order."""

from __future__ import annotations

import sys

from pydantic import BaseModel

from loadtest.progress import sweep_progress
from loadtest.stats import StepResult, StepSettings
from loadtest.targets import GatewaySpec, TritonSpec


class Series(BaseModel):
    """A named target measured at every point of a sweep."""

    label: str
    spec: GatewaySpec | TritonSpec


def points(base: StepSettings, concurrency: list[int], rates: list[float]) -> list[StepSettings]:
    """Closed-loop points for each concurrency, then open-loop points for each rate."""
    out = [base.model_copy(update={"mode": "closed", "concurrency": c, "rate": None}) for c in concurrency]
    out += [base.model_copy(update={"mode": "open", "rate": r}) for r in rates]
    return out


def run_sweep(series: list[Series], steps: list[StepSettings], texts: list[str],
              progress: bool | None = None, interleave: bool = True) -> list[StepResult]:
    """Run every series at every step; `interleave` alternates series per step (fairer on a busy box)."""
    from loadtest.runner import run_step

    plan = ([(s, st) for st in steps for s in series] if interleave else [(s, st) for s in series for st in steps])
    total = sum(st.warmup_s + st.duration_s for _, st in plan)
    results = []
    with sweep_progress(total, progress) as (callback, name_step):
        for s, st in plan:
            what = f"c={st.concurrency}" if st.mode == "closed" else f"rate={st.rate}"
            name_step(f"{s.label} {what} b={st.batch}", st.warmup_s + st.duration_s)
            result = run_step(s.label, s.spec, st, texts, callback)
            results.append(result)
            if progress is False or not sys.stderr.isatty():
                print(f"  {s.label:<28} {what:<12} {result.throughput_rps:9.1f} req/s  p50 {result.latency_ms.p50:8.2f} ms"
                      f"  p99 {result.latency_ms.p99:8.2f} ms  errors {result.errors}", file=sys.stderr, flush=True)
    return results
