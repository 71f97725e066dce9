"""The scheduler pipeline: the gateway tokenizes (the repository's tokenizer.json), knows every length before any
inference (exact usage; `truncate: false` refused before compute), and hands the rows to the model step's
BatchScheduler, which batches by length under a token budget and calls NAME_trt_fp16 / NAME_onnx directly with
token ids in shared memory. A per-token output of a step (/embed_all, bge-m3's lexical weights), or several outputs
of one call (/encode: bge-m3's dense, lexical and ColBERT outputs of one forward pass), has a scheduler of its own,
made on first use, that shares the step's tokenizer and has an shm pool sized by its own token budget."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from dataclasses import dataclass

import numpy as np

from contract import INPUT_IDS
from gateway import tracing
from gateway.errors import ErrorType, GatewayError
from gateway.metrics import BatchMetrics
from gateway.service.admission import Backlog
from gateway.service.batch_tensors import StepOutputs
from gateway.service.inference.pipeline import BatchResult, Inputs, check_lengths, endpoint_setup
from gateway.service.inference.planning import batch_policy, input_sizes, token_shape
from gateway.service.registry import Endpoint, ServedModel
from gateway.service.scheduler import BatchScheduler
from gateway.service.tokenization import TokenizerQueue, TokenizerUnavailable, load_encoder
from gateway.settings import GatewaySettings
from gateway.triton.client import TritonClient
from gateway.triton.tensors import Output

log = logging.getLogger("gateway.inference")


@dataclass
class StepPipeline:
    """The scheduler pipeline of one step's output: the tokenizer and the batch scheduler."""

    tokenizer: TokenizerQueue
    sha256: str
    scheduler: BatchScheduler
    metrics: BatchMetrics
    outputs: tuple[Output, ...]  # what each call asks the step for
    parent: BatchScheduler | None = None  # a per-token pipeline: the step's own scheduler it follows


def _token_pool(step: str, outputs: tuple[str, ...]) -> str:
    """The shm pool key of a per-token pipeline of a step."""
    return f"{step}.{'+'.join(outputs)}"


def _characters(inputs: Inputs) -> int:
    """Characters of the texts (and pairs) of a request; for token ids, the ids themselves."""
    if inputs.token_ids is not None:
        return sum(len(ids) + 2 for ids in inputs.token_ids)
    return sum(map(len, inputs.texts)) + (sum(map(len, inputs.pairs)) if inputs.pairs is not None else 0)


