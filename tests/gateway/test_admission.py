"""The admission model (service/admission.py) and the in-flight bound (service/in_flight.py), in-process.

The same logic against a real tritonserver and gateways is in test_overload.py; here the cost
model's arithmetic and the FIFO bound are checked exactly, with made-up measurements.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from gateway.errors import ErrorKind, GatewayError
from gateway.service.admission import MIN_CALLS, Backlog, BusyClock, ServiceTime
from gateway.service.in_flight import InFlightLimit
from tests.fixtures.waiting import until


def test_the_fit_splits_per_call_from_per_unit_cost_and_forgets_old_calls() -> None:
    service = ServiceTime()
    assert service.coefficients() == (0.0, 0.0) and not service.known
    for units in (10, 200, 50, 400, 10):  # seconds = 5 ms + 0.1 ms a unit
        service.observe(units, 0.005 + 0.0001 * units)
    per_call, per_unit = service.coefficients()
    assert per_call == pytest.approx(0.005) and per_unit == pytest.approx(0.0001)
    assert service.seconds(16384, 1) == pytest.approx(0.005 + 1.6384)  # a full batch, from single texts and a few more
    for units in (10, 200, 50, 400) * 100:  # the hardware got twice as fast: the old calls fade out
        service.observe(units, (0.005 + 0.0001 * units) / 2)
    assert service.coefficients()[1] == pytest.approx(0.00005, rel=0.01)


def test_calls_of_one_size_are_taken_as_fixed_cost_not_per_token_cost() -> None:
    service = ServiceTime()
    for _ in range(20):  # single short texts: the per-token cost cannot be told apart
        service.observe(12, 0.004)
    assert service.coefficients() == (pytest.approx(0.004), 0.0)


def test_calls_larger_than_those_measured_are_costed_by_the_devices_cost_model() -> None:
    """Small calls whose cost hardly grew with their tokens (a CPU shared with other work) fit a cost that is
    nearly all per call. A burst of 32-text calls is then costed as the device's cost model scales the measured
    calls: on a CPU (a call costs 64 tokens more) about in proportion to the tokens, on a GPU (1024) hardly more."""
    small = [(256, 0.045), (384, 0.046), (512, 0.047), (384, 0.045)] * 8  # 2-4 texts of 128 tokens
    cpu, gpu, blind = ServiceTime(64), ServiceTime(1024), ServiceTime()
    for service in (cpu, gpu, blind):
        for units, seconds in small:
            service.observe(units, seconds)
    burst = (6 * 4096, 6)  # 192 texts of 128 tokens in 6 calls of 32
    assert blind.seconds(*burst) < 0.5  # the fit alone: six cheap calls
    measured = 384  # tokens per call measured, on average
    assert cpu.seconds(*burst) == pytest.approx(6 * 0.04575 * (64 + 4096) / (64 + measured), rel=0.01)  # ~2.5 s
    assert gpu.seconds(*burst) == pytest.approx(6 * 0.04575 * (1024 + 4096) / (1024 + measured), rel=0.01)
    assert cpu.seconds(384, 1) == blind.seconds(384, 1)  # calls of the measured size: the fit
    for _ in range(64):  # 32-text calls measured: the fit of them rules
        cpu.observe(4096, 0.5)
    assert cpu.seconds(*burst) == pytest.approx(3.0, rel=0.05)


def test_busy_time_is_shared_between_overlapping_calls() -> None:
    now = [0.0]
    clock = BusyClock(lambda: now[0])
    first = clock.start()
    now[0] = 1.0
    second = clock.start()  # from here both run: each is charged half of the time
    now[0] = 3.0
    assert clock.stop(first) == pytest.approx(2.0)  # 1 s alone + 2 s shared
    now[0] = 4.0
    assert clock.stop(second) == pytest.approx(2.0)  # 2 s shared + 1 s alone
    now[0] = 9.0  # idle time is nobody's
    assert clock.stop(clock.start()) == 0.0 and clock.running == 0


def test_an_idle_or_unmeasured_model_admits_anything_and_retry_after_is_the_wait_ahead() -> None:
    backlog = Backlog("m", "tokens", max_wait_s=2.0, call_units=1000, call_rows=10)
    backlog.add(10**6, 5000)
    backlog.check(time.monotonic() + 0.001)  # no cost measured yet: admitted
    backlog.done(10**6, 5000)
    for _ in range(MIN_CALLS // 2):
        backlog.service.observe(1000, 1.0)
        backlog.service.observe(100, 0.1)  # 1 ms a token
    backlog.check(time.monotonic() + 0.001)  # idle: admitted whatever it brings
    backlog.add(3000, 20)  # 3 calls by tokens, 2 by rows: 3 s ahead
    assert backlog.pending_call_count() == 3 and backlog.wait_s() == pytest.approx(3.0)
    with pytest.raises(GatewayError) as refused:
        backlog.check(time.monotonic() + 60)
    assert refused.value.kind is ErrorKind.OVERLOADED and refused.value.retry_after_s == pytest.approx(3.0)
    assert backlog.shedding
    backlog.done(2000, 10)
    backlog.check(time.monotonic() + 60)  # 1 s ahead: within the 2 s it may wait
    assert not backlog.shedding


def test_a_cold_start_does_not_refuse_a_burst_it_serves_in_time() -> None:
    """A fresh stack's first calls are slow (one-time costs): until MIN_CALLS calls are measured the fit refuses
    nothing, and by then the cold calls weigh little. 256 single texts arriving at once are admitted throughout."""
    backlog = Backlog("m", "tokens", max_wait_s=0.8, call_units=16384, call_rows=64)
    for units, seconds in ((700, 0.6), (900, 0.6)):  # two cold calls: their cost alone says 2.4 s for the burst
        backlog.service.observe(units, seconds)
    backlog.add(256 * 60, 256)
    assert backlog.service.seconds(backlog.pending, backlog.pending_call_count()) > 0.8
    backlog.check(time.monotonic() + 60)  # not measured enough: admitted
    for k in range(MIN_CALLS - 2):  # warm calls of ~12 texts: 4 ms each
        backlog.service.observe(700 + 20 * k, 0.004)
    assert backlog.service.known
    backlog.check(time.monotonic() + 60)  # measured: the burst is a few calls, well within the wait allowed
    assert backlog.wait_s() < 0.8 and not backlog.shedding


def test_counted_calls_are_used_where_triton_merges_them() -> None:
    backlog = Backlog("e", "texts", max_wait_s=1.0, call_units=None)
    for _ in range(MIN_CALLS):
        backlog.service.observe(1, 0.01)  # single-text calls merged by Triton: 10 ms of busy time each
    backlog.add(150, calls=150)
    assert backlog.wait_s() == pytest.approx(1.5)
    mark = backlog.call_started()
    backlog.served(1, 1, mark)
    assert backlog.pending == 149 and backlog.pending_calls == 149


@pytest.mark.anyio
async def test_the_in_flight_bound_serves_in_arrival_order_and_lets_leavers_go() -> None:
    limit = InFlightLimit(4)
    assert await limit.acquire(3) == 3
    order: list[str] = []

    async def take(name: str, units: int) -> None:
        await limit.acquire(units)
        order.append(name)

    big = asyncio.create_task(take("big", 4))
    await until(lambda: limit.waiting == 4, "big waiting")
    small = asyncio.create_task(take("small", 1))  # would fit now, but waits behind `big`
    leaver = asyncio.create_task(take("leaver", 1))
    await until(lambda: limit.waiting == 6, "small and the leaver waiting too")
    assert order == []
    leaver.cancel()
    limit.release(3)
    await asyncio.gather(big, asyncio.gather(leaver, return_exceptions=True))
    assert order == ["big"] and limit.used == 4
    limit.release(4)
    await small
    assert order == ["big", "small"] and limit.used == 1 and limit.waiting == 0


@pytest.mark.anyio
async def test_held_requests_are_admitted_as_work_leaves_the_latest_first() -> None:
    """A request the work ahead refuses is held and checked again each time work leaves; the latest held request
    is checked first, and a hold that ends without room is the refusal."""
    backlog = Backlog("m", "tokens", max_wait_s=1.0, call_units=1000, call_rows=10)
    for _ in range(MIN_CALLS):
        backlog.service.observe(1000, 1.0)  # 1 ms a token
    backlog.add(3000, 3)  # 3 s ahead: over the 1 s a request may wait
    admitted: list[str] = []

    async def request(name: str, hold_s: float) -> None:
        await backlog.admit(500, time.monotonic() + 60, rows=1, hold_s=hold_s)
        admitted.append(name)

    first = asyncio.create_task(request("first", 60))
    await until(lambda: len(backlog._held) == 1, "the first held")
    second = asyncio.create_task(request("second", 60))
    await until(lambda: len(backlog._held) == 2, "the second held")
    with pytest.raises(GatewayError) as refused:
        await backlog.admit(500, time.monotonic() + 60, rows=1, hold_s=0.0)  # not held: refused at once
    assert refused.value.kind is ErrorKind.OVERLOADED
    backlog.done(2000, 2)  # 1 s ahead: room for one
    await until(lambda: admitted == ["second"], "the latest held request admitted")
    assert len(backlog._held) == 1  # the first: 1.5 s ahead now
    backlog.done(1000, 1)
    await until(lambda: admitted == ["second", "first"], "the first admitted")
    await asyncio.gather(first, second)
