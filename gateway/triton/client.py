"""Async Triton gRPC client of one gateway worker: discovery calls, inference, and its shm pools.

One `tritonclient.grpc.aio` channel per worker. Every inference carries the caller's deadline,
twice: as the gRPC deadline (the call is cancelled when it passes; the python-backend models skip
a request cancelled while it waited) and as Triton's request `timeout`, which only a queue policy
would act on (the builder writes none by default: Triton 2.51 stalls with one, docs/contract.md).
What keeps Triton from computing for nobody is the gateway's own admission and queues: work that
could not be served in time is refused or dropped before it is sent (service/admission.py).

Tensors go through shared-memory regions (`GATEWAY_SHM`: system, or CUDA IPC regions on the GPU), leased from
the pools that gateway/triton/shm_registry.py keeps registered with Triton, also after a Triton restart.

Repository calls (the index, load, unload) carry the key of Triton's restricted model-repository API when
GATEWAY_TRITON_REPOSITORY_KEY_FILE names one: with the python backend a load runs the repository's code, so only
the gateway may ask for it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

from contract import NUM_TOKENS, TEXT, TEXT_PAIR, TIMEOUT_PARAMETER, TRUNCATION_PARAMETER
from gateway import tracing
from gateway.errors import ErrorType, GatewayError
from gateway.metrics import TRITON_LATENCY
from gateway.settings import GatewaySettings
from gateway.triton.calls import CallLedger
from gateway.triton.errors import contract_mismatch, repository_error, translate_error
from gateway.triton.http_infer import HttpUnreachable, TritonHttpInfer
from gateway.triton.shm_pool import Region, probe_cuda
from gateway.triton.shm_registry import ShmPools
from gateway.triton.tensors import Output, Tensor, Wanted, check_shape

log = logging.getLogger("gateway.triton")


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
# The header of Triton's restricted model-repository API (--http-restricted-api, --grpc-restricted-protocol
# model-repository:REPOSITORY_KEY_HEADER=KEY); over gRPC Triton expects it with GRPC_RESTRICTED_PREFIX before it.
REPOSITORY_KEY_HEADER = "triton-repository-key"
GRPC_RESTRICTED_PREFIX = "triton-grpc-protocol-"


@dataclass(frozen=True, order=True)
class IndexEntry:
    """One row of Triton's repository index: a model version and its state (READY, LOADING, UNLOADING,
    UNAVAILABLE; empty for a model never loaded) with Triton's reason (e.g. `unloaded`, a load error)."""

    name: str
    version: str
    state: str
    reason: str = ""


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
        self.http_problem: str | None = None  # why the HTTP endpoint is not used (check_http), None while it is
        self._key_file = Path(settings.triton_repository_key_file) if settings.triton_repository_key_file else None
        self._calls = CallLedger()  # every gRPC call is counted in it (close() reads it; HTTP reports nothing late)
        self.pools = ShmPools(self.grpc, settings, self._calls)

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

    async def check_http(self, timeout_s: float) -> str | None:
        """Whether GATEWAY_TRITON_HTTP_URL is Triton's live HTTP endpoint (its /v2/health/live answers 200): None
        when it is (or when none is set), else why not. Until a later check succeeds, inference goes over gRPC; a
        change either way is logged once."""
        if self.http is None:
            return None
        try:
            await self.http.live(timeout_s)
            problem = None
        except InferenceServerException as exc:
            problem = exc.message() or str(exc)
        if problem != self.http_problem:
            if problem is None:
                log.info("Triton's HTTP endpoint %s answers again: inference whose tensors are all in shared memory "
                         "goes over HTTP", self.http.url)
            elif self.http_problem is None:
                log.warning("GATEWAY_TRITON_HTTP_URL=%s is not Triton's live HTTP endpoint (%s): inference goes over "
                            "gRPC (GATEWAY_TRITON_URL) until it is", self.http.url, problem)
        self.http_problem = problem
        return problem

    def _repository_headers(self) -> dict[str, str] | None:
        """The key of Triton's restricted model-repository API, read now (a new key needs no gateway restart)."""
        if self._key_file is None:
            return None
        try:
            key = self._key_file.read_text().strip()
        except OSError as exc:
            raise GatewayError(ErrorType.TRITON_ERROR, "GATEWAY_TRITON_REPOSITORY_KEY_FILE cannot be read "
                               f"({exc.strerror})") from None
        return {GRPC_RESTRICTED_PREFIX + REPOSITORY_KEY_HEADER: key}

    async def repository_index(self) -> list[IndexEntry]:
        """Every (model, version) of Triton's repository index with its state, loaded or not."""
        try:
            index = await self._calls.track(self.grpc.get_model_repository_index(
                headers=self._repository_headers(), client_timeout=self.timeout))
        except InferenceServerException as exc:
            raise translate_error(exc) from None
        return sorted({IndexEntry(m.name, m.version, m.state, m.reason) for m in index.models})

    async def load_model(self, name: str, timeout_s: float) -> None:
        """Load `name` (or load it again: new versions, changed files) and wait until Triton is done.

        Triton polls an ensemble's steps with it and switches the ensemble once they are ready;
        the loaded version keeps serving until the new one is ready (zero downtime)."""
        try:
            await self._calls.track(self.grpc.load_model(name, headers=self._repository_headers(),
                                                         client_timeout=timeout_s))
        except InferenceServerException as exc:
            raise repository_error(exc, name, "load") from None

    async def unload_model(self, name: str, timeout_s: float) -> None:
        """Unload `name`; requests it already accepted finish first (in Triton)."""
        try:
            await self._calls.track(self.grpc.unload_model(name, headers=self._repository_headers(),
                                                           client_timeout=timeout_s))
        except InferenceServerException as exc:
            raise repository_error(exc, name, "unload") from None

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
        (result,) = await self.infer_outputs(step, tensors, [(output, shape)], deadline, pool)
        return result

    async def infer_outputs(
        self, step: str, tensors: dict[str, np.ndarray], outputs: Sequence[tuple[Output, tuple[int, ...]]],
        deadline: float | None = None, pool: str | None = None,
    ) -> list[np.ndarray]:
        """`infer_step` for several outputs of one call (one forward pass): each output with its shape, in order."""
        inputs = [Tensor(name, tensor) for name, tensor in tensors.items()]
        wanted = [Wanted(output.name, np.float32, shape) for output, shape in outputs]
        return await self._call(step, pool or step, inputs, wanted, outputs[0][0].label, deadline)

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

        return await self.pools.retrying(once)

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
                log.warning("GATEWAY_TRITON_HTTP_URL: %s; inference goes over gRPC for %.0f s", exc.message(),
                            HTTP_RETRY_S)
            else:
                TRITON_LATENCY.labels(label, via).observe(time.perf_counter() - start)
                for want in outputs:
                    check_shape(shapes.get(want.name), model, want)
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
        """An HTTP endpoint is set, its last check found it Triton's, and it has not refused a connection in the
        last HTTP_RETRY_S."""
        if self.http is None or self.http_problem is not None:
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
            raise contract_mismatch(model, "an answer without output shapes") from None

    # --- shutdown ---------------------------------------------------------------------
    async def close(self) -> None:
        """Unregister and unlink every region, then close the channel."""
        await self.pools.close()
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


def _output(result: grpcclient.InferResult, model: str, want: Wanted, region: Region | None) -> np.ndarray:
    """Output `want` of a gRPC call, from the answer or the region it was written into, its shape checked."""
    if region is None:
        array = result.as_numpy(want.name)
        check_shape(list(array.shape) if array is not None else None, model, want)
        return array.reshape(want.shape)  # type: ignore[union-attr]
    meta = result.get_output(want.name)
    check_shape(list(meta.shape) if meta is not None else None, model, want)
    return region.read(want.name, want.dtype, want.shape)
