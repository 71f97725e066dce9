"""Queue policy (issue 9): opt-in (--queue-timeout-ms / --max-queue-size; off by default because Triton
2.51 stalls with one, docs/contract.md), a dynamic batcher with one rejects instead of queueing without
bound; with or without one, what a caller gave up on is not executed. Real builder, real tritonserver,
real gRPC.

Tokenizing one long text keeps a tokenizer's single instance busy for a second or two; the requests
sent meanwhile wait in its queue. Assertions are on outcomes and Triton's own statistics, never on
how long the machine took.
"""

from __future__ import annotations

import asyncio
import re
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient
from google.protobuf import text_format
from pydantic import ValidationError
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.utils import InferenceServerException

from builder import configs
from builder.cli import _parser, main, requests_from_args
from builder.configs import read_config
from builder.manifest import read_manifest
from builder.settings import BuildRequest, ResolvedSettings
from devstack.tritonserver import TritonServer
from tests.fixtures.triton import serving
from tests.fixtures.waiting import until

TINY = ["--runtime", "python", "--device", "cpu", "--formats", "onnx", "--max-seq-len", "64", "--max-batch-size", "8"]
# ~2.5 MB: one tokenizer execution of about 2 s on the 2-core CI machine (0.8 s per million characters).
SLOW_TEXT = "good movie " * 230_000
# ~5 MB, about 4 s: time for requests to be seen queued (Triton's pending count) and then abandoned
SLOWER_TEXT = SLOW_TEXT * 2
QUEUE_FULL = "Exceeds maximum queue size"
TIMED_OUT = "Request timeout expired"
LONG_TIMEOUT_US = 30_000_000  # a request's own timeout, longer than any default here


def _policy(config: mc.ModelConfig) -> mc.ModelQueuePolicy:
    assert config.dynamic_batching.HasField("default_queue_policy"), config.name
    return config.dynamic_batching.default_queue_policy


def test_no_queue_policy_by_default(python_repository: Path) -> None:
    """Tokenizer and model step have a dynamic batcher without a queue policy; ensembles have no batcher."""
    for name in ("tinycls", "tinyemb"):
        for entry in (f"{name}_tokenizer", f"{name}_onnx"):
            config = read_config(python_repository / entry / "config.pbtxt")
            assert config.HasField("dynamic_batching") and not config.dynamic_batching.HasField("default_queue_policy")
        ensemble = read_config(python_repository / f"{name}_onnx_ensemble" / "config.pbtxt")
        assert ensemble.platform == "ensemble" and not ensemble.HasField("dynamic_batching")


def test_flags_write_the_policy(python_repository: Path) -> None:
    args = _parser().parse_args(["build", "--repository", "r", "--model", "m", "--task", "embed", "--name", "n",
                                 "--queue-timeout-ms", "250", "--max-queue-size", "3"])
    (request,) = requests_from_args(args)
    assert (request.queue_timeout_ms, request.max_queue_size) == (250, 3)
    default = BuildRequest(model="m", task="embed", name="n", max_batch_size=32)
    assert (default.queue_timeout_ms, default.max_queue_size) == (0, 0)
    with pytest.raises(ValidationError):
        BuildRequest(model="m", task="embed", name="n", max_queue_size=-1)

    manifest = read_manifest(python_repository / "tinyemb_onnx")
    assert manifest is not None
    settings = manifest.settings.model_copy(update={"queue_timeout_ms": 250, "max_queue_size": 3})
    config = text_format.Parse(text_format.MessageToString(configs.onnx_config(settings, 32, "fp32")), mc.ModelConfig())
    policy = _policy(config)
    assert (policy.default_timeout_microseconds, policy.max_queue_size) == (250_000, 3)
    assert policy.allow_timeout_override and policy.timeout_action == mc.ModelQueuePolicy.REJECT
    # settings resolved elsewhere without them (loadtest/model_step.py) get the same defaults: no policy
    others = manifest.settings.model_dump(exclude={"queue_timeout_ms", "max_queue_size"})
    resolved = ResolvedSettings.model_validate(others)
    assert (resolved.queue_timeout_ms, resolved.max_queue_size) == (0, 0)
    assert not configs.onnx_config(resolved, 32, "fp32").dynamic_batching.HasField("default_queue_policy")
    off = manifest.settings.model_copy(update={"dynamic_batching": False})
    assert not configs.tokenizer_config(off, 0, "sha").HasField("dynamic_batching")


