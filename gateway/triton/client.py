"""Async Triton gRPC client of one gateway worker: discovery calls, inference, shm pools.

One `tritonclient.grpc.aio` channel per worker. Every inference carries the caller's deadline,
twice: as the gRPC deadline (the call is cancelled when it passes; the python-backend models skip
a request cancelled while it waited) and as Triton's request `timeout`, which only a queue policy
would act on (the builder writes none by default: Triton 2.51 stalls with one, docs/contract.md).
What keeps Triton from computing for nobody is the gateway's own admission and queues: work that
could not be served in time is refused or dropped before it is sent (service/admission.py).

Tensors go through shared-memory regions (`GATEWAY_SHM`: system, or CUDA IPC regions on the GPU;
one pool logic for both, gateway/triton/shm_pool.py). Regions live as long as Triton uses them:
a region whose call was abandoned is unregistered again and again until Triton stops refusing ("in use"), then registered afresh
and reused. When Triton restarted (its registrations are gone), a call that names a region
fails; the first such failure of an epoch registers every region again, concurrent ones
wait for it, and each retries once. A Triton that cannot open the regions (no shared IPC
namespace) leaves the model on plain gRPC, with one warning.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable, Coroutine
from contextlib import nullcontext
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, TypeVar

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

from contract import NUM_TOKENS, TEXT, TEXT_PAIR, TIMEOUT_PARAMETER, TRUNCATION_PARAMETER
from gateway import tracing
from gateway.errors import ErrorKind, ErrorType, GatewayError, unavailable
from gateway.metrics import SHM_RETIRED, TRITON_LATENCY
from gateway.settings import GatewaySettings
from gateway.triton.http_infer import HttpUnreachable, TritonHttpInfer
from gateway.triton.shm_pool import (
    Region,
    RegionLayout,
    ShmPool,
    probe_cuda,
    region_maker,
    serialize_texts,
)

T = TypeVar("T")
log = logging.getLogger("gateway.triton")


@dataclass(frozen=True)
class Output:
    """The output a call asks for: tensor name, row width (fp32), and the model label of its metrics.

    A per-token output (docs/contract.md) is [rows, tokens, width], or [rows, tokens] when width is 0."""

    name: str
    width: int
    label: str
    per_token: bool = False

    def shape(self, rows: int, tokens: int) -> tuple[int, ...]:
        """The output's shape for a batch of `rows` rows padded to `tokens` tokens."""
        if not self.per_token:
            return (rows, self.width)
        return (rows, tokens) if self.width == 0 else (rows, tokens, self.width)


@dataclass(frozen=True)
class Tensor:
    """An input of a call: int32 token tensors, or texts (a BYTES [n, 1] tensor)."""

    name: str
    data: np.ndarray | list[bytes]

    @property
    def shape(self) -> list[int]:
        return list(self.data.shape) if isinstance(self.data, np.ndarray) else [len(self.data), 1]

    @property
    def datatype(self) -> str:
        return "INT32" if isinstance(self.data, np.ndarray) else "BYTES"

    def array(self) -> np.ndarray:
        """The tensor as gRPC sends it."""
        if isinstance(self.data, np.ndarray):
            return self.data
        return np.array(self.data, dtype=np.object_).reshape(len(self.data), 1)

    def payload(self) -> bytes | np.ndarray:
        """The tensor as a shared-memory slot holds it (Triton's BYTES serialization for texts)."""
        return self.data if isinstance(self.data, np.ndarray) else serialize_texts(self.data)


@dataclass(frozen=True)
class Wanted:
    """An output a call asks for, and the shape and dtype it must come back in."""

    name: str
    dtype: type
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize  # math.prod: 0.2 us against np.prod's 3.6


_MAX_MESSAGE = 2**31 - 1
# Reconnect quickly after a Triton restart (gRPC's default backoff grows to 120 s).
CHANNEL_ARGS = [
    ("grpc.max_send_message_length", _MAX_MESSAGE),
    ("grpc.max_receive_message_length", _MAX_MESSAGE),
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_timeout_ms", 10_000),
]
CLOSE_DRAIN_S = 0.2  # how long close() stays on the loop after a call that gRPC may still report on
HTTP_RETRY_S = 10.0  # after Triton's HTTP endpoint refused a connection, calls go over gRPC this long
_RETIRE_POLL_S = (0.02, 1.0)  # first and longest wait between two unregister attempts of a retired region


