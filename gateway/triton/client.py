"""Async Triton gRPC client of one gateway worker: discovery calls, inference, shm pools.

One `tritonclient.grpc.aio` channel per worker; every call carries a deadline. When Triton
restarted (its shm registrations are gone), an inference that names a region fails; the
client re-registers every region and retries that call once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

from contract import INPUT_IDS, NUM_TOKENS, TEXT, TOKEN_INPUTS
from gateway.api.errors import GatewayError, GatewayTimeout, TritonUnavailable
from gateway.metrics import TRITON_LATENCY
from gateway.settings import GatewaySettings
from gateway.triton.shm_pool import RegionLayout, ShmPool, serialize_texts

T = TypeVar("T")


@dataclass(frozen=True)
class Output:
    """The output a call asks for: tensor name, row width (fp32), and the model label of its metrics."""

    name: str
    width: int
    label: str

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


def translate_error(exc: InferenceServerException) -> GatewayError:
    """Map a Triton/gRPC failure to the gateway's HTTP error."""
    status = str(exc.status() or "")
    message = exc.message() or str(exc)
    if "DEADLINE_EXCEEDED" in status or "Deadline Exceeded" in message:
        return GatewayTimeout("Triton did not answer within the deadline")
    if "UNAVAILABLE" in status or "failed to connect" in message.lower():
        return TritonUnavailable("Triton is unavailable")
    if "unknown model" in message.lower() or "not ready" in message.lower():
        return TritonUnavailable(f"model not available in Triton: {message}", type="model_unavailable")
    return GatewayError(f"Triton error: {message}", status=502, type="triton_error")


def _shm_missing(exc: InferenceServerException) -> bool:
    return "shared memory region" in (exc.message() or "").lower()


