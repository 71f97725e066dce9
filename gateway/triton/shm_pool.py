"""A pool of system shared-memory regions, registered with Triton once and leased per call.

Each region carries the tensors of one call at fixed offsets (a `RegionLayout`): for an
ensemble `[ text input | model output | num_tokens ]`, for a model step
`[ input_ids | attention_mask | token_type_ids | model output ]`. A call needs no region creation
and no (un)registration on the hot path: the gateway writes the inputs at their offsets, Triton
writes the outputs at theirs, the gateway copies them out and returns the region to the pool.
Regions are POSIX shm objects `/dev/shm/<prefix>_<pid>_<n>` (tritonclient.utils.shared_memory);
the pid keeps several workers apart. `close()` unregisters them from Triton and unlinks them.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from multiprocessing import shared_memory as mpshm

import numpy as np
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from gateway.metrics import SHM_IN_USE, SHM_REGIONS

log = logging.getLogger("gateway.shm")
_ALIGN = 64
_counter = itertools.count()


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


@dataclass(frozen=True)
class RegionLayout:
    """Byte offset and size of each tensor slot inside one region."""

    slots: dict[str, tuple[int, int]]  # name -> (offset, size)
    byte_size: int

    @classmethod
    def of(cls, sizes: dict[str, int]) -> "RegionLayout":
        """Slots of the given byte sizes, one after the other, each 64-byte aligned."""
        slots, offset = {}, 0
        for name, size in sizes.items():
            slots[name] = (offset, _align(size))
            offset += _align(size)
        return cls(slots, offset)

    def offset(self, name: str) -> int:
        return self.slots[name][0]

    def size(self, name: str) -> int:
        return self.slots[name][1]

    def fits(self, sizes: dict[str, int]) -> bool:
        """Whether tensors of these byte sizes fit their slots."""
        return all(name in self.slots and size <= self.slots[name][1] for name, size in sizes.items())


class Region:
    """One registered region: its Triton name, its shm key and a handle to its memory."""

    def __init__(self, prefix: str, layout: RegionLayout) -> None:
        self.name = f"{prefix}_{os.getpid()}_{next(_counter)}"
        self.key = "/" + self.name
        self.layout = layout
        try:
            self.handle = shm.create_shared_memory_region(self.name, self.name, layout.byte_size, create_only=True)
        except shm.SharedMemoryException as exc:
            if not isinstance(exc.__cause__, FileExistsError):
                raise
            # A segment of the same name survived a crashed gateway whose pid we now reuse
            # (e.g. a restarted container sharing Triton's /dev/shm): replace it.
            log.warning("replacing stale shm segment %s", self.key)
            stale = mpshm.SharedMemory(self.name)
            stale.close()
            stale.unlink()
            self.handle = shm.create_shared_memory_region(self.name, self.name, layout.byte_size, create_only=True)

    @property
    def buffer(self) -> memoryview:
        """The region's memory (a live view: copy what must outlive the lease)."""
        return self.handle._mpsm_handle.buf  # noqa: SLF001 - tritonclient exposes no public accessor

    def write(self, name: str, data: bytes | np.ndarray) -> int:
        """Copy `data` into slot `name`; returns its byte size."""
        offset, size = self.layout.slots[name]
        raw = data if isinstance(data, bytes) else np.ascontiguousarray(data).data.cast("B")
        if len(raw) > size:
            raise ValueError(f"{len(raw)} bytes do not fit slot {name!r} of {size}")
        self.buffer[offset : offset + len(raw)] = raw
        return len(raw)

    def read(self, name: str, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
        """A copy of slot `name` as an array of `shape`."""
        count = int(np.prod(shape))
        if count * np.dtype(dtype).itemsize > self.layout.size(name):
            raise ValueError(f"{shape} {np.dtype(dtype)} does not fit slot {name!r} of {self.layout.size(name)}")
        return np.frombuffer(self.buffer, dtype, count, self.layout.offset(name)).reshape(shape).copy()

    def destroy(self) -> None:
        shm.destroy_shared_memory_region(self.handle)


class ShmPool:
    """Fixed set of regions for one Triton model; `lease()` borrows a free one or gives None.

    Never waiting for a region matters for throughput: a worker whose regions are all busy
    sends the call as plain gRPC tensors instead of queueing behind the pool (waiting
    capped one worker near pool_size / round-trip time, measured in docs/benchmarks.md).

    A region whose call was abandoned (cancelled, timed out) may still be read and written by
    Triton, which goes on with the request. It is not reused until Triton is done with it:
    it goes to `on_abandoned` (the client unregisters it, which Triton refuses while any request
    holds the region, then registers it again) and comes back through `give_back`.
    """

    def __init__(self, prefix: str, layout: RegionLayout, size: int) -> None:
        self.layout = layout
        self.regions: list[Region] = []
        try:
            for _ in range(size):
                self.regions.append(Region(prefix, layout))
        except BaseException:
            for region in self.regions:  # no half-made pool left in /dev/shm
                region.destroy()
            raise
        self.on_abandoned: Callable[[Region], None] = self.give_back
        self.on_return_after_close: Callable[[Region], None] = self._destroy
        self.closed = False
        self._free: list[Region] = list(self.regions)
        SHM_REGIONS.inc(size)

    @asynccontextmanager
    async def lease(self) -> AsyncIterator[Region | None]:
        """Borrow a region for one Triton call (None when all are busy or the pool is closed)."""
        if not self._free or self.closed:
            yield None
            return
        region = self._free.pop()
        SHM_IN_USE.inc()
        try:
            yield region
        except BaseException as exc:
            SHM_IN_USE.dec()
            if _abandoned(exc):
                self.on_abandoned(region)
            else:
                self.give_back(region)
            raise
        SHM_IN_USE.dec()
        self.give_back(region)

    def give_back(self, region: Region) -> None:
        """Return a region to the free list (or unlink it, once the pool is closed)."""
        if self.closed:
            self.on_return_after_close(region)
        else:
            self._free.append(region)

    @property
    def free(self) -> int:
        """Regions not leased right now."""
        return len(self._free)

    def close(self) -> list[Region]:
        """Stop leasing; unlink the free regions now (those still out are unlinked on return).
        Returns the free regions, for the caller to unregister from Triton first."""
        self.closed = True
        free, self._free = self._free, []
        return free

    def destroy(self, regions: list[Region]) -> None:
        """Unmap and unlink `regions` (after unregistering them from Triton)."""
        for region in regions:
            self._destroy(region)

    def _destroy(self, region: Region) -> None:
        if region not in self.regions:
            return
        try:
            region.destroy()
        except Exception:  # noqa: BLE001 - keep unlinking the others
            log.warning("could not unlink shm region %s", region.key)
        SHM_REGIONS.dec()
        self.regions.remove(region)


def _abandoned(exc: BaseException) -> bool:
    if isinstance(exc, (asyncio.CancelledError, TimeoutError)):
        return True
    return isinstance(exc, InferenceServerException) and "DEADLINE_EXCEEDED" in str(exc.status())


def serialize_texts(texts: list[bytes]) -> bytes:
    """Triton BYTES tensor serialization: 4-byte little-endian length before each element."""
    return b"".join(len(t).to_bytes(4, "little") + t for t in texts)