def _status(exc: InferenceServerException) -> str:
    """The gRPC status code name of a failure ("NOT_FOUND", ...); "" for one tritonclient raised itself."""
    return str(exc.status() or "").removeprefix("StatusCode.")


def translate_error(exc: InferenceServerException) -> GatewayError:
    """Map a Triton/gRPC failure to a gateway error: by its gRPC status code first, by Triton's message only
    where one code covers several cases (the messages are pinned in tests/gateway/test_triton_errors.py)."""
    status, message = _status(exc), exc.message() or str(exc)
    lower = message.lower()
    if status == "DEADLINE_EXCEEDED":
        return GatewayError(ErrorType.TIMEOUT, "Triton did not answer within the deadline")
    if status == "CANCELLED":
        return GatewayError(ErrorType.TIMEOUT, "the Triton call was cancelled")
    if status == "UNAVAILABLE":  # Triton unreachable or stopping, or a model's queue refusing work
        if "exceeds maximum queue size" in lower:  # an opt-in queue policy (max_queue_size)
            return GatewayError(ErrorType.OVERLOADED, "the model's queue is full", retry_after_s=1)
        if "timeout expired" in lower:  # an opt-in queue policy: the request waited past its `timeout`
            return GatewayError(ErrorType.TIMEOUT, "the request expired in Triton's queue")
        return unavailable("Triton is unavailable")
    if status == "NOT_FOUND" and not _shm_missing(exc):  # unknown, unloaded or still loading
        return unavailable(f"model not available in Triton: {message}", type=ErrorType.MODEL_UNAVAILABLE)
    return GatewayError(ErrorType.TRITON_ERROR, f"Triton error: {message}")


def _shm_missing(exc: InferenceServerException) -> bool:
    """A call named a region Triton does not know (it restarted and lost the registrations)."""
    return _status(exc) == "NOT_FOUND" and "shared memory region" in (exc.message() or "").lower()


def _in_use(exc: InferenceServerException) -> bool:
    """Triton refused to unregister a region a request still holds."""
    return _status(exc) == "INTERNAL" and "currently in use" in (exc.message() or "").lower()


def _repository_error(exc: InferenceServerException, model: str, action: Literal["load", "unload"]) -> GatewayError:
    """A failed load or unload: Triton unreachable, or Triton's reason (e.g. a model that does not load)."""
    error = translate_error(exc)
    if error.kind in (ErrorKind.UNAVAILABLE, ErrorKind.TIMEOUT) and error.type is not ErrorType.MODEL_UNAVAILABLE:
        return error
    failed = ErrorType.LOAD_FAILED if action == "load" else ErrorType.UNLOAD_FAILED
    return GatewayError(failed, f"Triton could not {action} {model}: {exc.message() or exc}")


@dataclass(frozen=True, order=True)
class IndexEntry:
    """One row of Triton's repository index: a model version and its state (READY, LOADING, UNLOADING,
    UNAVAILABLE; empty for a model never loaded) with Triton's reason (e.g. `unloaded`, a load error)."""

    name: str
    version: str
    state: str
    reason: str = ""


def _contract_mismatch(model: str, detail: str) -> GatewayError:
    return GatewayError(ErrorType.CONTRACT_MISMATCH, f"{model} answered outside the repository contract: {detail}")