class TritonClient:
    """The gateway's connection to Triton."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.timeout = settings.triton_timeout_s
        self.grpc = grpcaio.InferenceServerClient(settings.triton_url, channel_args=CHANNEL_ARGS)
        self.pools: dict[str, ShmPool] = {}
        self._register_lock = asyncio.Lock()

    # --- health and discovery -------------------------------------------------------
    async def server_ready(self) -> bool:
        try:
            return bool(await self.grpc.is_server_ready(client_timeout=self.timeout))
        except InferenceServerException:
            return False

    async def model_ready(self, name: str) -> bool:
        try:
            return bool(await self.grpc.is_model_ready(name, client_timeout=self.timeout))
        except InferenceServerException:
            return False

    async def ready_configs(self) -> list[model_config_pb2.ModelConfig]:
        """Configs of every READY model in Triton's repository index."""
        try:
            index = await self.grpc.get_model_repository_index(client_timeout=self.timeout)
            names = sorted({m.name for m in index.models if m.state == "READY"})
            responses = await asyncio.gather(
                *(self.grpc.get_model_config(n, client_timeout=self.timeout) for n in names)
            )
        except InferenceServerException as exc:
            raise translate_error(exc) from None
        return [r.config for r in responses]

    # --- shared memory ----------------------------------------------------------------
    async def ensure_pool(self, triton_model: str, sizes: dict[str, int], regions: int) -> None:
        """Create and register a pool of `regions` regions with slots of `sizes` bytes for `triton_model`,
        unless it has one (no-op with shm=none)."""
        if self.settings.shm == "none" or triton_model in self.pools:
            return
        s = self.settings
        pool = ShmPool(s.shm_prefix, RegionLayout.of(sizes), regions, quarantine_s=s.triton_timeout_s + 1)
        self.pools[triton_model] = pool
        await self._register(pool)

    async def _register(self, pool: ShmPool) -> None:
        for region in pool.regions:
            try:
                await self.grpc.unregister_system_shared_memory(region.name, client_timeout=self.timeout)
            except InferenceServerException:
                pass
            await self.grpc.register_system_shared_memory(
                region.name, region.key, region.layout.byte_size, client_timeout=self.timeout
            )

    async def reregister_all(self) -> None:
        """Register every region again (after a Triton restart)."""
        async with self._register_lock:
            log.warning("re-registering %d shm pools with Triton", len(self.pools))
            try:
                for pool in self.pools.values():
                    await self._register(pool)
            except InferenceServerException as exc:
                raise translate_error(exc) from None

    async def _with_reregister(self, call: Callable[[], Awaitable[T]]) -> T:
        """Run `call`; when Triton lost the shm registrations (restart), register again and retry once."""
        for attempt in (0, 1):
            try:
                return await call()
            except InferenceServerException as exc:
                if attempt == 0 and _shm_missing(exc) and self.pools:
                    await self.reregister_all()
                    continue
                raise translate_error(exc) from None
        raise AssertionError("unreachable")

    # --- inference --------------------------------------------------------------------
    async def infer_ensemble(self, ensemble: str, texts: list[bytes], output: Output) -> tuple[np.ndarray, np.ndarray]:
        """Run one chunk (<= max batch) through an ensemble: (outputs [n, width] fp32, num_tokens [n])."""
        return await self._with_reregister(lambda: self._ensemble_once(ensemble, texts, output))

    async def _ensemble_once(self, ensemble: str, texts: list[bytes], output: Output) -> tuple[np.ndarray, np.ndarray]:
        n, width, out_name = len(texts), output.width, output.name
        inp = grpcclient.InferInput(TEXT, [n, 1], "BYTES")
        outputs = [grpcclient.InferRequestedOutput(out_name), grpcclient.InferRequestedOutput(NUM_TOKENS)]
        pool = self.pools.get(ensemble)
        start = time.perf_counter()
        async with pool.lease() if pool is not None else nullcontext() as region:
            if region is None:  # no shm (GATEWAY_SHM=none) or every region busy: plain gRPC tensors
                inp.set_data_from_numpy(np.array(texts, dtype=np.object_).reshape(n, 1))
                result = await self.grpc.infer(ensemble, [inp], outputs=outputs, client_timeout=self.timeout)
                TRITON_LATENCY.labels(output.label, "grpc").observe(time.perf_counter() - start)
                return result.as_numpy(out_name).reshape(n, width), result.as_numpy(NUM_TOKENS).reshape(n)
            payload = serialize_texts(texts)
            layout = region.layout
            if len(payload) <= layout.size(TEXT):
                region.write(TEXT, payload)
                inp.set_shared_memory(region.name, len(payload), layout.offset(TEXT))
            else:  # unusually long texts: input over gRPC, outputs still through shm
                inp.set_data_from_numpy(np.array(texts, dtype=np.object_).reshape(n, 1))
            outputs[0].set_shared_memory(region.name, n * width * 4, layout.offset(out_name))
            outputs[1].set_shared_memory(region.name, n * 4, layout.offset(NUM_TOKENS))
            await self.grpc.infer(ensemble, [inp], outputs=outputs, client_timeout=self.timeout)
            TRITON_LATENCY.labels(output.label, "shm").observe(time.perf_counter() - start)
            return region.read(out_name, np.float32, (n, width)), region.read(NUM_TOKENS, np.int32, (n,))

    async def infer_step(
        self, step: str, tensors: tuple[np.ndarray, np.ndarray, np.ndarray], output: Output
    ) -> np.ndarray:
        """Run one batch of (input_ids, attention_mask, token_type_ids) [rows, width] int32 through a
        model step: outputs [rows, width_out] fp32."""
        return await self._with_reregister(lambda: self._step_once(step, tensors, output))

    async def _step_once(
        self, step: str, tensors: tuple[np.ndarray, np.ndarray, np.ndarray], output: Output
    ) -> np.ndarray:
        rows, width = tensors[0].shape
        inputs = [grpcclient.InferInput(name, [rows, width], "INT32") for name in TOKEN_INPUTS]
        requested = grpcclient.InferRequestedOutput(output.name)
        pool = self.pools.get(step)
        start = time.perf_counter()
        async with pool.lease() if pool is not None else nullcontext() as region:
            if region is None or rows * width * 4 > region.layout.size(INPUT_IDS) \
                    or rows * output.width * 4 > region.layout.size(output.name):
                for inp, tensor in zip(inputs, tensors):
                    inp.set_data_from_numpy(tensor)
                result = await self.grpc.infer(step, inputs, outputs=[requested], client_timeout=self.timeout)
                TRITON_LATENCY.labels(output.label, "grpc").observe(time.perf_counter() - start)
                return result.as_numpy(output.name).reshape(rows, output.width)
            for inp, name, tensor in zip(inputs, TOKEN_INPUTS, tensors):
                inp.set_shared_memory(region.name, region.write(name, tensor), region.layout.offset(name))
            requested.set_shared_memory(region.name, rows * output.width * 4, region.layout.offset(output.name))
            await self.grpc.infer(step, inputs, outputs=[requested], client_timeout=self.timeout)
            TRITON_LATENCY.labels(output.label, "shm").observe(time.perf_counter() - start)
            return region.read(output.name, np.float32, (rows, output.width))

    # --- shutdown ---------------------------------------------------------------------
    async def close(self) -> None:
        """Unregister and unlink every region, then close the channel."""
        for pool in self.pools.values():
            for region in pool.regions:
                try:
                    await self.grpc.unregister_system_shared_memory(region.name, client_timeout=2.0)
                except InferenceServerException:
                    pass  # Triton gone: nothing registered any more
            pool.destroy()
        self.pools.clear()
        await self.grpc.close()
