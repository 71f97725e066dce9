"""Overload and abandoned calls against real parts: a tritonserver, a gateway process, real shm.

- An overload storm on a model heavy enough that Triton falls behind: goodput stays near the
  capacity measured first, no caller ever gets another caller's answer, and a request right
  after the storm is answered within seconds (loadtest/storm.py measures; this test judges).
- A call the gateway abandons (its deadline passed) keeps its shared-memory region out of use
  until Triton has finished with it, and the region comes back registered afterwards.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from devstack.fake_repository import EMBED_DIM, fake_vector
from devstack.gateway import GatewayProcess
from devstack.tritonserver import TritonServer
from loadtest.corpus import fixed_length_corpus
from loadtest.models import make_bert
from loadtest.storm import StormReport, StormSettings, run_storm, triton_embedding
from tests.fixtures.repository import PYTHON_CPU, build_repository
from tests.gateway.conftest import running_gateway

MODEL = "stormemb"
# What the issue measured with: a 2 s Triton deadline and a 3 s request deadline.
STORM_GATEWAY = {"request_timeout_s": "3", "triton_timeout_s": "2"}


@pytest.fixture(scope="module")
def storm_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 6-layer, 256-wide random BERT embedder (loadtest.models `medium`): Triton is the bottleneck."""
    root = tmp_path_factory.mktemp("storm")
    source = make_bert(root / "source", "embed", "medium")
    repository = root / "model_repository"
    build_repository(repository, [{"model": str(source), "task": "embed", "name": MODEL}], **PYTHON_CPU,
                     max_seq_len=128, max_batch_size=32)
    return repository


@pytest.fixture(scope="module")
def storm_triton(storm_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    log = tmp_path_factory.mktemp("storm_logs") / "tritonserver.log"
    with TritonServer(repository=storm_repository, log_path=log) as server:
        yield server


def storm(triton: TritonServer, repository: Path, tmp_path: Path, seconds: float, **gateway: str) -> StormReport:
    texts = fixed_length_corpus(24, size=96)
    client = grpcclient.InferenceServerClient(triton.grpc_url)
    reference = {t: triton_embedding(client, f"{MODEL}_onnx_ensemble", t) for t in texts}
    settings = {"repository": str(repository), **STORM_GATEWAY, **gateway}
    with GatewayProcess(triton_url=triton.grpc_url, settings=settings, log_path=tmp_path / "gateway.log") as proc:
        report = asyncio.run(run_storm(proc.url, reference, StormSettings(model=MODEL, storm_s=seconds), log=print))
    print(json.dumps(report.summary()))
    return report


def judge(report: StormReport) -> None:
    s = report.storm
    answered = sum(s.statuses.values())
    assert report.capacity.correct > 0 and report.capacity.wrong == 0
    assert s.wrong == 0, "a caller got another caller's answer"
    assert report.goodput_ratio >= 0.8, report.summary()
    assert report.recovery_s <= 3.0, report.summary()
    assert set(s.statuses) <= {200, 429, 503, 504}, s.statuses  # shed with 429/503, never a 500 or 502
    assert s.statuses[504] <= 0.02 * answered, s.statuses  # admitted work finishes within its deadline


def test_overload_storm_keeps_goodput_and_recovers_at_once(
    storm_triton: TritonServer, storm_repository: Path, tmp_path: Path
) -> None:
    judge(storm(storm_triton, storm_repository, tmp_path, seconds=8))


@pytest.mark.slow
@pytest.mark.parametrize("pipeline", ["scheduler", "ensemble"])
def test_overload_storm_twenty_seconds(
    storm_triton: TritonServer, storm_repository: Path, tmp_path: Path, pipeline: str
) -> None:
    judge(storm(storm_triton, storm_repository, tmp_path, seconds=20, pipeline=pipeline))


@pytest.mark.anyio
async def test_an_abandoned_calls_region_is_reused_only_after_triton_lets_go(fake_triton: TritonServer) -> None:
    prefix = "gwretire"
    async with running_gateway(fake_triton.grpc_url, shm_prefix=prefix, shm_pool_size=1, request_timeout_s=0.5) as (
        app, client,
    ):
        pool = app.state.runtime.client.pools["fakeemb_onnx_ensemble"]
        started = time.monotonic()
        slow = await client.post("/embed", json={"model": "fakeemb", "inputs": ["sleep:1.5 a"], "normalize": False, "backend": "onnx"})
        assert slow.status_code == 504 and slow.json()["error"]["type"] == "timeout"
        # Triton still executes the abandoned call and holds the region: it stays out of the pool,
        # while other models are served as usual.
        assert pool.free == 0
        other = await client.post("/classify", json={"model": "fakecls", "inputs": ["meanwhile"]})
        assert other.status_code == 200
        assert time.monotonic() - started < 1.4 and pool.free == 0
        while pool.free == 0 and time.monotonic() - started < 10:
            await asyncio.sleep(0.05)
        assert pool.free == 1 and time.monotonic() - started >= 1.4  # back once Triton finished the call
        status = grpcclient.InferenceServerClient(fake_triton.grpc_url).get_system_shared_memory_status(as_json=True)
        assert pool.regions[0].name in status.get("regions", {})  # registered again
        text = "through the region again"
        again = await client.post("/embed", json={"model": "fakeemb", "inputs": [text], "normalize": False, "backend": "onnx"})
        np.testing.assert_allclose(again.json()["embeddings"][0], fake_vector(text, EMBED_DIM), rtol=1e-6)