class _CallLedger:
    """The client's calls to Triton, counted: those in flight and those that ended in an exception (cancelled,
    past their deadline, failed). gRPC reports the end of such a call later, through its poller thread; close()
    waits for those reports only when there can be any."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.unclean = 0

    def __enter__(self) -> None:
        self.in_flight += 1

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.in_flight -= 1
        if exc_type is not None:
            self.unclean += 1

    async def track(self, call: Awaitable[T]) -> T:
        """Await `call`, counted (`with ledger:` around an await does the same without a coroutine more)."""
        with self:
            return await call

    @property
    def may_report_late(self) -> bool:
        return self.in_flight > 0 or self.unclean > 0


class TritonClient:
    """The gateway's connection to Triton."""

    def __init__(self, settings: GatewaySettings) -> None:
        if settings.shm == "cuda":  # fails start-up (ShmUnavailable) when this process cannot use the GPU
            log.info("CUDA shared memory on %s", probe_cuda(settings.shm_cuda_device))
        self.settings = settings
        self.timeout = settings.triton_timeout_s
        self.grpc = grpcaio.InferenceServerClient(settings.triton_url, channel_args=CHANNEL_ARGS)
        self.http = TritonHttpInfer(settings.triton_http_url) if settings.triton_http_url != "none" else None
        self._http_refused_at: float | None = None  # when the HTTP endpoint last refused a connection
        self._calls = _CallLedger()  # every gRPC call is counted in it (close() reads it; HTTP reports nothing late)
        self.pools: dict[str, ShmPool] = {}
        self.epoch = 0  # registrations made by this worker; +1 each time they are made again
        self._register_lock = asyncio.Lock()
        self._no_shm: set[str] = set()  # models whose regions Triton could not open
        self._background: set[asyncio.Task[None]] = set()
        self._closed_pools: set[ShmPool] = set()
        self._closing = False  # close() began: no new background work (its regions are being destroyed)
        self._new_region = region_maker("cuda" if settings.shm == "cuda" else "system", settings.shm_prefix,
                                        settings.shm_cuda_device)

    # --- health and discovery -------------------------------------------------------
    async def server_live(self) -> bool:
        try:
            return bool(await self._calls.track(self.grpc.is_server_live(client_timeout=self.timeout)))
        except InferenceServerException:
            return False

    async def model_ready(self, name: str) -> bool:
        try:
            return bool(await self._calls.track(self.grpc.is_model_ready(name, client_timeout=self.timeout)))
        except InferenceServerException:
            return False

    async def repository_index(self) -> list[IndexEntry]:
        """Every (model, version) of Triton's repository index with its state, loaded or not."""
        try:
            index = await self._calls.track(self.grpc.get_model_repository_index(client_timeout=self.timeout))
        except InferenceServerException as exc:
            raise translate_error(exc) from None
        return sorted({IndexEntry(m.name, m.version, m.state, m.reason) for m in index.models})

    async def load_model(self, name: str, timeout_s: float) -> None:
        """Load `name` (or load it again: new versions, changed files) and wait until Triton is done.

        Triton polls an ensemble's steps with it and switches the ensemble once they are ready;
        the loaded version keeps serving until the new one is ready (zero downtime)."""
        try:
            await self._calls.track(self.grpc.load_model(name, client_timeout=timeout_s))
        except InferenceServerException as exc:
            raise _repository_error(exc, name, "load") from None

    async def unload_model(self, name: str, timeout_s: float) -> None:
        """Unload `name`; requests it already accepted finish first (in Triton)."""
        try:
            await self._calls.track(self.grpc.unload_model(name, client_timeout=timeout_s))
        except InferenceServerException as exc:
            raise _repository_error(exc, name, "unload") from None

    async def model_configs(self, names: list[str]) -> list[model_config_pb2.ModelConfig]:
        """Configs of `names`; a model that went away in between is left out."""

        async def one(name: str) -> model_config_pb2.ModelConfig | None:
            try:
                return (await self._calls.track(self.grpc.get_model_config(name, client_timeout=self.timeout))).config
            except InferenceServerException as exc:
                error = translate_error(exc)
                if error.type is ErrorType.MODEL_UNAVAILABLE:
                    return None
                raise error from None

        return [c for c in await asyncio.gather(*(one(n) for n in names)) if c is not None]

    # --- shared memory ----------------------------------------------------------------
    async def ensure_pool(self, triton_model: str, sizes: dict[str, int], regions: int) -> None:
        """Give `triton_model` a registered pool of `regions` regions with slots of `sizes` bytes.

        A pool of another layout (the model was rebuilt) is replaced: its regions are unlinked
        once their calls are done. No-op with shm=none or when Triton cannot open the regions."""
        if self.settings.shm == "none" or triton_model in self._no_shm:
            return
        layout = RegionLayout.of(sizes)
        current = self.pools.get(triton_model)
        if current is not None and current.layout == layout:
            return
        pool = ShmPool(self._new_region, layout, regions)
        pool.on_abandoned = lambda region: self._spawn(self._retire(pool, region))
        pool.on_return_after_close = lambda region: self._spawn(self._unregister_and_destroy(pool, [region]))
        try:
            async with self._register_lock:
                for region in pool.regions:
                    await self._register(region)
        except InferenceServerException as exc:
            self._close_pool(pool)
            if translate_error(exc).kind is ErrorKind.UNAVAILABLE:
                raise translate_error(exc) from None
            self._no_shm.add(triton_model)
            hint = ("do they share the GPU and IPC namespace (compose.cuda-shm.yaml)?" if self.settings.shm == "cuda"
                    else "do Triton and the gateway share /dev/shm, e.g. compose `ipc: service:triton`?")
            log.warning("%s: Triton cannot use this worker's %s shared memory (%s); its tensors go over plain gRPC "
                        "(%s)", triton_model, self.settings.shm, exc.message(), hint)
            return
        self.pools[triton_model] = pool
        if current is not None:
            log.info("%s: shm layout changed; replacing its pool", triton_model)
            self._close_pool(current)

    async def drop_pool(self, triton_model: str) -> None:
        """Release the pool of a model that is no longer served."""
        pool = self.pools.pop(triton_model, None)
        if pool is not None:
            self._close_pool(pool)

    async def _register(self, region: Region) -> None:
        try:
            await self._calls.track(region.unregister(self.grpc, self.timeout))
        except InferenceServerException:
            pass  # not registered: fine
        await self._calls.track(region.register(self.grpc, self.timeout))

    def _close_pool(self, pool: ShmPool) -> None:
        free = pool.close()
        # kept until every region is unregistered and unlinked: the free ones now (in the background),
        # the ones still out as they come back; close() finishes whatever is left of either
        self._closed_pools.add(pool)
        self._spawn(self._unregister_and_destroy(pool, free))

    async def _unregister_and_destroy(self, pool: ShmPool, regions: list[Region]) -> None:
        for region in regions:
            try:
                await self._calls.track(region.unregister(self.grpc, 2.0))
            except InferenceServerException:
                pass
        pool.destroy(regions)
        if not pool.regions:
            self._closed_pools.discard(pool)

    async def _retire(self, pool: ShmPool, region: Region) -> None:
        """Take back an abandoned call's region once Triton no longer holds it (it refuses to unregister
        a region while a request uses it), registered afresh."""
        SHM_RETIRED.inc()
        wait = _RETIRE_POLL_S[0]
        while True:
            try:
                await self._calls.track(region.unregister(self.grpc, self.timeout))
                break
            except InferenceServerException as exc:
                if not _in_use(exc):  # Triton gone or restarted: nobody holds the region any more
                    break
            await asyncio.sleep(wait)
            wait = min(wait * 2, _RETIRE_POLL_S[1])
        try:
            if not pool.closed:
                await self._calls.track(region.register(self.grpc, self.timeout))
        except InferenceServerException:
            pass  # registered by a concurrent re-registration, or Triton is down: the next call finds out
        SHM_RETIRED.dec()
        pool.give_back(region)

    async def _reregister_all(self, seen_epoch: int) -> None:
        """Register every region again (after a Triton restart), once per epoch however many calls noticed."""
        async with self._register_lock:
            if self.epoch != seen_epoch:
                return  # a concurrent call already did it
            log.warning("re-registering %d shm pools with Triton", len(self.pools))
            try:
                for pool in list(self.pools.values()):
                    for region in list(pool.regions):
                        await self._register(region)
            except InferenceServerException as exc:
                raise translate_error(exc) from None
            self.epoch += 1

    async def _with_reregister(self, call: Callable[[], Awaitable[T]]) -> T:
        """Run `call`; when Triton lost the shm registrations (restart), register again and retry once."""
        for attempt in (0, 1):
            epoch = self.epoch
            try:
                return await call()
            except InferenceServerException as exc:
                if attempt == 0 and _shm_missing(exc) and self.pools:
                    await self._reregister_all(epoch)
                    continue
                raise translate_error(exc) from None
        raise AssertionError("unreachable")

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        if self._closing:  # e.g. a region given back by a call cancelled at close: close() destroys it
            work.close()
            return
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _timeouts(self, deadline: float | None) -> tuple[float, int]:
        """gRPC deadline (s) and Triton request timeout (us) of a call that must end by `deadline`."""
        remaining = self.timeout if deadline is None else min(self.timeout, deadline - time.monotonic())
        if remaining <= 0:
            raise GatewayError(ErrorType.TIMEOUT, "the request's deadline passed before Triton was called")
        return remaining, max(1, int(remaining * 1e6))

    # --- inference --------------------------------------------------------------------
    async def infer_ensemble(
        self, ensemble: str, texts: list[bytes], output: Output, deadline: float | None = None, *,
        pairs: list[bytes] | None = None, direction: str = "right",
    ) -> tuple[np.ndarray, np.ndarray]:
        """Run one chunk (<= max batch) of texts, or of pairs (texts[i], pairs[i]), through an ensemble:
        (outputs [n, width] fp32, num_tokens [n]). `direction`: which end an over-long input loses."""
        n = len(texts)
        inputs = [Tensor(TEXT, texts)] + ([Tensor(TEXT_PAIR, pairs)] if pairs is not None else [])
        outputs = [Wanted(output.name, np.float32, (n, output.width)), Wanted(NUM_TOKENS, np.int32, (n,))]
        # Triton forwards an ensemble's request parameters to its steps: the tokenizer reads this one
        parameters = {TRUNCATION_PARAMETER: direction} if direction != "right" else None
        vectors, num_tokens = await self._call(ensemble, ensemble, inputs, outputs, output.label, deadline, parameters)
        return vectors, num_tokens

    async def infer_step(
        self, step: str, tensors: dict[str, np.ndarray], shape: tuple[int, ...], output: Output,
        deadline: float | None = None, pool: str | None = None,
    ) -> np.ndarray:
        """Run one batch through a model step: `tensors` are its int32 inputs by name (padded [rows, width],
        or packed [1, T] with cu_seqlens [1, rows + 1]; docs/contract.md); the output fp32 of `shape` ([rows,
        width_out]; a per-token output [rows, width, dim] padded, [T, dim] packed). `pool`: the shm pool to
        lease from when it is not the step's own (a per-token output has a pool of its own)."""
        inputs = [Tensor(name, tensor) for name, tensor in tensors.items()]
        (result,) = await self._call(step, pool or step, inputs, [Wanted(output.name, np.float32, shape)],
                                     output.label, deadline)
        return result

    async def _call(
        self, model: str, pool_name: str, inputs: list[Tensor], outputs: list[Wanted], label: str,
        deadline: float | None, parameters: dict[str, str] | None = None,
    ) -> list[np.ndarray]:
        """One inference through a leased shm region of `pool_name` when one is free and every output fits its
        slot, else over plain gRPC; after a Triton restart, registered again and retried once."""

        async def once() -> list[np.ndarray]:
            pool = self.pools.get(pool_name)
            fits = pool is not None and pool.layout.fits({o.name: o.nbytes for o in outputs})
            async with pool.lease() if pool is not None and fits else nullcontext() as region:
                return await self._infer(model, inputs, outputs, region, label, deadline, parameters)

        return await self._with_reregister(once)

    async def _infer(
        self, model: str, inputs: list[Tensor], outputs: list[Wanted], transport: Region | None, label: str,
        deadline: float | None, parameters: dict[str, str] | None,
    ) -> list[np.ndarray]:
        """The one inference call: inputs written into `transport`'s slots (an input too large for its slot, or
        no region at all, goes as a gRPC tensor), outputs read from them (or from the answer), each checked
        against its expected shape; the call's span and latency metric, by transport. A call whose inputs are
        all in the region goes over Triton's HTTP endpoint (gateway/triton/http_infer.py) where it is set."""
        client_timeout, timeout_us = self._timeouts(deadline)
        start = time.perf_counter()
        placed: dict[str, tuple[int, int]] = {}  # input name -> (bytes, offset) in the region
        if transport is not None:
            for tensor in inputs:
                payload = tensor.payload()
                size = payload.nbytes if isinstance(payload, np.ndarray) else len(payload)
                if transport.layout.fits({tensor.name: size}):
                    transport.write(tensor.name, payload)
                    placed[tensor.name] = (size, transport.layout.offset(tensor.name))
        via = "grpc" if transport is None else "shm"
        if transport is not None and len(placed) == len(inputs) and self._http_usable():
            try:
                shapes = await self._infer_http(model, inputs, outputs, transport, placed, client_timeout, timeout_us,
                                                parameters)
            except HttpUnreachable as exc:
                self._http_refused_at = time.monotonic()
                log.warning("%s; inference goes over gRPC for %.0f s", exc.message(), HTTP_RETRY_S)
            else:
                TRITON_LATENCY.labels(label, via).observe(time.perf_counter() - start)
                for want in outputs:
                    _check_shape(shapes.get(want.name), model, want)
                return [transport.read(want.name, want.dtype, want.shape) for want in outputs]
        infer_inputs = []
        for tensor in inputs:
            infer_input = grpcclient.InferInput(tensor.name, tensor.shape, tensor.datatype)
            infer_inputs.append(infer_input)
            if tensor.name in placed:
                assert transport is not None
                infer_input.set_shared_memory(transport.name, *placed[tensor.name])
            else:
                infer_input.set_data_from_numpy(tensor.array())
        requested = [grpcclient.InferRequestedOutput(o.name) for o in outputs]
        if transport is not None:
            for want, out in zip(outputs, requested):
                out.set_shared_memory(transport.name, want.nbytes, transport.layout.offset(want.name))
        with self._calls, tracing.triton_call(model, outputs[0].shape[0], via) as headers:
            result = await self.grpc.infer(model, infer_inputs, outputs=requested, client_timeout=client_timeout,
                                           timeout=timeout_us, parameters=parameters, headers=headers)
        TRITON_LATENCY.labels(label, via).observe(time.perf_counter() - start)
        return [_output(result, model, want, transport) for want in outputs]

    def _http_usable(self) -> bool:
        """An HTTP endpoint is set, and has not refused a connection in the last HTTP_RETRY_S."""
        if self.http is None:
            return False
        refused = self._http_refused_at
        return refused is None or time.monotonic() - refused > HTTP_RETRY_S

    async def _infer_http(
        self, model: str, inputs: list[Tensor], outputs: list[Wanted], region: Region,
        placed: dict[str, tuple[int, int]], timeout_s: float, timeout_us: int, parameters: dict[str, str] | None,
    ) -> dict[str, list[int]]:
        """One call over Triton's HTTP endpoint, every tensor in `region`: the answer's output shapes by name."""
        assert self.http is not None
        request = {
            "parameters": {TIMEOUT_PARAMETER: timeout_us, **(parameters or {})},
            "inputs": [{"name": t.name, "shape": t.shape, "datatype": t.datatype,
                        "parameters": _in_region(region, *placed[t.name])} for t in inputs],
            "outputs": [{"name": o.name, "parameters": _in_region(region, o.nbytes, region.layout.offset(o.name))}
                        for o in outputs],
        }
        with tracing.triton_call(model, outputs[0].shape[0], "shm", "http") as headers:
            answer = await self.http.infer(model, request, timeout_s, headers)
        try:
            return {str(o["name"]): [int(d) for d in o["shape"]] for o in answer.get("outputs", ())}
        except (KeyError, TypeError, ValueError):
            raise _contract_mismatch(model, "an answer without output shapes") from None

    # --- shutdown ---------------------------------------------------------------------
    async def close(self) -> None:
        """Unregister and unlink every region, then close the channel."""
        self._closing = True
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        for pool in [*self.pools.values(), *self._closed_pools]:
            pool.close()
            await self._unregister_and_destroy(pool, list(pool.regions))
        self.pools.clear()
        self._closed_pools.clear()
        late = self._calls.may_report_late
        if self.http is not None:
            self.http.close()
        await self.grpc.close()
        # gRPC's core reports the end of a cancelled call (a timed-out infer, the channel's own cancels
        # of calls in flight) later, through its poller thread, to the loop the call was made on. Stay on
        # the loop for a moment so those reports land here and not on a closed loop, where they surface as
        # "Event loop is closed" errors in whatever loop runs next in this process. Calls that all ended
        # well leave nothing to report.
        if late:
            await asyncio.sleep(CLOSE_DRAIN_S)


