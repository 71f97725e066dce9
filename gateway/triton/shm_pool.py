"""Pools of shared-memory regions, registered with Triton once and leased per call.

Each region carries the tensors of one call at fixed offsets (a `RegionLayout`): for an
ensemble `[ text input | model output | num_tokens ]`, for a model step
`[ input_ids | attention_mask | token_type_ids | model output ]`. A call needs no region creation
and no (un)registration on the hot path: the gateway writes the inputs at their offsets, Triton
writes the outputs at theirs, the gateway copies them out and returns the region to the pool.

Two kinds of region, one pool (`GATEWAY_SHM`):
- `system` (`SystemRegion`): POSIX shm objects `/dev/shm/<prefix>_<pid>_<n>`, made and unlinked by
  tritonclient.utils.shared_memory; the pid keeps several workers apart. The gateway reads and writes
  them through a mapping of its own (the standard library's `SharedMemory` attached by name):
  tritonclient's public `set_shared_memory_region(..., offset)` builds a view per tensor, which costs more
  per call than a slice assignment, and its handle's buffer is private.
- `cuda` (`CudaRegion`): device memory of one GPU exported as a CUDA IPC handle
  (tritonclient.utils.cuda_shared_memory), registered with Triton's cuda_shared_memory
  extension; Triton reads and writes the tensors on the GPU, the gateway copies its host arrays
  in and out with cudaMemcpy at each slot's offset. tritonclient's public CUDA calls copy at offset 0
  only, so the region's device pointer is read in one place, `device_pointer`, which fails loudly
  (and tests/gateway/test_units.py with it) if tritonclient renames it. `probe_cuda` fails start-up
  when this process cannot use the GPU.
`close()` unregisters the regions from Triton and frees them.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import os
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from multiprocessing import shared_memory as mpshm
from typing import Any, Literal

import numpy as np
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from gateway.metrics import SHM_IN_USE, SHM_REGIONS

log = logging.getLogger("gateway.shm")
_ALIGN = 64
_counter = itertools.count()

Transport = Literal["system", "cuda"]


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


class ShmUnavailable(RuntimeError):
    """This process cannot make regions of the configured kind (e.g. GATEWAY_SHM=cuda without a GPU)."""


class Region(ABC):
    """One region of a pool: its name in Triton, its memory, and how Triton registers it."""

    def __init__(self, name: str, layout: RegionLayout) -> None:
        self.name = name
        self.layout = layout

    def _slot(self, name: str, nbytes: int) -> int:
        """Offset of slot `name`, after checking that `nbytes` fit it."""
        offset, size = self.layout.slots[name]
        if nbytes > size:
            raise ValueError(f"{nbytes} bytes do not fit slot {name!r} of {size}")
        return offset

    @abstractmethod
    def write(self, name: str, data: bytes | np.ndarray) -> int:
        """Copy `data` into slot `name`; returns its byte size."""

    @abstractmethod
    def read(self, name: str, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
        """A copy of slot `name` as a host array of `shape`."""

    @abstractmethod
    def destroy(self) -> None:
        """Free the memory (after unregistering it from Triton)."""

    @abstractmethod
    async def register(self, grpc: Any, timeout: float) -> None:
        """Register the region with Triton (`grpc`: a tritonclient.grpc.aio client)."""

    @abstractmethod
    async def unregister(self, grpc: Any, timeout: float) -> None:
        """Unregister it; Triton refuses ("in use") while a request holds it."""


def _host_bytes(data: bytes | np.ndarray) -> memoryview:
    return memoryview(data) if isinstance(data, bytes) else np.ascontiguousarray(data).data.cast("B")


class SystemRegion(Region):
    """A POSIX shm object `/dev/shm/<prefix>_<pid>_<n>`."""

    def __init__(self, prefix: str, layout: RegionLayout) -> None:
        super().__init__(f"{prefix}_{os.getpid()}_{next(_counter)}", layout)
        self.key = "/" + self.name
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
        self._mapping = mpshm.SharedMemory(self.name)  # the same segment, mapped by this process for its copies
        buffer = self._mapping.buf
        if buffer is None:  # only a closed mapping has none
            raise RuntimeError(f"shm segment {self.name} could not be mapped")
        self.buffer: memoryview = buffer  # a live view: copy what must outlive the lease

    def write(self, name: str, data: bytes | np.ndarray) -> int:
        raw = _host_bytes(data)
        offset = self._slot(name, len(raw))
        self.buffer[offset : offset + len(raw)] = raw
        return len(raw)

    def read(self, name: str, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
        count = int(math.prod(shape))
        offset = self._slot(name, count * np.dtype(dtype).itemsize)
        return np.frombuffer(self.buffer, dtype, count, offset).reshape(shape).copy()

    def destroy(self) -> None:
        self._mapping.close()
        shm.destroy_shared_memory_region(self.handle)

    async def register(self, grpc: Any, timeout: float) -> None:
        await grpc.register_system_shared_memory(self.name, self.key, self.layout.byte_size, client_timeout=timeout)

    async def unregister(self, grpc: Any, timeout: float) -> None:
        await grpc.unregister_system_shared_memory(self.name, client_timeout=timeout)


def _cuda() -> tuple[Any, Any]:
    """tritonclient's CUDA shared-memory module and cuda-bindings' runtime, or ShmUnavailable."""
    try:
        import cuda.bindings.runtime as cudart
        import tritonclient.utils.cuda_shared_memory as cudashm
    except (ImportError, RuntimeError) as exc:
        raise ShmUnavailable(f"the CUDA shared-memory utilities cannot be imported ({exc}); "
                             "install cuda-bindings (it is in requirements/gateway.txt)") from None
    return cudashm, cudart


def _check(cudart: Any, result: tuple[Any, ...], what: str) -> Any:
    err = result[0]
    if err != cudart.cudaError_t.cudaSuccess:
        message = cudart.cudaGetErrorString(err)[1].decode(errors="replace")
        raise ShmUnavailable(f"{what}: {message} ({err.name})")
    return result[1] if len(result) > 1 else None


def probe_cuda(device: int) -> str:
    """The GPU `device` as this process sees it (e.g. "NVIDIA H100 80GB HBM3 (device 0)"), or
    ShmUnavailable saying why CUDA regions cannot be made here (no package, no driver, no GPU)."""
    _, cudart = _cuda()
    count = _check(cudart, cudart.cudaGetDeviceCount(), "CUDA is not usable in this process")
    if not 0 <= device < count:
        raise ShmUnavailable(f"GPU {device} was asked for, but this process sees {count} GPU(s)")
    props = _check(cudart, cudart.cudaGetDeviceProperties(device), f"cannot read GPU {device}")
    return f"{props.name.decode(errors='replace').strip(chr(0))} (device {device})"


def device_pointer(handle: Any) -> int:
    """The device address of a tritonclient CUDA shared-memory region: the one read of a private attribute
    (tritonclient's public calls copy at offset 0 only; the pool's slots sit at offsets)."""
    try:
        return int(handle._base_addr)  # noqa: SLF001 - see above; tests/gateway/test_units.py pins it
    except AttributeError:
        from importlib.metadata import version

        raise ShmUnavailable(f"tritonclient {version('tritonclient')} no longer keeps a CUDA region's device "
                             "pointer in `_base_addr`: update gateway/triton/shm_pool.py's device_pointer") from None


class CudaRegion(Region):
    """Device memory on GPU `device`, shared with Triton through a CUDA IPC handle."""

    def __init__(self, prefix: str, layout: RegionLayout, device: int) -> None:
        self._cudashm, self._cudart = _cuda()
        super().__init__(f"{prefix}_cuda_{os.getpid()}_{next(_counter)}", layout)
        self.device = device
        self.handle = self._cudashm.create_shared_memory_region(self.name, layout.byte_size, device)
        self.raw_handle = self._cudashm.get_raw_handle(self.handle)
        self._base = device_pointer(self.handle)
        _check(self._cudart, self._cudart.cudaSetDevice(device), f"cannot use GPU {device}")

    def _copy(self, dst: int, src: int, nbytes: int, kind: Any) -> None:
        rt = self._cudart
        _check(rt, rt.cudaMemcpy(dst, src, nbytes, kind), "cudaMemcpy failed")
        # A copy from pageable host memory may return before its DMA is done: Triton must see all of it.
        _check(rt, rt.cudaStreamSynchronize(0), "cudaStreamSynchronize failed")

    def write(self, name: str, data: bytes | np.ndarray) -> int:
        host = np.frombuffer(_host_bytes(data), np.uint8)
        offset = self._slot(name, host.nbytes)
        if host.nbytes:
            self._copy(self._base + offset, host.ctypes.data, host.nbytes,
                       self._cudart.cudaMemcpyKind.cudaMemcpyHostToDevice)
        return host.nbytes

    def read(self, name: str, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
        out: np.ndarray = np.empty(shape, dtype)
        offset = self._slot(name, out.nbytes)
        if out.nbytes:
            self._copy(out.ctypes.data, self._base + offset, out.nbytes,
                       self._cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost)
        return out

    def destroy(self) -> None:
        self._cudashm.destroy_shared_memory_region(self.handle)  # the device memory is freed with the handle
        del self.handle

    async def register(self, grpc: Any, timeout: float) -> None:
        await grpc.register_cuda_shared_memory(self.name, self.raw_handle, self.device, self.layout.byte_size,
                                               client_timeout=timeout)

    async def unregister(self, grpc: Any, timeout: float) -> None:
        await grpc.unregister_cuda_shared_memory(self.name, client_timeout=timeout)


RegionMaker = Callable[[RegionLayout], Region]


def region_maker(transport: Transport, prefix: str, device: int = 0) -> RegionMaker:
    """How a pool of `transport` ("system" or "cuda" on GPU `device`) makes its regions."""
    if transport == "cuda":
        return lambda layout: CudaRegion(prefix, layout, device)
    return lambda layout: SystemRegion(prefix, layout)


class ShmPool:
    """Fixed set of regions (system or CUDA) for one Triton model; `lease()` borrows a free one or gives None.

    Never waiting for a region matters for throughput: a worker whose regions are all busy
    sends the call as plain gRPC tensors instead of queueing behind the pool (waiting would
    cap a worker near pool_size / round-trip time).

    A region whose call was abandoned (cancelled, timed out) may still be read and written by
    Triton, which goes on with the request. It is not reused until Triton is done with it:
    it goes to `on_abandoned` (the client unregisters it, which Triton refuses while any request
    holds the region, then registers it again) and comes back through `give_back`.
    """

    def __init__(self, new_region: RegionMaker, layout: RegionLayout, size: int) -> None:
        self.layout = layout
        self.regions: list[Region] = []
        try:
            for _ in range(size):
                self.regions.append(new_region(layout))
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
        """Return a region to the free list (or free it, once the pool is closed)."""
        if self.closed:
            self.on_return_after_close(region)
        else:
            self._free.append(region)

    @property
    def free(self) -> int:
        """Regions not leased right now."""
        return len(self._free)

    def close(self) -> list[Region]:
        """Stop leasing; release the idle regions now (those still leased are released on return).
        Returns the free regions, for the caller to unregister from Triton first."""
        self.closed = True
        free, self._free = self._free, []
        return free

    def destroy(self, regions: list[Region]) -> None:
        """Free `regions` (after unregistering them from Triton)."""
        for region in regions:
            self._destroy(region)

    def _destroy(self, region: Region) -> None:
        if region not in self.regions:
            return
        try:
            region.destroy()
        except Exception:  # noqa: BLE001 - keep freeing the others
            log.warning("could not free shm region %s", region.name)
        SHM_REGIONS.dec()
        self.regions.remove(region)


def _abandoned(exc: BaseException) -> bool:
    if isinstance(exc, (asyncio.CancelledError, TimeoutError)):
        return True
    return isinstance(exc, InferenceServerException) and "DEADLINE_EXCEEDED" in str(exc.status())


def serialize_texts(texts: list[bytes]) -> bytes:
    """Triton BYTES tensor serialization: 4-byte little-endian length before each element."""
    return b"".join(len(t).to_bytes(4, "little") + t for t in texts)