class ScheduledPipeline:
    """The step pipelines of one worker, by step name, kept in step with the registry."""

    name = "scheduler"

    def __init__(self, client: TritonClient, settings: GatewaySettings) -> None:
        self.client = client
        self.settings = settings
        self.pipelines: dict[str, StepPipeline] = {}  # by model step name
        self.token_pipelines: dict[tuple[str, tuple[str, ...]], StepPipeline] = {}  # by (step, outputs of a call)
        self._fallback_logged: set[str] = set()
        self._retiring: set[asyncio.Task[None]] = set()  # schedulers of rebuilt steps, closing

    def serves(self, endpoint: Endpoint) -> bool:
        return endpoint.step_model in self.pipelines

    def backlog(self, endpoint: Endpoint) -> Backlog | None:
        pipeline = self.pipelines.get(endpoint.step_model)
        return pipeline.scheduler.backlog if pipeline is not None else None

    def tokenizer(self, model: ServedModel, endpoint: Endpoint) -> TokenizerQueue | None:
        pipeline = self.pipelines.get(endpoint.step_model)
        return pipeline.tokenizer if pipeline is not None else None

    async def run(
        self, model: ServedModel, endpoint: Endpoint, inputs: Inputs, *, truncate: bool, deadline: float,
        outputs: tuple[str, ...] = (),
    ) -> BatchResult:
        """Admit, tokenize and schedule one request. `outputs`: the step's outputs each call asks for, when not
        only the pooled one (a per-token output of contract.PER_TOKEN_OUTPUTS, or several of one forward pass)."""
        if outputs:
            pipeline = await self._token_pipeline(model, endpoint, outputs)
        else:
            pipeline = self.pipelines[endpoint.step_model]
        backlog = pipeline.scheduler.backlog
        chars = _characters(inputs)
        guess = backlog.guess_units(chars)
        urgency, lane = inputs.urgency, inputs.urgency.lane
        # before tokenizing: a refusal costs little
        await backlog.admit(guess, deadline, rows=len(inputs), urgency=urgency, hold_s=self.settings.shed_pause_s)
        try:
            start = time.perf_counter()
            with tracing.span("tokenize"):
                if inputs.token_ids is not None:
                    encoded = pipeline.tokenizer.encoder.encode_ids(inputs.token_ids)
                else:
                    encoded = await pipeline.tokenizer.encode(inputs.texts, inputs.pairs, inputs.direction)
            pipeline.metrics.tokenize.observe(time.perf_counter() - start)
            tokens = check_lengths(model, encoded.num_tokens, truncate)
        except BaseException:
            backlog.done(guess, len(inputs), queued_in=lane)
            raise
        actual = sum(len(ids) for ids in encoded.ids)
        backlog.learn_units_per_char(chars, actual)
        backlog.add(actual - guess, lane=lane)  # the guess, corrected
        results = await pipeline.scheduler.submit(encoded, deadline, counted=True, lane=lane)
        return BatchResult(results, encoded.num_tokens, tokens, encoded.ids)

    # --- keeping pipelines and shm pools in step with the served models --------------------------
    async def sync(self, served: list[tuple[ServedModel, Endpoint]]) -> set[str]:
        """Make or keep the pipeline of every endpoint among `served` the gateway can tokenize for, with its shm
        pool; close those of steps that went, and per-token pipelines whose step was rebuilt."""
        wanted: set[str] = set()
        for model, endpoint in served:
            with endpoint_setup(model, endpoint):
                if endpoint.step_model and self._pipeline(model, endpoint) is not None:
                    wanted.add(endpoint.step_model)
                    await self._ensure_step_pool(model, endpoint)
        pooled = set(wanted)
        for step in set(self.pipelines) - wanted:
            await self.pipelines.pop(step).scheduler.close()
        for key in list(self.token_pipelines):  # remade on next use, after the step they follow
            current = self.pipelines.get(key[0])
            if current is None or current.scheduler is not self.token_pipelines[key].parent:
                await self.token_pipelines.pop(key).scheduler.close()
            else:
                pooled.add(_token_pool(key[0], key[1]))
        return pooled

    def _pipeline(self, model: ServedModel, endpoint: Endpoint) -> StepPipeline | None:
        """The endpoint's pipeline, made or remade when the tokenizer, the batch policy or the output changed (a
        rebuilt model); None when the gateway cannot tokenize for it."""
        current = self.pipelines.get(endpoint.step_model)
        sha = model.tokenizer.sha256 if model.tokenizer else ""
        policy = batch_policy(self.settings, model, endpoint)
        output = Output(model.output_name, model.output_width, model.name)
        same_step = current is not None and current.scheduler.policy == policy and current.outputs == (output,)
        if same_step and current is not None and current.sha256 == sha:
            return current
        try:
            encoder = load_encoder(self.settings.repository, model)
        except (TokenizerUnavailable, OSError, ValueError) as exc:
            if current is not None:
                log.warning("%s: tokenizer no longer readable (%s); keeping the loaded one", model.name, exc)
                return current
            if endpoint.triton_model not in self._fallback_logged:
                self._fallback_logged.add(endpoint.triton_model)
                log.warning("%s: the gateway cannot tokenize itself (%s); requests go to Triton's ensemble %s",
                            model.name, exc, endpoint.triton_model)
            return None
        if same_step and current is not None:  # only the tokenizer changed: new encoder, same queue
            current.tokenizer.encoder, current.sha256 = encoder, sha
            return current
        step = endpoint.step_model

        async def run_batch(tensors: dict[str, np.ndarray], rows: int, deadline: float) -> np.ndarray:
            return await self.client.infer_step(step, tensors, (rows, output.width), output, deadline)

        metrics = BatchMetrics(model.name)
        tokenizer = TokenizerQueue(encoder, self.settings.tokenize_inline_chars)
        scheduler = BatchScheduler(step, model.output_width, policy, run_batch, metrics)
        pipeline = StepPipeline(tokenizer, sha, scheduler, metrics, (output,))
        self.pipelines[step] = pipeline
        if current is not None:  # rebuilt step: what runs finishes, what waits is refused (503, retry)
            task = asyncio.get_running_loop().create_task(current.scheduler.close())
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)
        log.info("%s: scheduler pipeline on %s (%s)", model.name, step, policy)
        return pipeline

    async def _token_pipeline(self, model: ServedModel, endpoint: Endpoint, names: tuple[str, ...]) -> StepPipeline:
        """The scheduler of calls that ask the step for `names` (per-token outputs, the pooled one among them when
        several come from one forward pass), made on first use: same tokenizer and batching rule, its own token
        budget (GATEWAY_TOKEN_OUTPUT_MAX_TOKENS: tokens x floats per token x 4 bytes come back)."""
        main = self.pipelines.get(endpoint.step_model)
        outputs = tuple(self._step_output(model, endpoint, name) for name in names)
        if main is None:
            raise GatewayError(ErrorType.PIPELINE_UNSUPPORTED, f"per-token outputs of {model.name!r} need the "
                               "gateway's scheduler pipeline: it must read the model's tokenizer (GATEWAY_REPOSITORY)")
        key = (endpoint.step_model, names)
        current = self.token_pipelines.get(key)
        if current is not None and current.parent is main.scheduler:
            current.tokenizer = main.tokenizer
            return current
        step, pool = endpoint.step_model, _token_pool(*key)
        budget = max(model.max_seq_len, min(self.settings.token_output_max_tokens, main.scheduler.policy.max_tokens))
        policy = dataclasses.replace(main.scheduler.policy, max_tokens=budget)

        async def run_batch(tensors: dict[str, np.ndarray], rows: int, deadline: float) -> np.ndarray | StepOutputs:
            shapes = [(out, token_shape(tensors, rows, out.width) if out.per_token else (rows, out.width))
                      for out in outputs]
            arrays = await self.client.infer_outputs(step, tensors, shapes, deadline, pool=pool)
            if len(arrays) == 1:
                return arrays[0]
            return StepOutputs(tuple(arrays), tuple(out.per_token for out in outputs))

        scheduler = BatchScheduler(step, outputs[0].width, policy, run_batch, main.metrics, per_token=True)
        pipeline = StepPipeline(main.tokenizer, main.sha256, scheduler, main.metrics, outputs, parent=main.scheduler)
        self.token_pipelines[key] = pipeline
        if current is not None:
            await current.scheduler.close()
        try:
            sizes = input_sizes(policy, model.max_seq_len)
            tokens = sizes[INPUT_IDS] // 4
            for out in outputs:
                sizes[out.name] = (tokens * max(out.width, 1) if out.per_token else policy.max_rows * out.width) * 4
            await self.client.pools.ensure(pool, sizes, policy.max_in_flight + 1)
        except GatewayError:  # Triton unavailable: made again, pool included, on the next request
            if self.token_pipelines.get(key) is pipeline:
                del self.token_pipelines[key]
            await scheduler.close()
            raise
        except Exception:  # noqa: BLE001 - the outputs still go over plain gRPC
            log.exception("%s: could not set up shared memory for %s; it goes over plain gRPC", model.name, names)
        log.info("%s: per-token pipeline for %s on %s (budget %d tokens)", model.name, "+".join(names), step, budget)
        return pipeline

    @staticmethod
    def _step_output(model: ServedModel, endpoint: Endpoint, name: str) -> Output:
        """What a call asks the step for under `name`: the pooled output, or a per-token one it declares."""
        if name == model.output_name:
            return Output(name, model.output_width, model.name)
        dim = endpoint.token_width(name)
        if dim is None:
            raise GatewayError(ErrorType.OUTPUT_NOT_AVAILABLE, f"model {model.name!r} has no per-token output "
                               f"{name!r} (rebuild it with this builder)")
        return Output(name, dim, model.name, per_token=True)

    async def _ensure_step_pool(self, model: ServedModel, endpoint: Endpoint) -> None:
        policy = self.pipelines[endpoint.step_model].scheduler.policy
        sizes = input_sizes(policy, model.max_seq_len)
        sizes[model.output_name] = policy.max_rows * model.output_width * 4
        await self.client.pools.ensure(endpoint.step_model, sizes, policy.max_in_flight + 1)

    async def close(self) -> None:
        await asyncio.gather(*self._retiring, return_exceptions=True)
        for pipeline in [*self.pipelines.values(), *self.token_pipelines.values()]:
            await pipeline.scheduler.close()
        self.pipelines.clear()
        self.token_pipelines.clear()
