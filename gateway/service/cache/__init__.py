"""The embedding result cache (GATEWAY_CACHE): the pooled rows of texts embedded before, per worker (`local`) or
shared by every worker and replica (`redis`). results.py is its place in the request path, keys.py what a row is
keyed by, store.py what an entry holds; local.py and redis_store.py are the two stores."""

from __future__ import annotations

from gateway.service.cache.local import LocalStore
from gateway.service.cache.results import ResultCache
from gateway.service.cache.store import Store
from gateway.settings import GatewaySettings

__all__ = ["ResultCache", "make_store"]


def make_store(settings: GatewaySettings) -> Store | None:
    """The store GATEWAY_CACHE names (None: off)."""
    if settings.cache == "local":
        return LocalStore(settings.cache_bytes)
    if settings.cache == "redis":
        # imported only here: the redis client loads OpenTelemetry's SDK, which a gateway without tracing never does
        from gateway.service.cache.redis_store import RedisStore

        return RedisStore(settings.cache_redis_url, settings.cache_redis_timeout_s)
    return None
