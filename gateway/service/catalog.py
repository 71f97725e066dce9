"""The served models as the API lists them, their readiness, and a one-token probe through them."""

from __future__ import annotations

from gateway.errors import ErrorType, unavailable
from gateway.service.registry import FamilyState, ServedModel
from gateway.service.serving import Service
from gateway.settings import GatewaySettings


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

    async def readiness(
        self, deep: bool,
    ) -> tuple[bool, list[str], dict[str, FamilyState | None], dict[str, str] | None]:
        """(ready, served model names, every family's state, `deep`: each model's one-token probe) for /readyz."""
        runtime = self.runtime
        ready = await runtime.ready()
        registry = runtime.registry
        families = {n: registry.state_of(n) for n in sorted(registry.families)}
        checks = await runtime.probe() if deep and ready else None
        if checks is not None and any(v != "ok" for v in checks.values()):
            ready = False
        return ready, sorted(registry.models), families, checks

    async def check_health(self, model: ServedModel) -> None:
        """503 `model_unavailable` unless a one-token request through `model` succeeds in time."""
        result = (await self.runtime.probe([model]))[model.name]
        if result != "ok":
            raise unavailable(f"model {model.name!r} is unhealthy: {result}", type=ErrorType.MODEL_UNAVAILABLE)
