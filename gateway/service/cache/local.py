"""The per-worker store: an LRU map bounded in bytes, in this process's memory."""

from __future__ import annotations

from typing import Any

from cachetools import LRUCache

from gateway.metrics import CACHE_BYTES, CACHE_EVICTIONS
from gateway.service.cache.keys import KEY_BYTES
from gateway.service.cache.store import new_epoch

# What one entry costs besides its key and value bytes: the bytes objects' headers and the LRU's dict and
# order slots (about a quarter KB in CPython 3.11, by tracemalloc), so that GATEWAY_CACHE_BYTES bounds the memory
# the entries take, not only their data.
ENTRY_OVERHEAD = 256


def entry_size(value: bytes) -> int:
    return len(value) + KEY_BYTES + ENTRY_OVERHEAD


class _MeteredLRU(LRUCache[bytes, bytes]):
    """cachetools' LRU map with its evictions counted."""

    def popitem(self) -> tuple[bytes, bytes]:
        item: tuple[bytes, bytes] = super().popitem()
        CACHE_EVICTIONS.inc()
        return item


class LocalStore:
    """Entries in this worker's memory, least recently used evicted first past `max_bytes`."""

    def __init__(self, max_bytes: int) -> None:
        self.entries = _MeteredLRU(max_bytes, getsizeof=entry_size)
        self._epochs: dict[str, bytes] = {}
        self._counted = 0  # bytes last added to the gauge by this worker

    def epoch(self, model: str) -> bytes:
        epoch = self._epochs.get(model)
        if epoch is None:
            epoch = self._epochs[model] = new_epoch()
        return epoch

    async def get(self, model: str, keys: list[bytes]) -> tuple[list[bytes | None], bytes | None]:
        entries = self.entries
        return [entries.get(key) for key in keys], self.epoch(model)

    async def put(self, items: list[tuple[bytes, bytes]]) -> None:
        entries, limit = self.entries, self.entries.maxsize
        for key, value in items:
            if entry_size(value) <= limit:
                entries[key] = value
        self._meter()

    async def invalidate(self, model: str) -> None:
        """A new epoch; the old one's entries are evicted as the LRU needs room."""
        self._epochs[model] = new_epoch()

    def _meter(self) -> None:
        size: Any = self.entries.currsize
        CACHE_BYTES.inc(size - self._counted)
        self._counted = size

    async def close(self) -> None:
        self.entries.clear()
        self._meter()
