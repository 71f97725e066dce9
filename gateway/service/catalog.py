"""The served models as the API lists them, their readiness, and a one-token probe through them."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.errors import ErrorType, GatewayError, unavailable
from gateway.service.registry import FamilyState, ServedModel
from gateway.service.serving import Call, Service
from gateway.settings import GatewaySettings


@dataclass(frozen=True, slots=True)
class Readiness:
    """What /readyz reports. Public (the probe needs no key): model names and family states, and each path's state
    in words that name a setting, never an address, a Triton model name or Triton's own reasons."""

    reason: str | None  # why the gateway is not ready; None when it is
    models: list[str]  # served, by name
    families: dict[str, FamilyState | None]  # every family of Triton's repository and its state
    triton: dict[str, str]  # how the gateway reaches Triton: grpc, repository, http, shm: `ok`, `off` or what is wrong (Runtime.ready)
    checks: dict[str, str] | None  # `deep`: each served model's one-token probe, `ok` or what failed


class CatalogService(Service):
    """/v1/models, /readyz and TEI's /info and /health."""

    @property
    def settings(self) -> GatewaySettings:
        """The limits the models are served with (TEI's /info reports them)."""
        return self.runtime.settings

    async def served(self) -> list[ServedModel]:
        """Every served model by name (discovered now when none is known and a refresh is due)."""
        registry = self.runtime.registry
        if not registry.models and registry.refresh_due():
            await self.runtime.refresh()
        return sorted(registry.models.values(), key=lambda m: m.name)

    def pipeline_of(self, model: ServedModel) -> str:
        """`scheduler` or `ensemble`: how requests for the model's default backend run."""
        return self.inference.pipeline_of(model, model.endpoint(None))

    async def readiness(self, deep: bool) -> Readiness:
        """/readyz: the paths' and models' state; `deep`: also a one-token probe through every served model."""
        runtime = self.runtime
        reason, paths = await runtime.ready()
        registry = runtime.registry
        families = {n: registry.state_of(n) for n in sorted(registry.families)}
        checks = await runtime.probe() if deep and reason is None else None
        if checks is not None and any(v != "ok" for v in checks.values()):
            reason = "a one-token request failed: " + ", ".join(sorted(n for n, v in checks.items() if v != "ok"))
        return Readiness(reason, sorted(registry.models), families, paths, checks)

    async def health_model(self, call: Call, name: str) -> ServedModel:
        """The model TEI's /health of `name` checks: 503 `model_unavailable` (TEI's `Unhealthy`) for a family of
        Triton's repository that is not served now (unloaded, loading, failed), 404 for a name it has not."""
        try:
            return await self.model(call, name, None)
        except GatewayError as exc:
            if exc.type is not ErrorType.MODEL_NOT_FOUND or self.runtime.registry.state_of(name) is None:
                raise
        raise unavailable(f"model {name!r} is not loaded", type=ErrorType.MODEL_UNAVAILABLE)

    async def check_health(self, model: ServedModel) -> None:
        """503 `model_unavailable` unless a one-token request through `model` succeeds in time."""
        result = (await self.runtime.probe([model]))[model.name]
        if result != "ok":
            raise unavailable(f"model {model.name!r} is unhealthy: {result}", type=ErrorType.MODEL_UNAVAILABLE)
