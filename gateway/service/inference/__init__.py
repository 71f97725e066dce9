"""Run a list of texts through a served model, by one of two pipelines (GATEWAY_PIPELINE) behind one object:

- scheduler (scheduled.py): the gateway tokenizes, batches by length under a token budget and calls the model
  steps with token ids in shared memory;
- ensemble (ensemble.py): texts go to Triton's ensembles, tokenizer inside Triton.

A model whose tokenizer the gateway cannot read (remote Triton, no GATEWAY_REPOSITORY, a mismatched file) uses
its ensemble; `sync` says so in the log once.
"""

from __future__ import annotations

from collections.abc import Callable

from gateway.errors import ErrorType, GatewayError
from gateway.service.admission import Backlog
from gateway.service.inference.ensemble import EnsemblePipeline
from gateway.service.inference.pipeline import BatchResult, Inputs, Pipeline
from gateway.service.inference.scheduled import ScheduledPipeline
from gateway.service.registry import Backend, Endpoint, ServedModel
from gateway.service.tokenization import TokenizerQueue
from gateway.settings import GatewaySettings
from gateway.triton.client import TritonClient


class Inference:
    """Both pipelines of one worker: each endpoint runs on the scheduler pipeline where the gateway can tokenize
    for it, else on its ensemble."""

    def __init__(
        self, client: TritonClient, settings: GatewaySettings, on_model_gone: Callable[[], None] = lambda: None
    ) -> None:
        self.client = client
        self.settings = settings
        self.scheduled = ScheduledPipeline(client, settings)
        self.ensemble = EnsemblePipeline(client, settings)
        self._on_model_gone = on_model_gone

    def _pipeline(self, endpoint: Endpoint) -> Pipeline:
        return self.scheduled if self.scheduled.serves(endpoint) else self.ensemble

    def pipeline_of(self, model: ServedModel, endpoint: Endpoint) -> str:
        """`scheduler` or `ensemble`: how requests for this endpoint run."""
        return self._pipeline(endpoint).name

    async def run(
        self, model: ServedModel, inputs: Inputs, *, truncate: bool, backend: Backend | None, deadline: float,
        outputs: tuple[str, ...] = (),
    ) -> BatchResult:
        """Infer all `inputs` (any count) on `model` by `deadline` (time.monotonic()); 413 before any
        inference when `truncate` is off and an input is too long (where the gateway can tokenize).
        `outputs`: the step's outputs to compute in one forward pass, when not only the pooled one (per-token
        outputs of contract.PER_TOKEN_OUTPUTS, the pooled one among them or not): only the scheduler pipeline has
        those, and the result holds them text by text (one output: `per_text`; several: `per_text_outputs`)."""
        endpoint = model.endpoint(backend)
        try:
            if outputs and outputs != (model.output_name,):
                return await self.scheduled.run(model, endpoint, inputs, truncate=truncate, deadline=deadline,
                                                outputs=outputs)
            return await self._pipeline(endpoint).run(model, endpoint, inputs, truncate=truncate, deadline=deadline)
        except GatewayError as exc:
            if exc.type is ErrorType.MODEL_UNAVAILABLE:
                self._on_model_gone()
            raise

    def shedding(self) -> bool:
        """Whether any model's last admission check refused a request."""
        return Backlog.shedding_models > 0

    def backlog_of(self, model: ServedModel, backend: Backend | None = None) -> Backlog | None:
        """The admission backlog requests for `model` meet (None before its first ensemble request)."""
        endpoint = model.endpoint(backend)
        return self._pipeline(endpoint).backlog(endpoint)

    def tokenizer_for(self, model: ServedModel) -> TokenizerQueue | None:
        """The tokenizer the gateway runs for `model`, off the event loop (None when it cannot read the model's
        tokenizer): the scheduler pipeline's, or the one an ensemble-pipeline model counts its tokens with."""
        endpoint = model.endpoint(None)
        return self._pipeline(endpoint).tokenizer(model, endpoint)

    async def sync(self, models: list[ServedModel]) -> None:
        """Create what new endpoints need (pipelines, shm pools); drop what endpoints that went had."""
        served = [(model, endpoint) for model in models for endpoint in model.endpoints.values()]
        pooled = await self.scheduled.sync(served if self.settings.pipeline == "scheduler" else [])
        pooled |= await self.ensemble.sync([(m, e) for m, e in served if not self.scheduled.serves(e)])
        for name in set(self.client.pools) - pooled:
            await self.client.pools.drop(name)

    async def close(self) -> None:
        await self.scheduled.close()
        await self.ensemble.close()
