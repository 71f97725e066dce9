"""Per-worker runtime: settings, the Triton client, the model registry and the inference pipelines,
kept in step with Triton's repository (a refresh every `refresh_interval_s`, and on demand), and the checks that
readiness reports: each path the gateway's calls take, and a one-token request through each model."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time

from tritonclient.grpc import model_config_pb2

from gateway.errors import GatewayError
from gateway.service.admission import INTERACTIVE, Urgency
from gateway.service.cache import ResultCache, make_store
from gateway.service.inference import Inference, Inputs
from gateway.service.registry import Backend, Registry, ServedModel, Task
from gateway.settings import GatewaySettings
from gateway.triton.client import TritonClient

log = logging.getLogger("gateway.runtime")
# A one-token probe's result answers the probes of the same model for this long, and concurrent probes share one
# run: /readyz?deep=1 and /tei/{model}/health are public, so a flood of them must not become a flood of inference.
PROBE_REUSE_S = 2.0


class _Probe:
    """One probe run of a model, and until when its result answers other probes."""

    __slots__ = ("task", "until")

    def __init__(self, task: asyncio.Task[str]) -> None:
        self.task = task
        self.until = float("inf")  # while it runs: every probe waits for it
        task.add_done_callback(self._done)

    def _done(self, _: asyncio.Task[str]) -> None:
        self.until = time.monotonic() + PROBE_REUSE_S

    @property
    def fresh(self) -> bool:
        return time.monotonic() < self.until


class Runtime:
    """What one worker needs to serve requests."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.client = TritonClient(settings)
        self.registry = Registry(settings.refresh_interval_s)
        self.inference = Inference(self.client, settings, on_model_gone=self._refresh_soon)
        self.cache = ResultCache(make_store(settings), self.registry, self.inference)
        self._refresh_lock = asyncio.Lock()
        self._watcher: asyncio.Task[None] | None = None
        self._soon: asyncio.Task[None] | None = None
        self._synced: list[model_config_pb2.ModelConfig] | None = None  # the configs the pipelines follow
        self.repository_problem: str | None = None  # why the last read of Triton's repository failed
        self._probes: dict[str, _Probe] = {}  # the last probe run of each model, by name

    async def start(self) -> None:
        """Check Triton's HTTP endpoint, discover models (when Triton is not there yet, serve anyway) and keep
        following the repository."""
        await self.client.check_http(self.settings.ready_probe_timeout_s)
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
            try:
                index = await self.client.repository_index()
                configs = await self.client.model_configs(sorted({e.name for e in index if e.state == "READY"}))
            except GatewayError as exc:
                self.repository_problem = exc.message
                raise
            self.repository_problem = None
            if index == self.registry.index and configs == self._synced:
                self.registry.touch()
                return
            self.registry.replace(configs, index)
            await self.inference.sync(list(self.registry.models.values()))
            self._synced = configs

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.settings.refresh_interval_s)
            if self.client.http_problem is not None:  # back on HTTP once the endpoint is Triton's
                await self.client.check_http(self.settings.ready_probe_timeout_s)
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

    async def await_admission(self, name: str | None, task: Task | None, backend: Backend | None, deadline: float,
                              urgency: Urgency = INTERACTIVE, hold_s: float = 0.0) -> None:
        """Raise `overloaded` when the model a request names (of `task`; None: any task) is shedding and would
        not admit it (the check service/admission.py makes, before anything is parsed or tokenized) within
        `hold_s` (and its deadline): each time work leaves the model, the request is checked again, so that a
        request refused at a burst's peak is served by the room the burst leaves, not sent back to retry.
        Nothing when the model or backend is unknown here (the route answers that)."""
        try:
            model = self.registry.resolve(name, task) if task else self.registry.resolve_any(name)
            backlog = self.inference.backlog_of(model, backend)
        except GatewayError:
            return
        if backlog is not None and backlog.shedding:
            await backlog.wait_for_room(deadline, urgency, hold_s)

    async def probe(self, models: list[ServedModel] | None = None) -> dict[str, str]:
        """Run a one-token request through every served model (or `models`): `ok` or what failed, by name. A
        model's probe that ran less than PROBE_REUSE_S ago, or runs now, answers instead of a new one."""
        models = list(self.registry.models.values()) if models is None else models
        runs = []
        for model in models:
            probe = self._probes.get(model.name)
            if probe is None or not probe.fresh:
                probe = self._probes[model.name] = _Probe(asyncio.get_running_loop().create_task(self._probe(model)))
            runs.append(asyncio.shield(probe.task))  # a caller that leaves does not cancel the others' probe
        results = await asyncio.gather(*runs)
        return {m.name: r for m, r in zip(models, results)}

    async def _probe(self, model: ServedModel) -> str:
        timeout = self.settings.ready_probe_timeout_s
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

    async def ready(self) -> tuple[str | None, dict[str, str]]:
        """(why the gateway is not ready, None when it is; the state of each path its calls take).

        Ready: Triton live on its gRPC endpoint, its repository readable, at least one model served, and every
        served ensemble loaded. Not Triton's own (strict) readiness: that turns false while any model unloads
        or loads, and an admin call on one family must not take the others out of service. Triton answers only
        once the models it loads at start-up are loaded.

        The paths, each `ok`, `off` or what is wrong with it: `grpc` (health, the repository, and inference
        whose tensors do not all fit shared memory), `repository` (the index, with its key), `http` (inference
        whose tensors are all in shared memory), `shm` (the regions). A wrong HTTP endpoint or regions Triton
        cannot open leave the gateway ready: those calls go over gRPC (one warning in the log says why)."""
        client = self.client
        live, http = await asyncio.gather(client.server_live(), client.check_http(self.settings.ready_probe_timeout_s))
        paths = {"grpc": "ok" if live else "Triton does not answer on GATEWAY_TRITON_URL"}
        problem = None  # why the repository could not be read now, or by the last refresh
        if live and (self.registry.refresh_due() or not self.registry.models):
            try:
                await self.refresh()
            except GatewayError as exc:
                problem = exc.message
        problem = problem or self.repository_problem
        paths["repository"] = "not read" if not live else problem or "ok"
        paths["http"] = ("off" if client.http is None else "ok" if http is None else
                         "GATEWAY_TRITON_HTTP_URL is not Triton's live HTTP endpoint: inference goes over gRPC")
        refused = client.pools.refused
        paths["shm"] = ("off" if self.settings.shm == "none" else "ok" if not refused else
                        f"Triton cannot open this worker's regions of {len(refused)} model(s): their tensors go "
                        "over gRPC (do Triton and the gateway share /dev/shm?)")
        if not live:
            return paths["grpc"], paths
        if problem is not None:
            return f"Triton's repository cannot be read: {problem}", paths
        names = {e.triton_model: m.name for m in self.registry.models.values() for e in m.endpoints.values()}
        if not names:
            return "no model is served", paths
        loaded = await asyncio.gather(*(client.model_ready(n) for n in names))
        unready = sorted({model for (_, model), ok in zip(names.items(), loaded) if not ok})
        return (f"not loaded in Triton: {', '.join(unready)}" if unready else None), paths

    async def close(self) -> None:
        for task in (self._watcher, self._soon, *(p.task for p in self._probes.values())):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.inference.close()
        await self.cache.close()
        await self.client.close()
