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
from collections.abc import AsyncIterator
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


class Region:
    """One registered region: its Triton name, its shm key and a handle to its memory."""

    def __init__(self, prefix: str, layout: RegionLayout) -> None:
        self.name = f"{prefix}_{os.getpid()}_{next(_counter)}"
        self.key = "/" + self.name
        self.layout = layout
        try:
            self.handle = shm.create_shared_memory_region(self.name, self.name, layout.byte_size, create_only=True)
        except shm.SharedMemoryException:
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
        return np.frombuffer(self.buffer, dtype, count, self.layout.offset(name)).reshape(shape).copy()

    def destroy(self) -> None:
        shm.destroy_shared_memory_region(self.handle)


class ShmPool:
    """Fixed set of regions for one Triton model; `lease()` borrows a free one or gives None.

    Never waiting for a region matters for throughput: a worker whose regions are all busy
    sends the chunk as plain gRPC tensors instead of queueing behind the pool (waiting
    capped one worker near pool_size / round-trip time, measured in docs/benchmarks.md).
    """

    def __init__(self, prefix: str, layout: RegionLayout, size: int, quarantine_s: float = 10.0) -> None:
        self.layout = layout
        self.quarantine_s = quarantine_s
        self.regions = [Region(prefix, layout) for _ in range(size)]
        self._free: asyncio.Queue[Region] = asyncio.Queue()
        for region in self.regions:
            self._free.put_nowait(region)
        SHM_REGIONS.inc(size)

    @asynccontextmanager
    async def lease(self) -> AsyncIterator[Region | None]:
        """Borrow a region for one Triton call (None when all are busy); it returns afterwards.

        When the call was abandoned (cancelled, timed out) Triton may still write into the
        region, so it rejoins the pool only after `quarantine_s`.
        """
        try:
            region = self._free.get_nowait()
        except asyncio.QueueEmpty:
            yield None
            return
        SHM_IN_USE.inc()
        try:
            yield region
        except BaseException as exc:
            if _abandoned(exc):
                asyncio.get_running_loop().call_later(self.quarantine_s, self._free.put_nowait, region)
            else:
                self._free.put_nowait(region)
            raise
        else:
            self._free.put_nowait(region)
        finally:
            SHM_IN_USE.dec()

    @property
    def free(self) -> int:
        """Regions not leased right now."""
        return self._free.qsize()

    def destroy(self) -> None:
        """Unmap and unlink every region (after unregistering them from Triton)."""
        for region in self.regions:
            try:
                region.destroy()
            except Exception:  # noqa: BLE001 - keep unlinking the others
                log.warning("could not unlink shm region %s", region.key)
        SHM_REGIONS.dec(len(self.regions))
        self.regions = []


def _abandoned(exc: BaseException) -> bool:
    if isinstance(exc, (asyncio.CancelledError, TimeoutError)):
        return True
    return isinstance(exc, InferenceServerException) and "DEADLINE_EXCEEDED" in str(exc.status())


def serialize_texts(texts: list[bytes]) -> bytes:
    """Triton BYTES tensor serialization: 4-byte little-endian length before each element."""
    return b"".join(len(t).to_bytes(4, "little") + t for t in texts)