@pytest.fixture(scope="module")
def server(tiny_embedder_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """Built by the CLI from a spec: `full` (max_queue_size 1, a 300 ms default timeout), `q` (64 and 5 s)
    and `plain` (the defaults: no queue policy)."""
    root = tmp_path_factory.mktemp("queue_policy")
    spec = root / "models.yaml"
    spec.write_text(f"models:\n"
                    f"  - {{name: full, model: {tiny_embedder_dir}, task: embed,\n"
                    f"     max_queue_size: 1, queue_timeout_ms: 300}}\n"
                    f"  - {{name: q, model: {tiny_embedder_dir}, task: embed,\n"
                    f"     max_queue_size: 64, queue_timeout_ms: 5000}}\n"
                    f"  - {{name: plain, model: {tiny_embedder_dir}, task: embed}}\n")
    repository = root / "model_repository"
    assert main(["build", "--spec", str(spec), "--repository", str(repository), *TINY]) == 0
    for entry, size, timeout_us in (("full_tokenizer", 1, 300_000), ("full_onnx", 1, 300_000),
                                    ("q_tokenizer", 64, 5_000_000), ("q_onnx", 64, 5_000_000)):
        policy = _policy(read_config(repository / entry / "config.pbtxt"))
        assert (policy.max_queue_size, policy.default_timeout_microseconds) == (size, timeout_us), entry
    for entry in ("plain_tokenizer", "plain_onnx"):
        assert not read_config(repository / entry / "config.pbtxt").dynamic_batching.HasField("default_queue_policy")
    with serving(TritonServer(repository, log_path=root / "tritonserver.log")) as triton:
        yield triton


def _text(text: str) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("text", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[text.encode()]], dtype=object))
    return [tensor]


def _stats(url: str, model: str) -> dict[str, int]:
    stats = grpcclient.InferenceServerClient(url).get_inference_statistics(model, as_json=True)["model_stats"][0]
    inference = stats["inference_stats"]
    return {"executions": int(stats.get("execution_count", 0)), "inferences": int(stats.get("inference_count", 0)),
            "success": int(inference["success"].get("count", 0)), "fail": int(inference["fail"].get("count", 0))}


async def _outcome(client: aioclient.InferenceServerClient, model: str, text: str, **kwargs: Any) -> tuple[str, float]:
    """("ok" or "STATUS | message", monotonic time the answer came)."""
    try:
        await client.infer(model, _text(text), **kwargs)
        return "ok", time.monotonic()
    except InferenceServerException as exc:
        return f"{exc.status()} | {exc.message()}", time.monotonic()


def _instance_cpu_s(server: TritonServer, model: str) -> float:
    """CPU seconds used so far by `model`'s python-backend stub process (its one instance)."""
    assert server.process is not None
    stubs = [p for p in psutil.Process(server.process.pid).children(recursive=True)
             if any(f"/{model}/" in arg for arg in p.cmdline())]
    assert len(stubs) == 1, stubs
    times = stubs[0].cpu_times()
    return float(times.user + times.system)


async def _busy(client: aioclient.InferenceServerClient, server: TritonServer, model: str,
                text: str = SLOW_TEXT) -> asyncio.Task[tuple[str, float]]:
    """Start the long tokenization on `model` and wait until its instance is busy with it (its stub process
    has spent a fifth of a second of CPU on it; an idle stub spends none)."""
    before = _instance_cpu_s(server, model)
    slow = asyncio.create_task(_outcome(client, model, text))
    await until(lambda: _instance_cpu_s(server, model) - before >= 0.2, f"{model}'s instance busy")
    assert not slow.done(), "the slow request finished before the test could queue behind it"
    return slow


