"""Per-worker runtime: settings, the Triton client, the model registry and the inference pipelines, kept in sync."""

from __future__ import annotations

import asyncio
import logging

from gateway.api.errors import GatewayError
from gateway.service.inference import Inference
from gateway.service.registry import Registry, ServedModel, Task
from gateway.settings import GatewaySettings
from gateway.triton.client import TritonClient

log = logging.getLogger("gateway.runtime")


class Runtime:
    """What one worker needs to serve requests."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.client = TritonClient(settings)
        self.registry = Registry(settings.refresh_interval_s)
        self.inference = Inference(self.client, settings)
        self._refresh_lock = asyncio.Lock()

    async def start(self) -> None:
        """Discover models; when Triton is not there yet, serve anyway and discover later."""
        try:
            await asyncio.wait_for(self.refresh(), self.settings.startup_timeout_s)
        except (GatewayError, TimeoutError) as exc:
            log.warning("model discovery at start-up failed (%s); retrying on demand", exc)

    async def refresh(self) -> None:
        """Re-read the served models from Triton; set up pipelines and shm pools for new ones."""
        async with self._refresh_lock:
            configs = await self.client.ready_configs()
            self.registry.replace(configs)
            await self.inference.sync(list(self.registry.models.values()))

    async def model(self, name: str | None, task: Task) -> ServedModel:
        """Resolve a request's model, re-discovering once (throttled) when it is not known."""
        try:
            return self.registry.resolve(name, task)
        except GatewayError:
            if not self.registry.refresh_due():
                raise
        await self.refresh()
        return self.registry.resolve(name, task)

    async def ready(self) -> bool:
        """Triton ready and every served ensemble loaded."""
        if not await self.client.server_ready():
            return False
        if not self.registry.models:
            try:
                await self.refresh()
            except GatewayError:
                return False
        names = [e.triton_model for m in self.registry.models.values() for e in m.endpoints.values()]
        if not names:
            return False
        return all(await asyncio.gather(*(self.client.model_ready(n) for n in names)))

    async def close(self) -> None:
        await self.inference.close()
        await self.client.close()
