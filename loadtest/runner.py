"""The load loops: closed loop (fixed concurrency) and open loop (fixed Poisson arrival rate).

One asyncio loop per client process; `run_step` fans a step out over `settings.procs`
processes (a single Python client is CPU-bound at a few thousand requests/s) and merges
their raw latencies. Latency of an open-loop request counts from its scheduled arrival,
so a slow server cannot hide queueing behind a slow client (no coordinated omission).
"""

from __future__ import annotations

import asyncio
import multiprocessing as mp
import random
import time
from collections.abc import Callable

from loadtest.stats import RawStep, StepResult, StepSettings, merge
from loadtest.targets import GatewaySpec, TritonSpec, make_target

Progress = Callable[[int, float], None]  # (requests done so far, seconds elapsed)


class _Recorder:
    """Counts requests that START inside [start, end]; each is awaited to completion, so a request
    longer than the window still counts, and the window stretches to the last such completion."""

    def __init__(self, start: float, end: float) -> None:
        self.start, self.end = start, end
        self.last = end
        self.latencies: list[float] = []
        self.errors = 0
        self.warmup_errors = 0  # failures of requests started before the window: reported, never hidden
        self.dropped = 0
        self.samples: list[str] = []
        self.done = 0

    def ok(self, t0: float, t1: float) -> None:
        self.done += 1
        if self.start <= t0 <= self.end:
            self.latencies.append(t1 - t0)
            self.last = max(self.last, t1)

    @property
    def window(self) -> float:
        return self.last - self.start

    def fail(self, t0: float, exc: BaseException) -> None:
        self.done += 1
        if t0 < self.start:
            self.warmup_errors += 1
        elif t0 <= self.end:
            self.errors += 1
        else:
            return
        if len(self.samples) < 5:
            where = "warm-up: " if t0 < self.start else ""
            self.samples.append(f"{where}{type(exc).__name__}: {exc}"[:300])


def _batches(texts: list[str], batch: int, offset: int) -> iter[list[str]]:  # type: ignore[valid-type]
    i = offset * 7919 % len(texts)
    while True:
        chunk = [texts[(i + k) % len(texts)] for k in range(batch)]
        i = (i + batch) % len(texts)
        yield chunk


async def _closed(target: object, s: StepSettings, texts: list[str], rec: _Recorder, worker0: int) -> None:
    async def worker(slot: int) -> None:
        source = _batches(texts, s.batch, worker0 + slot)
        while True:
            t0 = time.perf_counter()
            if t0 >= rec.end:
                return
            try:
                await target.call(slot, next(source))  # type: ignore[attr-defined]
                rec.ok(t0, time.perf_counter())
            except Exception as exc:  # noqa: BLE001 - every failure is counted, none stops the run
                rec.fail(t0, exc)

    await asyncio.gather(*(worker(i) for i in range(s.concurrency)))


async def _open(target: object, s: StepSettings, texts: list[str], rec: _Recorder, rate: float, seed: int) -> None:
    rng = random.Random(seed)
    free = list(range(s.concurrency))
    source = _batches(texts, s.batch, seed)
    tasks: set[asyncio.Task[None]] = set()

    async def one(slot: int, t0: float, batch: list[str]) -> None:
        try:
            await target.call(slot, batch)  # type: ignore[attr-defined]
            rec.ok(t0, time.perf_counter())
        except Exception as exc:  # noqa: BLE001
            rec.fail(t0, exc)
        finally:
            free.append(slot)

    due = time.perf_counter()
    while due < rec.end:
        due += rng.expovariate(rate)
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if not free:
            if rec.start <= due <= rec.end:
                rec.dropped += 1
            continue
        task = asyncio.create_task(one(free.pop(), due, next(source)))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)


async def _run_local(
    spec: GatewaySpec | TritonSpec, s: StepSettings, texts: list[str], share: int, index: int,
    start_at: float | None, progress: Progress | None,
) -> RawStep:
    target = make_target(spec)
    await target.open(max(share, 1), s.batch)
    try:
        if start_at is not None:  # several processes: start together
            await asyncio.sleep(max(0.0, start_at - time.time()))
        begin = time.perf_counter()
        rec = _Recorder(begin + s.warmup_s, begin + s.warmup_s + s.duration_s)
        ticker = asyncio.create_task(_tick(rec, begin, progress)) if progress else None
        sub = s.model_copy(update={"concurrency": share})
        cpu0 = time.process_time()
        if s.mode == "closed":
            await _closed(target, sub, texts, rec, index * 1000)
        else:
            await _open(target, sub, texts, rec, (s.rate or 1.0) / s.procs, s.seed + index)
        cpu = time.process_time() - cpu0
        if ticker:
            ticker.cancel()
    finally:
        await target.close()
    return RawStep(latencies_s=rec.latencies, errors=rec.errors, warmup_errors=rec.warmup_errors, dropped=rec.dropped,
                   window_s=rec.window, cpu_s=cpu, calls=rec.done, error_samples=rec.samples)


async def _tick(rec: _Recorder, begin: float, progress: Progress) -> None:
    while True:
        progress(rec.done, time.perf_counter() - begin)
        await asyncio.sleep(0.25)


def _proc_main(args: tuple[dict, dict, list[str], int, int, float]) -> dict:  # type: ignore[type-arg]
    spec_d, s_d, texts, share, index, start_at = args
    spec: GatewaySpec | TritonSpec = GatewaySpec(**spec_d) if spec_d["kind"] == "gateway" else TritonSpec(**spec_d)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    raw = asyncio.run(_run_local(spec, StepSettings(**s_d), texts, share, index, start_at, None))
    return raw.model_dump()


def _shares(total: int, procs: int) -> list[int]:
    return [total // procs + (1 if i < total % procs else 0) for i in range(procs)]


def run_step(
    label: str, spec: GatewaySpec | TritonSpec, settings: StepSettings, texts: list[str],
    progress: Progress | None = None,
) -> StepResult:
    """Run one load step against `spec` and return its merged result."""
    if settings.procs == 1:
        raw = asyncio.run(_run_local(spec, settings, texts, settings.concurrency, 0, None, progress))
        return merge(label, settings, [raw])
    shares = [x for x in _shares(settings.concurrency, settings.procs) if x > 0]
    start_at = time.time() + 1.0 + 0.05 * len(shares)
    args = [(spec.model_dump(), settings.model_dump(), texts, share, i, start_at) for i, share in enumerate(shares)]
    with mp.get_context("spawn").Pool(len(shares)) as pool:
        pending = pool.map_async(_proc_main, args)
        while not pending.ready():
            if progress:
                progress(-1, max(0.0, time.time() - start_at))
            pending.wait(0.25)
        raws = [RawStep(**r) for r in pending.get()]
    return merge(label, settings.model_copy(update={"procs": len(shares)}), raws)