def _in_region(region: Region, size: int, offset: int) -> dict[str, str | int]:
    """A tensor's place in `region`, as Triton's HTTP request names it (its shared-memory extension)."""
    return {"shared_memory_region": region.name, "shared_memory_byte_size": size, "shared_memory_offset": offset}


def _check_shape(shape: list[int] | None, model: str, want: Wanted) -> None:
    """A contract-mismatch error when Triton's answer gave output `want` no shape or another one: in shared memory
    the bytes alone cannot tell a narrower output from a right one. Shapes agree when they do but for sizes of 1
    (Triton's [n, 1] is a [n] column)."""
    if shape is None:
        raise _contract_mismatch(model, f"no output {want.name!r}")
    if [d for d in shape if d != 1] != [d for d in want.shape if d != 1]:
        raise _contract_mismatch(model, f"output {want.name!r} has shape {shape}, expected {list(want.shape)}")


def _output(result: grpcclient.InferResult, model: str, want: Wanted, region: Region | None) -> np.ndarray:
    """Output `want` of a gRPC call, from the answer or the region it was written into, its shape checked."""
    if region is None:
        array = result.as_numpy(want.name)
        _check_shape(list(array.shape) if array is not None else None, model, want)
        return array.reshape(want.shape)  # type: ignore[union-attr]
    meta = result.get_output(want.name)
    _check_shape(list(meta.shape) if meta is not None else None, model, want)
    return region.read(want.name, want.dtype, want.shape)
