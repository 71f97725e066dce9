"""Async Triton gRPC client of one gateway worker: discovery calls, inference, shm pools.

One `tritonclient.grpc.aio` channel per worker; every call carries a deadline. When Triton
restarted (its shm registrations are gone), an inference that names a region fails; the
client re-registers every region and retries that call once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import nullcontext

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

from gateway.api.errors import GatewayError, GatewayTimeout, TritonUnavailable
from gateway.metrics import TRITON_LATENCY
from gateway.service.registry import Endpoint, ServedModel
from gateway.settings import GatewaySettings
from gateway.triton.shm_pool import RegionLayout, ShmPool, serialize_texts

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
    async def ensure_pools(self, models: list[ServedModel]) -> None:
        """Create and register a pool for every endpoint that has none (no-op with shm=none)."""
        if self.settings.shm == "none":
            return
        s = self.settings
        for model in models:
            for endpoint in model.endpoints.values():
                if endpoint.triton_model in self.pools:
                    continue
                mb = endpoint.max_batch_size
                layout = RegionLayout.for_model(
                    mb, mb * (4 + model.max_seq_len * s.shm_bytes_per_token), model.output_width
                )
                pool = ShmPool(s.shm_prefix, layout, s.shm_pool_size, quarantine_s=s.triton_timeout_s + 1)
                self.pools[endpoint.triton_model] = pool
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

    # --- inference --------------------------------------------------------------------
    async def infer(self, model: ServedModel, endpoint: Endpoint, texts: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
        """Run one chunk (<= max batch) through the ensemble: (outputs [n, width] fp32, num_tokens [n])."""
        for attempt in (0, 1):
            try:
                return await self._infer_once(model, endpoint, texts)
            except InferenceServerException as exc:
                if attempt == 0 and _shm_missing(exc) and self.pools:
                    await self.reregister_all()
                    continue
                raise translate_error(exc) from None
        raise AssertionError("unreachable")

    async def _infer_once(
        self, model: ServedModel, endpoint: Endpoint, texts: list[bytes]
    ) -> tuple[np.ndarray, np.ndarray]:
        n, width, out_name = len(texts), model.output_width, model.output_name
        inp = grpcclient.InferInput("text", [n, 1], "BYTES")
        outputs = [grpcclient.InferRequestedOutput(out_name), grpcclient.InferRequestedOutput("num_tokens")]
        pool = self.pools.get(endpoint.triton_model)
        start = time.perf_counter()
        async with pool.lease() if pool is not None else nullcontext() as region:
            if region is None:  # no shm (GATEWAY_SHM=none) or every region busy: plain gRPC tensors
                inp.set_data_from_numpy(np.array(texts, dtype=np.object_).reshape(n, 1))
                result = await self.grpc.infer(
                    endpoint.triton_model, [inp], outputs=outputs, client_timeout=self.timeout
                )
                TRITON_LATENCY.labels(model.name, "grpc").observe(time.perf_counter() - start)
                return result.as_numpy(out_name).reshape(n, width), result.as_numpy("num_tokens").reshape(n)
            payload = serialize_texts(texts)
            layout = region.layout
            if len(payload) <= layout.input_size:
                region.write_input(payload)
                inp.set_shared_memory(region.name, len(payload), 0)
            else:  # unusually long texts: input over gRPC, outputs still through shm
                inp.set_data_from_numpy(np.array(texts, dtype=np.object_).reshape(n, 1))
            outputs[0].set_shared_memory(region.name, n * width * 4, layout.output_offset)
            outputs[1].set_shared_memory(region.name, n * 4, layout.tokens_offset)
            await self.grpc.infer(endpoint.triton_model, [inp], outputs=outputs, client_timeout=self.timeout)
            TRITON_LATENCY.labels(model.name, "shm").observe(time.perf_counter() - start)
            return region.read_output(n, width), region.read_tokens(n)

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
