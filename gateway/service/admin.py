"""Model lifecycle on a running stack: load, unload and reload one model family through Triton's
repository API (explicit model control), and the registry, tokenizers and shm pools follow at once.

A family is a model NAME's entries (contract.entry_names): its tokenizer, model steps and ensembles.
Loading an ensemble makes Triton load (or load again) its steps with it and switch the ensemble
once all of them are ready; until then the loaded version answers, so a reload drops nothing.
Unloading goes the other way: ensembles first, then the steps; Triton answers an unload call at once and lets go
of the model once its requests are done, so the unload waits for that in the repository index.

Triton's reasons for a failed load carry server paths and a python model's traceback: they are logged, and the
answers give them in short (gateway/triton/errors.py `plain_reason`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time

from gateway.errors import ErrorType, GatewayError
from gateway.service.registry import Family, families_of
from gateway.service.runtime import Runtime
from gateway.service.serving import Call
from gateway.triton.client import IndexEntry
from gateway.triton.errors import plain_reason

log = logging.getLogger("gateway.admin")
UNLOAD_POLL_S = (0.05, 0.5)  # first and longest wait between two reads of the index while Triton unloads
HELD = ("READY", "UNLOADING")  # an entry's states while Triton still holds a version of it


class ModelAdmin:
    """The admin operations of one worker, one at a time."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._lock = asyncio.Lock()
        self._logged: set[tuple[str, str]] = set()  # (family, reason) of failures logged already

    def serves(self, name: str) -> bool:
        """Whether the API serves the family's model now (it is in /v1/models)."""
        return name in self.runtime.registry.models

    async def families(self) -> dict[str, Family]:
        """Every model family in Triton's repository, read now; Triton's reasons in short (logged whole)."""
        await self.runtime.refresh(force=True)
        return {name: self._plain(family) for name, family in self.runtime.registry.families.items()}

    def _plain(self, family: Family) -> Family:
        """`family` with Triton's reasons in short; a failure's whole reason is logged once."""
        if family.reason and (family.name, family.reason) not in self._logged:
            self._logged.add((family.name, family.reason))
            log.warning("model family %s: %s", family.name, family.reason)
        entries = tuple(dataclasses.replace(e, reason=plain_reason(e.reason)) for e in family.entries)
        return dataclasses.replace(family, reason=plain_reason(family.reason), entries=entries)

    async def family(self, name: str, call: Call | None = None) -> Family:
        """One family, read now; 404 when the repository has none of its entries. `call`: the request, whose
        model (a metric label) is the family once it is known to exist."""
        family = (await self.families()).get(name)
        if family is None:
            known = sorted(self.runtime.registry.families)
            raise GatewayError(ErrorType.MODEL_NOT_FOUND, f"no model family {name!r} in Triton's repository (known: {known})")
        if call is not None:
            call.model = name
        return family

    async def load(self, name: str, call: Call | None = None) -> Family:
        """Load the family, or load it again from the repository (a new version directory, changed
        files): every ensemble with its steps, in one Triton call each."""
        async with self._lock:
            family = await self.family(name, call)
            timeout = self.runtime.settings.admin_timeout_s
            self.runtime.registry.changing(name, "loading")
            try:
                for entry in family.ensembles or family.steps:
                    log.info("loading %s (family %s)", entry, name)
                    await self.runtime.client.load_model(entry, timeout)
            finally:
                self.runtime.registry.changing(name, None)
                await self.runtime.cache.invalidate(name)  # after Triton switched: no old row is stored after it
            return await self.family(name)

    async def unload(self, name: str, call: Call | None = None) -> Family:
        """Unload the family: its ensembles, then its steps; answered once Triton holds none of them (requests
        Triton accepted finish first)."""
        async with self._lock:
            family = await self.family(name, call)
            timeout = self.runtime.settings.admin_timeout_s
            deadline = time.monotonic() + timeout
            loaded = family.loaded()
            self.runtime.registry.changing(name, "unloading")
            try:
                for entry in [*(e for e in family.ensembles if e in loaded), *(e for e in family.steps if e in loaded)]:
                    log.info("unloading %s (family %s)", entry, name)
                    await self.runtime.client.unload_model(entry, timeout)
                await self._until_let_go(name, deadline, timeout)
            finally:
                self.runtime.registry.changing(name, None)
                await self.runtime.cache.invalidate(name)
            return await self.family(name)

    async def _until_let_go(self, name: str, deadline: float, timeout: float) -> None:
        """Return once Triton's index shows no version of the family's entries held (READY or UNLOADING)."""
        wait = UNLOAD_POLL_S[0]
        while True:
            family = families_of(await self.runtime.client.repository_index()).get(name)
            if family is None or not _held(family.entries):
                return
            if time.monotonic() + wait > deadline:
                raise GatewayError(ErrorType.TIMEOUT, f"Triton did not finish unloading {name!r} within {timeout:g}s")
            await asyncio.sleep(wait)
            wait = min(wait * 2, UNLOAD_POLL_S[1])


def _held(entries: tuple[IndexEntry, ...]) -> bool:
    return any(e.state in HELD for e in entries)
