"""Triton's failures as a real tritonserver reports them, and what the gateway's client makes of each.

`translate_error` maps by gRPC status code first and reads Triton's message only where one code covers
several cases (a full queue and an unreachable server are both UNAVAILABLE; an unknown model and an
unknown shm region both NOT_FOUND). Those messages are Triton's, not ours: each case here pins the status
and the words the mapping relies on, so a Triton upgrade that rewords one fails here, not in production.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.utils.shared_memory as tshm
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.utils import InferenceServerException

from devstack.fake_repository import EMBED_DIM, write_fake_repository
from devstack.tritonserver import TritonServer, free_port
from gateway.errors import ErrorKind, ErrorType, GatewayError
from gateway.settings import GatewaySettings
from gateway.triton.client import TritonClient
from gateway.triton.errors import in_use, repository_error, shm_missing, status_name, translate_error
from gateway.triton.tensors import Output
from tests.fixtures.triton import serving
from tests.fixtures.waiting import until

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """The fake step, `queued` (the same with a queue of one: Triton refuses the rest) and `idle` (in the
    repository, never loaded)."""
    root = tmp_path_factory.mktemp("triton_errors")
    repository = write_fake_repository(root / "repo")
    step = text_format.Parse((repository / "fakeemb_onnx" / "config.pbtxt").read_text(), mc.ModelConfig())
    for name in ("queued", "idle"):
        step.name = name
        if name == "queued":
            step.dynamic_batching.default_queue_policy.max_queue_size = 1
        (repository / name / "1").mkdir(parents=True)
        (repository / name / "config.pbtxt").write_text(text_format.MessageToString(step))
        shutil.copy(repository / "fakeemb_onnx" / "1" / "model.py", repository / name / "1" / "model.py")
    with serving(TritonServer(repository=repository, load_models=("fakeemb_onnx", "queued"),
                              log_path=root / "triton.log")) as running:
        yield running


@pytest.fixture
async def grpc(server: TritonServer) -> AsyncIterator[grpcaio.InferenceServerClient]:
    client = grpcaio.InferenceServerClient(server.grpc_url)
    yield client
    await client.close()


def texts(*values: str) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("text", [len(values), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([v.encode() for v in values], dtype=np.object_).reshape(-1, 1))
    return [tensor]


async def failure(call: Awaitable[object]) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        await call
    return caught.value


async def test_a_model_triton_does_not_serve_is_model_unavailable(grpc: grpcaio.InferenceServerClient) -> None:
    await grpc.load_model("idle")
    await grpc.unload_model("idle")
    for model, words in (("nosuchmodel", "is not found"), ("idle", "has no available versions")):  # (also: loading)
        exc = await failure(grpc.infer(model, texts("a")))
        assert status_name(exc) == "NOT_FOUND" and f"Request for unknown model: '{model}' {words}" in exc.message()
        error = translate_error(exc)
        assert error.kind is ErrorKind.UNAVAILABLE and error.type is ErrorType.MODEL_UNAVAILABLE, exc.message()
        assert not shm_missing(exc)
    exc = await failure(grpc.get_model_config("idle"))  # discovery meets the same answer
    assert translate_error(exc).type is ErrorType.MODEL_UNAVAILABLE


async def test_an_unknown_shm_region_is_told_apart_from_an_unknown_model(grpc: grpcaio.InferenceServerClient) -> None:
    tensor = grpcclient.InferInput("text", [1, 1], "BYTES")
    tensor.set_shared_memory("gwerrors_gone", 16, 0)  # what a call meets after Triton restarted
    exc = await failure(grpc.infer("fakeemb_onnx", [tensor]))
    assert status_name(exc) == "NOT_FOUND" and "Unable to find shared memory region: 'gwerrors_gone'" in exc.message()
    assert shm_missing(exc)
    assert translate_error(exc).kind is ErrorKind.UPSTREAM  # (the client registers again and retries first)


async def test_a_region_a_request_holds_cannot_be_unregistered(
    grpc: grpcaio.InferenceServerClient, tmp_path: Path
) -> None:
    gate, name, key = tmp_path / "gate", "gwerrors_held", "/gwerrors_held"
    handle = tshm.create_shared_memory_region(name, key, 256)
    output = grpcclient.InferRequestedOutput("embeddings")
    output.set_shared_memory(name, 32, 0)
    holder: asyncio.Future[object] | None = None
    try:
        await grpc.register_system_shared_memory(name, key, 256)
        holder = asyncio.ensure_future(grpc.infer("fakeemb_onnx", texts(f"hold:{gate} a"), outputs=[output]))
        held = tmp_path / "gate.held"  # the fake model makes it once the call is inside it
        await until(held.exists, "the holding call inside the model")
        refused = await failure(grpc.unregister_system_shared_memory(name))
        assert status_name(refused) == "INTERNAL" and "it is currently in use" in refused.message()
        assert in_use(refused)
    finally:
        gate.touch()
        if holder is not None:
            await asyncio.gather(holder, return_exceptions=True)

        async def unregistered() -> bool:
            try:
                await grpc.unregister_system_shared_memory(name)
            except InferenceServerException as exc:
                if in_use(exc):
                    return False
                raise
            return True

        # Triton lets go of the region when it releases the request, which can come after the response
        await until(unregistered, "Triton letting go of the region", within_s=30, poll_s=0.05)
        tshm.destroy_shared_memory_region(handle)


async def test_a_full_queue_is_overloaded_and_an_unreachable_triton_unavailable(
    grpc: grpcaio.InferenceServerClient, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    running = asyncio.ensure_future(grpc.infer("queued", texts(f"hold:{gate} a")))  # keeps the instance busy
    await grpc.is_server_live()  # a round trip behind it: it runs alone
    extra = [asyncio.ensure_future(grpc.infer("queued", texts("b"))) for _ in range(3)]
    try:
        done, _ = await asyncio.wait(extra, return_when=asyncio.FIRST_EXCEPTION)  # one waits, the others are refused
        refused = next(call.exception() for call in done)
        assert isinstance(refused, InferenceServerException)
        assert status_name(refused) == "UNAVAILABLE" and "Exceeds maximum queue size" in refused.message()
        error = translate_error(refused)
        assert error.type is ErrorType.OVERLOADED and error.retry_after_s
    finally:
        gate.touch()
        await asyncio.gather(running, *extra, return_exceptions=True)
    nobody = grpcaio.InferenceServerClient(f"localhost:{free_port()}")
    try:
        exc = await failure(nobody.infer("fakeemb_onnx", texts("a"), client_timeout=5))
    finally:
        await nobody.close()
    assert status_name(exc) == "UNAVAILABLE" and "failed to connect" in exc.message()
    error = translate_error(exc)
    assert error.type is ErrorType.TRITON_UNAVAILABLE


async def test_a_passed_deadline_is_a_timeout_and_a_refused_load_keeps_its_reason(
    grpc: grpcaio.InferenceServerClient, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    try:
        exc = await failure(grpc.infer("fakeemb_onnx", texts(f"hold:{gate} a"), client_timeout=0.2))
    finally:
        gate.touch()
    assert status_name(exc) == "DEADLINE_EXCEEDED" and translate_error(exc).kind is ErrorKind.TIMEOUT
    exc = await failure(grpc.load_model("nosuchmodel"))  # not a model that is gone: the admin call says why
    error = repository_error(exc, "nosuchmodel", "load")
    assert error.type is ErrorType.LOAD_FAILED and "failed to load 'nosuchmodel'" in error.message, error.message


async def test_close_waits_for_grpcs_late_reports_only_after_a_call_that_did_not_end_well(
    server: TritonServer, tmp_path: Path
) -> None:
    """gRPC reports the end of a cancelled or timed-out call later, on the loop that made it: the client stays on
    its loop at close() after such a call (or with one in flight), and closes at once after clean calls."""
    def ensemble(client: TritonClient, text: str, within_s: float = 30.0) -> Awaitable[object]:
        """One text through the fake step (it takes texts, like an ensemble)."""
        return client.infer_ensemble("fakeemb_onnx", [text.encode()], Output("embeddings", EMBED_DIM, "e"),
                                     deadline=time.monotonic() + within_s)

    clean = TritonClient(GatewaySettings(triton_url=server.grpc_url, shm="none"))
    assert await clean.server_live() and await clean.model_ready("fakeemb_onnx")
    await ensemble(clean, "a b")
    assert not clean._calls.may_report_late
    await clean.close()

    timed_out = TritonClient(GatewaySettings(triton_url=server.grpc_url, shm="none"))
    gate = tmp_path / "gate"
    try:
        with pytest.raises(GatewayError) as caught:
            await ensemble(timed_out, f"hold:{gate} a", within_s=0.2)
    finally:
        gate.touch()
    assert caught.value.kind is ErrorKind.TIMEOUT
    assert timed_out._calls.may_report_late and timed_out._calls.in_flight == 0
    await timed_out.close()

    cancelled = TritonClient(GatewaySettings(triton_url=server.grpc_url, shm="none"))
    gate = tmp_path / "gate2"
    call = asyncio.ensure_future(ensemble(cancelled, f"hold:{gate} a"))
    try:
        await until(lambda: cancelled._calls.in_flight == 1, "the call in flight")
        assert cancelled._calls.may_report_late  # closing now would cancel it
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
    finally:
        gate.touch()
    assert cancelled._calls.unclean == 1 and cancelled._calls.in_flight == 0
    await cancelled.close()
