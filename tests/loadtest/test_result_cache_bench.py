"""`python -m loadtest result-cache` (loadtest/result_cache.py): its hit-rate simulation on the gateway's own store
(in this process: a second interpreter would cost the default run seconds), and its off/on A/B on a real stack
at a tiny scale (`slow`, as the other whole-stack benchmarks: tests/loadtest/test_benchmark_scripts.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest.result_cache import distinct_texts, main
from loadtest.results_table import read_rows
from tests.loadtest.test_benchmark_scripts import run_loadtest


def test_distinct_texts_are_distinct_and_the_same_each_time() -> None:
    texts = distinct_texts(1000)
    assert len(set(texts)) == 1000 and texts == distinct_texts(1000)


def test_hit_rates_rows_compare_one_shared_cache_with_per_worker_ones(own_results_table: Path) -> None:
    assert main(["hit-rates", "--texts", "2000", "--requests", "10000", "--workers", "4", "--budget-mib", "0.5",
                 "--dim", "64", "--name", "t"]) == 0
    rows = {r.series: r for r in read_rows(own_results_table)}
    assert set(rows) == {"one shared cache", "4 per-worker caches, same total bytes",
                         "4 per-worker caches, the budget each"}
    assert all(r.metric == "hit rate at 0.5 MiB" and r.unit == "%" and 0 < r.value < 100 for r in rows.values())
    # a shared cache holds each text once: at the same bytes, it hits more often than four partial copies
    assert rows["one shared cache"].value > rows["4 per-worker caches, same total bytes"].value


@pytest.mark.slow  # builds a model, starts Triton, two gateways and Redis (~1 min): `scripts/test -m slow`
@pytest.mark.timeout(600)
def test_ab_measures_off_and_on_side_by_side(own_results_table: Path) -> None:
    out = run_loadtest("result-cache", "ab", "--shape", "tiny", "--cache", "redis", "--rounds", "2", "--clients", "8",
                       "--calls", "300", "--texts", "500", "--workers", "1", "--name", "t")
    assert out.count("round ") == 4
    rows = read_rows(own_results_table)
    assert {(r.series, r.metric) for r in rows} == {(f"cache={side}", f"{m} (median of 2 rounds)")
                                                   for side in ("off", "redis") for m in ("texts/s", "p50", "hit rate")}
    rates = {r.series: r.value for r in rows if r.metric.startswith("hit rate")}
    assert rates["cache=off"] == 0 and rates["cache=redis"] > 0
