"""A worker's inference calls to Triton over one bidirectional `ModelStreamInfer` stream.

A unary gRPC call pays for a new HTTP/2 stream and a call object on both ends; a message on an open stream does
not. Requests carry ids and answers are matched to them by id, in whatever order Triton finishes them; writes
are serialized, as gRPC requires.

What a stream cannot carry, and the client keeps unary calls for: per-call gRPC metadata (trace context) and
per-call cancellation. A call that passes its deadline stops waiting here, and Triton still runs it (its region
is then abandoned and taken back once Triton lets go, as for a cancelled unary call).

An answer's error has no gRPC status code, only Triton's message: `error_status` gives it the code the unary
call carries, so one `translate_error` serves both. When the stream breaks (Triton stopped), every call waiting
on it fails UNAVAILABLE and the next call opens a new stream.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException




@dataclass(frozen=True)
class Placement:
    """Where a tensor's bytes travel: a shared-memory slot (region, byte size, offset), or the message itself."""

    name: str
    datatype: str = ""
    shape: tuple[int, ...] = ()
    region: str | None = None
    size: int = 0
    offset: int = 0
    content: Any = None  # what goes in the message: an object with `payload()` (client.Tensor)


def inference_request(model: str, inputs: Sequence[Placement], outputs: Sequence[Placement], timeout_us: int,
                      parameters: dict[str, str] | None) -> service_pb2.ModelInferRequest:
    """Triton's request message, field for field what tritonclient's `infer` sends for the same call."""
    request = service_pb2.ModelInferRequest(model_name=model)
    for placed in inputs:
        tensor = request.inputs.add(name=placed.name, datatype=placed.datatype, shape=placed.shape)
        if placed.region is not None:
            _shared_memory(tensor.parameters, placed)
        else:
            payload = placed.content.payload()
            request.raw_input_contents.append(payload if isinstance(payload, bytes) else payload.tobytes())
    for placed in outputs:
        output = request.outputs.add(name=placed.name)
        if placed.region is not None:
            _shared_memory(output.parameters, placed)
    request.parameters["timeout"].int64_param = timeout_us
    for key, value in (parameters or {}).items():
        request.parameters[key].string_param = value
    return request


def _shared_memory(parameters: object, placed: Placement) -> None:
    parameters["shared_memory_region"].string_param = placed.region  # type: ignore[index]
    parameters["shared_memory_byte_size"].int64_param = placed.size  # type: ignore[index]
    if placed.offset:
        parameters["shared_memory_offset"].int64_param = placed.offset  # type: ignore[index]


def error_status(message: str) -> str:
    """The gRPC status Triton gives a unary call that fails with `message` (pinned in test_triton_errors.py)."""
    lower = message.lower()
    if "unknown model" in lower or "is not found" in lower or "unable to find shared memory region" in lower:
        return "StatusCode.NOT_FOUND"
    if "exceeds maximum queue size" in lower or "timeout expired" in lower:
        return "StatusCode.UNAVAILABLE"
    return "StatusCode.INTERNAL"


class _Open:
    """One open stream: its call, the reader of its answers, and the calls waiting on them by id."""

    def __init__(self, call: grpc.aio.StreamStreamCall) -> None:
        self.call = call
        self.waiting: dict[str, asyncio.Future[service_pb2.ModelInferResponse]] = {}
        self.broken = False
        self.reader = asyncio.get_running_loop().create_task(self._read())

    async def _read(self) -> None:
        detail = "Triton ended the stream"
        try:
            while (message := await self.call.read()) is not grpc.aio.EOF:
                future = self.waiting.get(message.infer_response.id)
                if future is None or future.done():
                    continue  # its caller stopped waiting
                if message.error_message:
                    future.set_exception(InferenceServerException(message.error_message,
                                                                  status=error_status(message.error_message)))
                else:
                    future.set_result(message.infer_response)
        except grpc.aio.AioRpcError as exc:
            detail = exc.details() or str(exc.code())
        except asyncio.CancelledError:  # the call or this task was cancelled: fail() or close()
            detail = "the stream was cancelled"
        self.fail(detail)

    def fail(self, detail: str) -> None:
        """Every call waiting on this stream fails UNAVAILABLE (Triton is unreachable or stopping)."""
        self.broken = True
        self.call.cancel()
        for future in self.waiting.values():
            if not future.done():
                future.set_exception(InferenceServerException(f"Triton's stream broke: {detail}",
                                                              status="StatusCode.UNAVAILABLE"))


class InferStream:
    """Inferences of one worker over a `ModelStreamInfer` stream of a channel of its own, opened on first use and
    again after it broke."""

    def __init__(self, url: str, channel_args: list[tuple[str, int]]) -> None:
        self._channel = grpc.aio.insecure_channel(url, options=channel_args)
        self._stub = service_pb2_grpc.GRPCInferenceServiceStub(self._channel)
        self._open: _Open | None = None
        self._ids = itertools.count()
        self._write = asyncio.Lock()

    async def infer(self, request: service_pb2.ModelInferRequest, timeout_s: float) -> service_pb2.ModelInferResponse:
        """Triton's answer to `request` (whose `id` is set here); failures raise InferenceServerException with the
        status a unary call carries (DEADLINE_EXCEEDED after `timeout_s`)."""
        request.id = str(next(self._ids))
        future: asyncio.Future[service_pb2.ModelInferResponse] = asyncio.get_running_loop().create_future()
        async with self._write:
            stream = self._stream()
            stream.waiting[request.id] = future
            try:
                await stream.call.write(request)
            except (grpc.aio.AioRpcError, grpc.aio.UsageError, asyncio.InvalidStateError) as exc:
                stream.fail(exc.details() or "" if isinstance(exc, grpc.aio.AioRpcError) else str(exc))
        try:
            async with asyncio.timeout(timeout_s):
                return await future
        except TimeoutError:
            raise InferenceServerException("Deadline Exceeded", status="StatusCode.DEADLINE_EXCEEDED") from None
        finally:
            stream.waiting.pop(request.id, None)

    def _stream(self) -> _Open:
        if self._open is None or self._open.broken:
            self._open = _Open(self._stub.ModelStreamInfer())
        return self._open

    async def close(self) -> None:
        """Stop the stream and close its channel."""
        if self._open is not None:
            self._open.fail("the gateway is closing")
            self._open.reader.cancel()
            await asyncio.gather(self._open.reader, return_exceptions=True)
        await self._channel.close()
