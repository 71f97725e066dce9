"""loadtest.stack_metrics, bench7's reading of the gateway's metrics: one scrape of a real Prometheus exposition over
HTTP, exact sample names (a `_sum` is not its `_count`), labels as filters, and a step's figures from the difference
of two scrapes."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server

from loadtest.stack_metrics import SCHEDULER_COUNTERS, batching_stats, metric_sums, scheduler_counters


@pytest.fixture()
def served() -> Iterator[tuple[str, CollectorRegistry]]:
    registry = CollectorRegistry()
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    try:
        yield f"http://127.0.0.1:{server.server_port}", registry
    finally:
        server.shutdown()
        thread.join(timeout=5)


def test_sums_are_taken_per_exact_sample_name_and_label(served: tuple[str, CollectorRegistry]) -> None:
    url, registry = served
    tokens = Counter("gateway_scheduled_tokens", "t", ("model", "kind"), registry=registry)
    tokens.labels("a", "real").inc(10)
    tokens.labels("b", "real").inc(5)
    tokens.labels("a", "computed").inc(12)
    sizes = Histogram("gateway_batch_size", "s", ("model",), buckets=(1, 8, 64), registry=registry)
    for rows in (3, 9):
        sizes.labels("a").observe(rows)
    sums = metric_sums(url, {"real": ("gateway_scheduled_tokens_total", {"kind": "real"}),
                             "real_a": ("gateway_scheduled_tokens_total", {"kind": "real", "model": "a"}),
                             "texts": ("gateway_batch_size_sum", {}),
                             "batches": ("gateway_batch_size_count", {}),
                             "absent": ("gateway_nothing_total", {})})
    assert sums == {"real": 15.0, "real_a": 10.0, "texts": 12.0, "batches": 2.0, "absent": 0.0}


def test_a_steps_figures_come_from_the_difference_of_two_scrapes(served: tuple[str, CollectorRegistry]) -> None:
    url, registry = served
    request = Histogram("gateway_request_duration_seconds", "r", ("route", "model"), registry=registry)
    tokenize = Histogram("gateway_tokenize_seconds", "t", ("model",), registry=registry)
    wait = Histogram("gateway_batch_queue_seconds", "w", ("model",), registry=registry)
    sizes = Histogram("gateway_batch_size", "s", ("model",), registry=registry)
    triton = Histogram("gateway_triton_request_duration_seconds", "g", ("model", "transport"), registry=registry)
    tokens = Counter("gateway_scheduled_tokens", "t", ("model", "kind"), registry=registry)
    request.labels("/embed", "m").observe(1.0)  # before the step: not the step's
    before = scheduler_counters(url)
    for seconds in (0.010, 0.030):
        request.labels("/embed", "m").observe(seconds)
        tokenize.labels("m").observe(seconds / 10)
    wait.labels("m").observe(0.004)
    sizes.labels("m").observe(2)
    triton.labels("m", "shm").observe(0.006)
    tokens.labels("m", "real").inc(40)
    tokens.labels("m", "computed").inc(40)
    after = scheduler_counters(url)
    assert set(before) == set(after) == set(SCHEDULER_COUNTERS)
    stats = batching_stats({k: after[k] - before[k] for k in after})
    assert stats["gateway_request_ms"] == pytest.approx(20.0)
    assert stats["tokenize_ms"] == pytest.approx(2.0)
    assert stats["oldest_queue_wait_ms"] == pytest.approx(4.0)
    assert stats["gateway_to_triton_ms"] == pytest.approx(6.0)
    assert (stats["mean_batch_texts"], stats["batches"], stats["padding_ratio"]) == (2.0, 1.0, 1.0)


def test_a_step_without_batches_has_no_figures_to_divide() -> None:
    stats = batching_stats(dict.fromkeys(SCHEDULER_COUNTERS, 0.0))
    assert stats["gateway_to_triton_ms"] == 0.0 and stats["batches"] == 0.0
    assert all(math.isnan(stats[k]) for k in ("padding_ratio", "mean_batch_texts", "gateway_request_ms",
                                              "tokenize_ms", "oldest_queue_wait_ms"))


def test_the_gateways_workers_are_counted_without_multiprocessing_s_resource_tracker(tmp_path) -> None:
    """uvicorn spawns its workers, and spawning starts multiprocessing's resource tracker, a child of the gateway
    too: a parent with 3 spawned children has 3 workers (bench7 used to say 4)."""
    import subprocess
    import sys

    import psutil

    from loadtest.stack_metrics import worker_count

    script = tmp_path / "parent.py"
    script.write_text(
        "import multiprocessing as mp, sys\n"
        "if __name__ == '__main__':\n"
        "    ctx = mp.get_context('spawn')\n"
        "    stop = ctx.Event()\n"
        "    workers = [ctx.Process(target=stop.wait) for _ in range(3)]\n"
        "    for w in workers: w.start()\n"
        "    print('up', flush=True)\n"
        "    sys.stdin.readline()\n"
        "    stop.set()\n"
        "    for w in workers: w.join()\n")
    parent = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "up"
        children = [" ".join(c.cmdline()) for c in psutil.Process(parent.pid).children()]
        assert any("resource_tracker" in c for c in children), children  # what the count must leave out
        assert worker_count(parent.pid) == 3
    finally:
        assert parent.stdin is not None
        parent.stdin.write("\n")
        parent.stdin.flush()
        parent.wait(timeout=30)


def test_tritons_own_time_per_request_holds_its_queue_and_compute(fake_triton) -> None:
    """bench7's split of the gateway's round trip: Triton's statistics of a real step, before and after a few calls;
    each request's whole time in Triton is at least its queue and compute parts."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    from loadtest.stack_metrics import step_stats, triton_times

    before = step_stats(fake_triton.grpc_url, "fakeemb_onnx")
    client = grpcclient.InferenceServerClient(fake_triton.grpc_url)
    for text in (b"one", b"two texts", b"three"):
        tensor = grpcclient.InferInput("text", [1, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[text]], dtype=object))
        client.infer("fakeemb_onnx", [tensor])
    after = step_stats(fake_triton.grpc_url, "fakeemb_onnx")
    times = triton_times({k: after[k] - before[k] for k in after})
    assert times["triton_executions"] == 3
    assert times["triton_compute_ms_per_request"] > 0
    assert times["triton_request_ms_per_request"] >= times["triton_queue_ms_per_request"] + \
        times["triton_compute_ms_per_request"]
