"""Per-worker runtime: settings, the Triton client, the model registry and the inference pipelines,
kept in step with Triton's repository (a refresh every `refresh_interval_s`, and on demand)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from tritonclient.grpc import model_config_pb2

from gateway.errors import GatewayError
from gateway.service.admission import INTERACTIVE, Urgency
from gateway.service.inference import Inference, Inputs
from gateway.service.registry import Backend, Registry, ServedModel, Task
from gateway.settings import GatewaySettings
from gateway.triton.client import TritonClient

log = logging.getLogger("gateway.runtime")


class Runtime:
    """What one worker needs to serve requests."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.client = TritonClient(settings)
        self.registry = Registry(settings.refresh_interval_s)
        self.inference = Inference(self.client, settings, on_model_gone=self._refresh_soon)
        self._refresh_lock = asyncio.Lock()
        self._watcher: asyncio.Task[None] | None = None
        self._soon: asyncio.Task[None] | None = None
        self._synced: list[model_config_pb2.ModelConfig] | None = None  # the configs the pipelines follow

    async def start(self) -> None:
        """Discover models (when Triton is not there yet, serve anyway) and keep following the repository."""
        try:
            await asyncio.wait_for(self.refresh(), self.settings.startup_timeout_s)
        except (GatewayError, TimeoutError) as exc:
            log.warning("model discovery at start-up failed (%s); retrying in the background", exc)
        if self.settings.refresh_interval_s > 0:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def refresh(self, force: bool = False) -> None:
        """Re-read the served models from Triton once, however many callers ask at the same time
        (`force`: read again even when another caller's read finished while this one waited).

        The configs are read every time: a model rebuilt in place (same name and version, e.g. new
        labels, batch size or tokenizer, then a Triton restart or reload) changes no index entry.
        The registry and pipelines are rebuilt only when the index or a config changed, or when
        the last rebuild failed part-way."""
        seen = self.registry.generation
        async with self._refresh_lock:
            if self.registry.generation != seen and not force:
                return  # refreshed while this caller waited for the lock
            index = await self.client.repository_index()
            configs = await self.client.model_configs(sorted({e.name for e in index if e.state == "READY"}))
            if index == self.registry.index and configs == self._synced:
                self.registry.touch()
                return
            self.registry.replace(configs, index)
            await self.inference.sync(list(self.registry.models.values()))
            self._synced = configs

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.settings.refresh_interval_s)
            try:
                await self.refresh()
            except GatewayError as exc:
                log.debug("background model discovery failed: %s", exc.message)
            except Exception:  # the watcher must outlive any one failure
                log.exception("background model discovery failed")

    def _refresh_soon(self) -> None:
        """A call found its model gone from Triton: re-discover now (once, in the background)."""
        if self._soon is None or self._soon.done():
            self._soon = asyncio.get_running_loop().create_task(self._refresh_quietly())

    async def _refresh_quietly(self) -> None:
        with contextlib.suppress(GatewayError):
            await self.refresh()

    async def model(self, name: str | None, task: Task) -> ServedModel:
        """Resolve a request's model, re-discovering once (throttled) when it is not known."""
        try:
            return self.registry.resolve(name, task)
        except GatewayError:
            if not self.registry.refresh_due():
                raise
        await self.refresh()
        return self.registry.resolve(name, task)

    async def any_model(self, name: str | None) -> ServedModel:
        """The model a request names (any task), or the only one served; re-discovers once like `model`."""
        try:
            return self.registry.resolve_any(name)
        except GatewayError:
            if not self.registry.refresh_due():
                raise
        await self.refresh()
        return self.registry.resolve_any(name)

    def check_admission(self, name: str | None, task: Task | None, backend: Backend | None, deadline: float,
                        urgency: Urgency = INTERACTIVE) -> None:
        """Raise `overloaded` when the model a request names (of `task`; None: any task) is shedding and
        would refuse it now (the check service/admission.py makes, before anything is parsed or
        tokenized); nothing when the model or backend is unknown here (the route answers that)."""
        try:
            model = self.registry.resolve(name, task) if task else self.registry.resolve_any(name)
            backlog = self.inference.backlog_of(model, backend)
        except GatewayError:
            return
        if backlog is not None and backlog.shedding:
            backlog.check(deadline, urgency)

    async def probe(self, models: list[ServedModel] | None = None) -> dict[str, str]:
        """Run a one-token request through every served model (or `models`): `ok` or what failed, by name."""
        timeout = self.settings.ready_probe_timeout_s

        async def one(model: ServedModel) -> str:
            inputs = Inputs(["a"], ["a"] if model.pairs else None)
            try:
                async with asyncio.timeout(timeout):
                    await self.inference.run(model, inputs, truncate=True, backend=None,
                                             deadline=time.monotonic() + timeout)
            except GatewayError as exc:
                return f"{exc.type}: {exc.message}"
            except TimeoutError:
                return f"timeout: no answer within {timeout}s"
            return "ok"

        models = list(self.registry.models.values()) if models is None else models
        results = await asyncio.gather(*map(one, models))
        return {m.name: r for m, r in zip(models, results)}

    async def ready(self) -> bool:
        """Triton live, at least one model served, and every served ensemble loaded. Not Triton's own
        (strict) readiness: that turns false while any model unloads or loads, and an admin call on
        one family must not take the others out of service. Triton answers only once the models
        it loads at start-up are loaded."""
        if not await self.client.server_live():
            return False
        if self.registry.refresh_due() or not self.registry.models:
            try:
                await self.refresh()
            except GatewayError:
                return False
        names = [e.triton_model for m in self.registry.models.values() for e in m.endpoints.values()]
        if not names:
            return False
        return all(await asyncio.gather(*(self.client.model_ready(n) for n in names)))

    async def close(self) -> None:
        for task in (self._watcher, self._soon):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.inference.close()
        await self.client.close()
