"""Model lifecycle on a running stack: load, unload and reload one model family through Triton's
repository API (explicit model control), and the registry, tokenizers and shm pools follow at once.

A family is a model NAME's entries (contract.entry_names): its tokenizer, model steps and ensembles.
Loading an ensemble makes Triton load (or load again) its steps with it and switch the ensemble
once all of them are ready; until then the loaded version answers, so a reload drops nothing.
Unloading goes the other way: ensembles first, then the steps.
"""

from __future__ import annotations

import asyncio
import logging

from gateway.errors import ErrorType, GatewayError
from gateway.service.registry import Family
from gateway.service.runtime import Runtime

log = logging.getLogger("gateway.admin")


class ModelAdmin:
    """The admin operations of one worker, one at a time."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._lock = asyncio.Lock()

    def serves(self, name: str) -> bool:
        """Whether the API serves the family's model now (it is in /v1/models)."""
        return name in self.runtime.registry.models

    async def families(self) -> dict[str, Family]:
        """Every model family in Triton's repository, read now."""
        await self.runtime.refresh(force=True)
        return self.runtime.registry.families

    async def family(self, name: str) -> Family:
        """One family, read now; 404 when the repository has none of its entries."""
        family = (await self.families()).get(name)
        if family is None:
            known = sorted(self.runtime.registry.families)
            raise GatewayError(ErrorType.MODEL_NOT_FOUND, f"no model family {name!r} in Triton's repository (known: {known})")
        return family

    async def load(self, name: str) -> Family:
        """Load the family, or load it again from the repository (a new version directory, changed
        files): every ensemble with its steps, in one Triton call each."""
        async with self._lock:
            family = await self.family(name)
            timeout = self.runtime.settings.admin_timeout_s
            self.runtime.registry.changing(name, "loading")
            try:
                for entry in family.ensembles or family.steps:
                    log.info("loading %s (family %s)", entry, name)
                    await self.runtime.client.load_model(entry, timeout)
            finally:
                self.runtime.registry.changing(name, None)
            return await self.family(name)

    async def unload(self, name: str) -> Family:
        """Unload the family: its ensembles, then its steps. Requests Triton accepted finish first."""
        async with self._lock:
            family = await self.family(name)
            timeout = self.runtime.settings.admin_timeout_s
            loaded = family.loaded()
            self.runtime.registry.changing(name, "unloading")
            try:
                for entry in [*(e for e in family.ensembles if e in loaded), *(e for e in family.steps if e in loaded)]:
                    log.info("unloading %s (family %s)", entry, name)
                    await self.runtime.client.unload_model(entry, timeout)
            finally:
                self.runtime.registry.changing(name, None)
            return await self.family(name)
