"""The load generator against the real devstack: gateway HTTP and direct Triton gRPC (plain and shm)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devstack.tritonserver import free_port
from loadtest.cli import main as cli_main
from loadtest.corpus import CorpusSpec, make_corpus
from loadtest.runner import run_step
from loadtest.stats import StepSettings
from loadtest.targets import GatewaySpec, TritonSpec
from tests.loadtest.conftest import Stack

pytestmark = pytest.mark.slow  # the load generator against real stacks: scripts/test -m slow

TEXTS = make_corpus(CorpusSpec(size=300))
SHORT = StepSettings(duration_s=0.8, warmup_s=0.2, concurrency=4)  # plumbing, not figures: hundreds of calls


@pytest.mark.parametrize("endpoint, client", [("classify", "raw"), ("embed", "raw"), ("openai", "raw"), ("tei", "raw"),
                                              ("embed", "aiohttp")])
def test_closed_loop_on_each_gateway_endpoint(lt_stack: Stack, endpoint: str, client: str) -> None:
    assert lt_stack.gateway
    model = "fakecls" if endpoint == "classify" else "fakeemb"
    spec = GatewaySpec(url=lt_stack.gateway.url, endpoint=endpoint, model=model, client=client)  # type: ignore[arg-type]
    result = run_step(endpoint, spec, SHORT, TEXTS)
    assert result.errors == 0, result.error_samples
    assert result.requests >= 10
    # the window is the requested duration, stretched to the last counted completion (never shorter)
    assert result.window_s >= SHORT.duration_s and result.throughput_rps == pytest.approx(result.requests / result.window_s)
    assert 0 < result.latency_ms.p50 <= result.latency_ms.p99 <= result.latency_ms.max
    assert result.client_cpu_us_per_request > 0


@pytest.mark.parametrize("shm", [False, True])
def test_direct_triton_batches_plain_and_shared_memory(lt_stack: Stack, shm: bool) -> None:
    assert lt_stack.triton
    spec = TritonSpec(url=lt_stack.triton.grpc_url, model="fakeemb_onnx_ensemble", shm=shm)
    result = run_step("triton", spec, SHORT.model_copy(update={"batch": 8}), TEXTS)
    assert result.errors == 0, result.error_samples
    assert result.items == result.requests * 8 and result.requests >= 10


def test_open_loop_holds_the_offered_rate(lt_stack: Stack) -> None:
    assert lt_stack.triton
    spec = TritonSpec(url=lt_stack.triton.grpc_url, model="fakeemb_onnx_ensemble")
    result = run_step("open", spec, StepSettings(mode="open", rate=60, concurrency=16, duration_s=2, warmup_s=0.3), TEXTS)
    assert result.errors == 0 and result.dropped == 0  # every arrival of the schedule was sent and answered
    # Requests are counted by their scheduled arrival (seeded Poisson, 60/s over the 2 s window), not by when
    # the machine got to them: the count is the schedule's, whatever the load
    assert 60 <= result.requests <= 200, "Poisson arrivals at 60/s over 2 s"


@pytest.mark.slow  # spawns client processes, ~2 s: `scripts/test -m slow`
def test_two_client_processes_merge(lt_stack: Stack) -> None:
    assert lt_stack.gateway
    spec = GatewaySpec(url=lt_stack.gateway.url, endpoint="embed", model="fakeemb")
    result = run_step("procs", spec, SHORT.model_copy(update={"procs": 2}), TEXTS)
    assert result.errors == 0 and result.requests >= 10 and result.settings.procs == 2


@pytest.mark.parametrize("client", ["aiohttp", "raw"])
def test_errors_are_counted_not_raised(client: str) -> None:
    spec = GatewaySpec(url=f"http://127.0.0.1:{free_port()}", endpoint="embed", client=client)  # type: ignore[arg-type]
    result = run_step("down", spec, StepSettings(duration_s=0.5, warmup_s=0, concurrency=2), TEXTS)
    assert result.requests == 0 and result.errors > 0
    assert result.error_samples


def test_an_error_answer_is_a_counted_error(lt_stack: Stack) -> None:
    assert lt_stack.gateway
    spec = GatewaySpec(url=lt_stack.gateway.url, endpoint="embed", model="no-such-model", client="raw")
    result = run_step("404", spec, SHORT, TEXTS)
    assert result.requests == 0 and result.errors > 0
    assert all("RuntimeError: HTTP 404: " in sample for sample in result.error_samples), result.error_samples


@pytest.mark.slow  # the CLI's report and matplotlib plot, ~5 s: `scripts/test -m slow`
def test_cli_writes_json_table_and_plot(lt_stack: Stack, tmp_path: Path) -> None:
    assert lt_stack.gateway
    rc = cli_main(["gateway", "--url", lt_stack.gateway.url, "--endpoint", "embed", "--endpoint", "openai",
                   "--model", "fakeemb", "--concurrency", "1,2", "--rate", "20", "--duration", "0.5", "--warmup", "0.1",
                   "--name", "smoke", "--out", str(tmp_path), "--no-progress", "--corpus-size", "100"])
    assert rc == 0
    out = tmp_path / "smoke"
    record = json.loads((out / "results.json").read_text())
    assert len(record["steps"]) == 6 and record["machine"]["cpu_count"] >= 1
    assert {s["label"] for s in record["steps"]} == {"gateway embed", "gateway openai"}
    assert (out / "throughput_latency.png").read_bytes()[:4] == b"\x89PNG"
    assert "| gateway openai | open |" in (out / "summary.md").read_text()
