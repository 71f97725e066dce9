"""The shared store: a Redis server every worker and replica uses, so each text is computed once for all of them.

Each model's epoch is a key of its own holding random bytes, read in the same round trip as the entries: a new one
(an admin load, unload or reload through any gateway) makes the entries before it unreachable for every gateway at
once. An epoch key that is gone (evicted, a flushed Redis) is made anew, which can never match an older entry.
Redis bounds the bytes itself (its `maxmemory` with an LRU policy). While Redis does not answer, lookups are misses
and the texts are inferred: the cache never fails a request."""

from __future__ import annotations

import logging
import time
from typing import cast

from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.metrics import CACHE_ERRORS
from gateway.service.cache.store import new_epoch

log = logging.getLogger("gateway.cache")
# After a failed call, Redis is left alone this long: a down server must not add a connection attempt to every
# request.
RETRY_AFTER_S = 1.0
KEY_PREFIX = b"gateway:embed:"


def epoch_key(model: str) -> bytes:
    return KEY_PREFIX + b"epoch:" + model.encode()


class RedisStore:
    def __init__(self, url: str, timeout_s: float) -> None:
        self.redis = Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
        self._quiet_until = float("-inf")

    def _failed(self, operation: str, exc: BaseException) -> None:
        CACHE_ERRORS.labels(operation).inc()
        if time.monotonic() >= self._quiet_until:
            log.warning("result cache: Redis %s failed (%s: %s); texts are inferred for %gs", operation,
                        type(exc).__name__, exc, RETRY_AFTER_S)
        self._quiet_until = time.monotonic() + RETRY_AFTER_S

    def _resting(self) -> bool:
        return time.monotonic() < self._quiet_until

    async def get(self, model: str, keys: list[bytes]) -> tuple[list[bytes | None], bytes | None]:
        if self._resting():
            return [None] * len(keys), None
        try:
            # bytes: the client does not decode responses
            names = [epoch_key(model), *(KEY_PREFIX + k for k in keys)]
            epoch, *values = cast(list[bytes | None], await self.redis.mget(names))
            if epoch is None:
                await self.redis.set(epoch_key(model), new_epoch(), nx=True)
        except (RedisError, OSError, TimeoutError) as exc:
            self._failed("get", exc)
            return [None] * len(keys), None
        return values, epoch

    async def put(self, items: list[tuple[bytes, bytes]]) -> None:
        if self._resting() or not items:
            return
        try:
            await self.redis.mset({KEY_PREFIX + key: value for key, value in items})
        except (RedisError, OSError, TimeoutError) as exc:
            self._failed("put", exc)

    async def invalidate(self, model: str) -> None:
        try:
            await self.redis.set(epoch_key(model), new_epoch())
        except (RedisError, OSError, TimeoutError) as exc:
            self._failed("invalidate", exc)

    async def close(self) -> None:
        await self.redis.aclose()