@pytest.mark.slow  # an opt-in Triton queue policy filled under load: scripts/test -m slow
@pytest.mark.timeout(120)
def test_full_queue_rejects_at_once(server: TritonServer) -> None:
    """max_queue_size 1: of 16 requests behind a busy instance one waits, the rest are rejected at once.
    The one that waits passed its own 30 s timeout, but a request's timeout can only shorten the
    default (300 ms here), never extend it: it is rejected too, once the instance frees."""
    async def run() -> tuple[tuple[str, float], list[tuple[str, float]], list[tuple[str, float]]]:
        client = aioclient.InferenceServerClient(server.grpc_url)
        try:
            slow = await _busy(client, server, "full_tokenizer")
            kwargs = {"timeout": LONG_TIMEOUT_US}
            direct = [_outcome(client, "full_tokenizer", f"text {i}", **kwargs) for i in range(12)]
            ensemble = [_outcome(client, "full_onnx_ensemble", f"text {i}", **kwargs) for i in range(4)]
            answers = await asyncio.gather(*direct, *ensemble)
            return await slow, answers[:12], answers[12:]
        finally:
            await client.close()

    (slow, slow_at), direct, ensemble = asyncio.run(run())
    assert slow == "ok"
    unavailable = "StatusCode.UNAVAILABLE | "
    in_ensemble = "in ensemble 'full_onnx_ensemble', "
    queue_full = f"[request id: <id_unknown>] {QUEUE_FULL}"
    full = [at for outcome, at in direct if outcome == f"{unavailable}{queue_full}"]
    full += [at for outcome, at in ensemble if outcome == f"{unavailable}{in_ensemble}{queue_full}"]
    waited = [outcome for outcome, _ in direct + ensemble if QUEUE_FULL not in outcome]
    assert len(full) >= 14 and max(full) < slow_at, (direct, ensemble)  # at once, not when the instance frees
    assert set(waited) <= {f"{unavailable}{TIMED_OUT}", f"{unavailable}{in_ensemble}{TIMED_OUT}"}, waited


@pytest.mark.slow  # an opt-in Triton queue policy's timeout: scripts/test -m slow
@pytest.mark.timeout(120)
def test_request_timeout_rejects_while_queued(server: TritonServer) -> None:
    """A request's own `timeout` shorter than its wait is rejected and not executed; without one the
    5 s default applies and it runs."""
    before = _stats(server.grpc_url, "q_tokenizer")

    async def run() -> list[tuple[str, float]]:
        client = aioclient.InferenceServerClient(server.grpc_url)
        try:
            slow = await _busy(client, server, "q_tokenizer")
            waiting = await asyncio.gather(
                _outcome(client, "q_tokenizer", "own timeout 100 ms", timeout=100_000),
                _outcome(client, "q_onnx_ensemble", "through the ensemble", timeout=100_000),
                _outcome(client, "q_tokenizer", "the default 5 s"),
            )
            return [await slow, *waiting]
        finally:
            await client.close()

    slow, short, ensemble, default = (outcome for outcome, _ in asyncio.run(run()))
    assert (slow, default) == ("ok", "ok")
    assert short == f"StatusCode.UNAVAILABLE | {TIMED_OUT}"
    assert ensemble == f"StatusCode.UNAVAILABLE | in ensemble 'q_onnx_ensemble', {TIMED_OUT}"
    after = _stats(server.grpc_url, "q_tokenizer")
    # executed: the slow request, then the one under the default; rejected: the two with 100 ms
    assert after["executions"] - before["executions"] == 2
    assert (after["success"] - before["success"], after["fail"] - before["fail"]) == (2, 2)


async def _queued(server: TritonServer, model: str, count: int) -> None:
    """Wait until Triton's `nv_inference_pending_request_count` of `model` reaches `count`."""
    pattern = re.compile(rf'^nv_inference_pending_request_count{{model="{model}",version="1"}} (\S+)$', re.M)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        metrics = await asyncio.to_thread(lambda: urllib.request.urlopen(server.metrics_url, timeout=5).read().decode())
        found = pattern.search(metrics)
        if found and float(found.group(1)) >= count:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{model}: fewer than {count} requests pending after 20 s")


