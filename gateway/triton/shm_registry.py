"""The shared-memory pools of one worker, by Triton model, kept registered with Triton.

Regions live as long as Triton uses them: a region whose call was abandoned is unregistered again and again
until Triton stops refusing ("in use"), then registered afresh and reused. When Triton restarted (its
registrations are gone), a call that names a region fails; the first such failure of an epoch registers every
region again, concurrent ones wait for it, and each retries once. A Triton that cannot open the regions (no
shared IPC namespace) leaves the model on plain gRPC, with one warning. Only tritonclient's public
shared-memory calls are used (gateway/triton/shm_pool.py makes the regions).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from typing import Any, TypeVar

from tritonclient.utils import InferenceServerException

from gateway.errors import ErrorKind
from gateway.metrics import SHM_RETIRED
from gateway.settings import GatewaySettings
from gateway.triton.calls import CallLedger
from gateway.triton.errors import in_use, shm_missing, translate_error
from gateway.triton.shm_pool import Region, RegionLayout, ShmPool, region_maker

T = TypeVar("T")
log = logging.getLogger("gateway.triton")
RETIRE_POLL_S = (0.02, 1.0)  # first and longest wait between two unregister attempts of a retired region
DESTROY_TIMEOUT_S = 2.0  # for the unregister call of a region about to be freed: nobody waits on it


class ShmPools(Mapping[str, ShmPool]):
    """The registered pools by Triton model (or per-token output key); read like a dict."""

    def __init__(self, grpc: Any, settings: GatewaySettings, calls: CallLedger) -> None:
        self.grpc = grpc  # tritonclient.grpc.aio client
        self.settings = settings
        self.timeout = settings.triton_timeout_s
        self._calls = calls
        self._pools: dict[str, ShmPool] = {}
        self.epoch = 0  # registrations made by this worker; +1 each time they are made again
        self._register_lock = asyncio.Lock()
        self._no_shm: set[str] = set()  # models whose regions Triton could not open
        self._background: set[asyncio.Task[None]] = set()
        self._closed_pools: set[ShmPool] = set()
        self._closing = False  # close() began: no new background work (its regions are being destroyed)
        self._new_region = region_maker("cuda" if settings.shm == "cuda" else "system", settings.shm_prefix,
                                        settings.shm_cuda_device)

    @property
    def refused(self) -> set[str]:
        """The models whose regions Triton could not open: their tensors go over plain gRPC."""
        return set(self._no_shm)

    def __getitem__(self, name: str) -> ShmPool:
        return self._pools[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._pools)

    def __len__(self) -> int:
        return len(self._pools)

    async def ensure(self, triton_model: str, sizes: dict[str, int], regions: int) -> None:
        """Give `triton_model` a registered pool of `regions` regions with slots of `sizes` bytes.

        A pool of another layout (the model was rebuilt) is replaced: its regions are unlinked
        once their calls are done. No-op with shm=none or when Triton cannot open the regions."""
        if self.settings.shm == "none" or triton_model in self._no_shm:
            return
        layout = RegionLayout.of(sizes)
        current = self._pools.get(triton_model)
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
        self._pools[triton_model] = pool
        if current is not None:
            log.info("%s: shm layout changed; replacing its pool", triton_model)
            self._close_pool(current)

    async def drop(self, triton_model: str) -> None:
        """Release the pool of a model that is no longer served."""
        pool = self._pools.pop(triton_model, None)
        if pool is not None:
            self._close_pool(pool)

    async def retrying(self, call: Callable[[], Awaitable[T]]) -> T:
        """Run `call`; when Triton lost the shm registrations (restart), register again and retry once. Triton's
        failures come back as gateway errors."""
        for attempt in (0, 1):
            epoch = self.epoch
            try:
                return await call()
            except InferenceServerException as exc:
                if attempt == 0 and shm_missing(exc) and self._pools:
                    await self._reregister_all(epoch)
                    continue
                raise translate_error(exc) from None
        raise AssertionError("unreachable")

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
                await self._calls.track(region.unregister(self.grpc, DESTROY_TIMEOUT_S))
            except InferenceServerException:
                pass
        pool.destroy(regions)
        if not pool.regions:
            self._closed_pools.discard(pool)

    async def _retire(self, pool: ShmPool, region: Region) -> None:
        """Take back an abandoned call's region once Triton no longer holds it (it refuses to unregister
        a region while a request uses it), registered afresh."""
        SHM_RETIRED.inc()
        wait = RETIRE_POLL_S[0]
        while True:
            try:
                await self._calls.track(region.unregister(self.grpc, self.timeout))
                break
            except InferenceServerException as exc:
                if not in_use(exc):  # Triton gone or restarted: nobody holds the region any more
                    break
            await asyncio.sleep(wait)
            wait = min(wait * 2, RETIRE_POLL_S[1])
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
            log.warning("re-registering %d shm pools with Triton", len(self._pools))
            try:
                for pool in list(self._pools.values()):
                    for region in list(pool.regions):
                        await self._register(region)
            except InferenceServerException as exc:
                raise translate_error(exc) from None
            self.epoch += 1

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        if self._closing:  # e.g. a region given back by a call cancelled at close: close() destroys it
            work.close()
            return
        task = asyncio.get_running_loop().create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def close(self) -> None:
        """Unregister and unlink every region, those of replaced pools included."""
        self._closing = True
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        for pool in [*self._pools.values(), *self._closed_pools]:
            pool.close()
            await self._unregister_and_destroy(pool, list(pool.regions))
        self._pools.clear()
        self._closed_pools.clear()