def _settled(url: str, model: str, done: Callable[[dict[str, int]], bool]) -> dict[str, int]:
    """Triton's statistics of `model` once `done` holds for them (Triton answers some calls after the test's), or
    after 20 s."""
    deadline = time.monotonic() + 20
    while not done(stats := _stats(url, model)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return stats


@pytest.mark.slow  # an opt-in Triton queue policy and abandoned calls: scripts/test -m slow
@pytest.mark.timeout(120)
def test_abandoned_requests_are_not_executed(server: TritonServer) -> None:
    """A client's cancel and a passed gRPC deadline abandon a queued request: with no queue policy (the
    default) the model skips it, and a cancelled ensemble request never reaches the model step."""
    url = server.grpc_url
    tokenizer, step, ensemble = (_stats(url, m) for m in ("plain_tokenizer", "plain_onnx", "plain_onnx_ensemble"))

    async def direct() -> list[str]:
        client = aioclient.InferenceServerClient(url)
        try:
            slow = await _busy(client, server, "plain_tokenizer", SLOWER_TEXT)
            cancelled = [asyncio.create_task(client.infer("plain_tokenizer", _text(f"cancel {i}"))) for i in range(3)]
            await _queued(server, "plain_tokenizer", 3)  # cancelled once Triton holds them, not before
            deadlines = [asyncio.create_task(_outcome(client, "plain_tokenizer", f"deadline {i}", client_timeout=1.0))
                         for i in range(2)]
            await _queued(server, "plain_tokenizer", 5)
            for task in cancelled:
                task.cancel()
            outcomes = [outcome for outcome, _ in await asyncio.gather(*deadlines)]
            assert not slow.done(), "the slow request finished before the deadlines passed"
            done, _ = await asyncio.wait(cancelled, timeout=5)
            assert len(done) == 3 and all(task.cancelled() for task in done)
            return [(await slow)[0], *outcomes]
        finally:
            await client.close()

    assert asyncio.run(direct()) == ["ok"] + ["StatusCode.DEADLINE_EXCEEDED | Deadline Exceeded"] * 2
    # settled: all 5 abandoned requests executed, or the batch after the slow one done (Triton dropped some itself)
    after = _settled(url, "plain_tokenizer", lambda s: s["inferences"] >= tokenizer["inferences"] + 6
                     or s["executions"] >= tokenizer["executions"] + 2)
    # Without a queue policy Triton 2.51 hands most abandoned requests to the model, in one batch after the
    # slow one (it drops one itself now and then, a race in its own queue); the python models find them
    # cancelled and answer CANCELLED without tokenizing (Triton counts those answers as successes).
    handed_over = after["inferences"] - tokenizer["inferences"] - 1
    assert 0 <= handed_over <= 5
    assert after["executions"] - tokenizer["executions"] == (2 if handed_over else 1)

    async def through_ensemble() -> list[str]:
        client = aioclient.InferenceServerClient(url)
        try:
            slow = await _busy(client, server, "plain_tokenizer")
            tasks = [asyncio.create_task(client.infer("plain_onnx_ensemble", _text(f"cancel {i}"))) for i in range(3)]
            await _queued(server, "plain_tokenizer", 3)  # cancelled once Triton holds them
            for task in tasks:
                task.cancel()
            # queued behind the cancelled ones: once it is answered they have passed both steps' queues
            sentinel = asyncio.create_task(_outcome(client, "plain_onnx_ensemble", "sentinel"))
            await asyncio.wait(tasks, timeout=5)
            return [(await slow)[0], (await sentinel)[0]]
        finally:
            await client.close()

    assert asyncio.run(through_ensemble()) == ["ok", "ok"]
    _settled(url, "plain_onnx_ensemble", lambda s: s["fail"] >= ensemble["fail"] + 3)
    # Triton 2.51 may still run the tokenizer step of a cancelled ensemble request; the model step runs
    # the sentinel's text only
    assert _stats(url, "plain_onnx")["inferences"] - step["inferences"] == 1
    # still serving: a request after all this is answered
    assert grpcclient.InferenceServerClient(url).infer("plain_onnx_ensemble", _text("good movie")).as_numpy(
        "embeddings").shape == (1, 32)
