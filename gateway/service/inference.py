"""Run a list of texts through a served model, by one of two pipelines (GATEWAY_PIPELINE):

- scheduler: the gateway tokenizes (the repository's tokenizer.json), knows every length before
  any inference (exact usage; `truncate: false` refused before compute), and hands the rows
  to the model step's BatchScheduler, which batches by length under a token budget and calls
  NAME_trt_fp16 / NAME_onnx directly with token ids in shared memory.
- ensemble: texts go to Triton's NAME_*_ensemble (tokenizer inside Triton), split by its max
  batch size, chunks run concurrently and are reassembled in order.

A model whose tokenizer the gateway cannot read (remote Triton, no GATEWAY_REPOSITORY, a
mismatched file) uses its ensemble; `sync` says so in the log once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from contract import (
    CU_SEQLENS,
    INPUT_IDS,
    NUM_TOKENS,
    TEXT,
    TEXT_PAIR,
    TOKEN_INPUTS,
    TOKEN_TYPE_IDS,
    TruncationDirection,
)
from contract.batching import ROW_PAD_LIMIT, Shapes
from gateway import tracing
from gateway.errors import ErrorType, GatewayError, invalid
from gateway.metrics import BatchMetrics
from gateway.service.admission import Backlog
from gateway.service.in_flight import InFlightLimit
from gateway.service.registry import Backend, Endpoint, ServedModel
from gateway.service.scheduler import BatchPolicy, BatchScheduler, Outputs
from gateway.service.tokenization import (
    TokenizerQueue,
    TokenizerUnavailable,
    load_encoder,
)
from gateway.settings import GatewaySettings
from gateway.triton.client import Output, TritonClient

log = logging.getLogger("gateway.inference")

# What one more model call costs, in tokens of compute, when batches are planned (contract/batching.py):
# a GPU call costs about a thousand tokens of bert-base compute or more in fixed overhead, a CPU call
# almost none. A GPU step that declares no shapes (an older build) gets widths of a multiple of 8.
_CALL_COST_TOKENS = {"GPU": 1024, "CPU": 64}


@dataclass(frozen=True)
class Inputs:
    """What one request infers: texts, or text pairs, or texts given as token ids (no special tokens)."""

    texts: list[str]
    pairs: list[str] | None = None  # second texts of pairs, one per text
    direction: TruncationDirection = "right"  # which end of an over-long input is cut off
    token_ids: list[list[int]] | None = None  # instead of texts: the model's own token ids

    def __len__(self) -> int:
        return len(self.token_ids) if self.token_ids is not None else len(self.texts)


def _batches_in_flight(settings: GatewaySettings, endpoint: Endpoint) -> int:
    """Batches one worker keeps in flight to a step: GATEWAY_MAX_BATCHES_IN_FLIGHT per instance Triton runs
    of the step, shared by the gateway's workers (2 per instance: 1 per worker with 8 or 12 workers on a GPU's 4
    instances, measured best on the H100; 2 with one worker on one CPU instance; twice as many on two GPUs)."""
    per_instance = settings.max_batches_in_flight
    return max(1, math.ceil(per_instance * endpoint.step_instances / settings.worker_count))


def _input_sizes(policy: BatchPolicy, max_seq_len: int) -> dict[str, int]:
    """Bytes of each input of the largest batch `policy` forms."""
    if policy.layout == "packed":
        token_bytes = policy.max_tokens * 4
        return {INPUT_IDS: token_bytes, TOKEN_TYPE_IDS: token_bytes, CU_SEQLENS: (policy.max_rows + 1) * 4}
    # dummy rows can take a batch past the token budget by ROW_PAD_LIMIT (contract/batching.py)
    token_bytes = int(policy.max_tokens * (1 + ROW_PAD_LIMIT) + max_seq_len) * 4
    return {name: token_bytes for name in TOKEN_INPUTS}


def _token_shape(tensors: dict[str, np.ndarray], rows: int, dim: int) -> tuple[int, ...]:
    """The shape of a per-token output of `dim` floats per token (0: one) for a batch: [rows, width, dim]
    padded, [T, dim] packed."""
    lead = (tensors[INPUT_IDS].shape[1],) if CU_SEQLENS in tensors else (rows, tensors[INPUT_IDS].shape[1])
    return lead if dim == 0 else (*lead, dim)


def _characters(inputs: Inputs) -> int:
    """Characters of the texts (and pairs) of a request; for token ids, the ids themselves."""
    if inputs.token_ids is not None:
        return sum(len(ids) + 2 for ids in inputs.token_ids)
    return sum(map(len, inputs.texts)) + (sum(map(len, inputs.pairs)) if inputs.pairs is not None else 0)


@dataclass(frozen=True)
class BatchResult:
    """Model outputs for every input, in input order, and the billed token count."""

    outputs: Outputs  # [n, width] float32; a per-token output: a list of [tokens_i, ...] arrays
    num_tokens: np.ndarray  # [n] int32, before truncation
    tokens: int  # sum of min(num_tokens, max_seq_len)
    ids: list[np.ndarray] | None = None  # the token ids each text ran with (scheduler pipeline)

    @property
    def rows(self) -> np.ndarray:
        """The outputs as one [n, width] array: a pooled output's (embeddings, logits, scores)."""
        if not isinstance(self.outputs, np.ndarray):
            raise TypeError("a per-token output has no [n, width] rows: use per_text")
        return self.outputs

    @property
    def per_text(self) -> list[np.ndarray]:
        """The outputs text by text: a per-token output's [tokens_i, ...] array for each text."""
        texts = [output for output in self.outputs if output is not None]
        if len(texts) != len(self.outputs):
            raise RuntimeError("a text's output is missing")
        return texts


@dataclass
class TokenPipeline:
    """The scheduler pipeline of one endpoint: the tokenizer and the step's batch scheduler."""

    tokenizer: TokenizerQueue
    sha256: str
    scheduler: BatchScheduler
    metrics: BatchMetrics
    output: Output
    parent: BatchScheduler | None = None  # a per-token pipeline: the step's own scheduler it follows


def _token_pool(step: str, output: str) -> str:
    """The shm pool key of a per-token output of a step."""
    return f"{step}.{output}"


def _check_lengths(model: ServedModel, num_tokens: np.ndarray, truncate: bool) -> int:
    """Billed tokens; 413 when `truncate` is off and a text is over the model's limit."""
    if not truncate:
        over = np.flatnonzero(num_tokens > model.max_seq_len)
        if over.size:
            i = int(over[0])
            raise GatewayError(ErrorType.INPUT_TOO_LONG, f"input {i} has {int(num_tokens[i])} tokens, over the model's "
                               f"limit of {model.max_seq_len} (send truncate: true to truncate)")
    return int(np.minimum(num_tokens, model.max_seq_len).sum())


def token_input_unsupported(model: ServedModel) -> GatewayError:
    """400: the gateway cannot read the model's tokenizer, so it takes no token ids for it."""
    return invalid(f"model {model.name!r} takes no token ids here: the gateway cannot read its tokenizer "
                   "(GATEWAY_REPOSITORY); send text", type=ErrorType.TOKEN_INPUT_UNSUPPORTED)


class Inference:
    """Both pipelines of one worker, and the set of scheduler pipelines kept in sync with the registry."""

    def __init__(
        self, client: TritonClient, settings: GatewaySettings, on_model_gone: Callable[[], None] = lambda: None
    ) -> None:
        self.client = client
        self.settings = settings
        self.pipelines: dict[str, TokenPipeline] = {}  # by model step name
        # per-token outputs (/embed_all, bge-m3 lexical weights): a scheduler per (step, output), made on first use;
        # they share the step's tokenizer queue and have a shm pool of their own (sized by their token budget)
        self.token_pipelines: dict[tuple[str, str], TokenPipeline] = {}
        self.encoders: dict[str, TokenizerQueue] = {}  # ensemble-pipeline models the gateway can tokenize for
        self.backlogs: dict[str, tuple[Backlog, InFlightLimit]] = {}  # ensemble pipeline, per ensemble
        self._on_model_gone = on_model_gone
        self._fallback_logged: set[str] = set()
        self._retiring: set[asyncio.Task[None]] = set()  # schedulers of rebuilt steps, closing

    def pipeline_of(self, model: ServedModel, endpoint: Endpoint) -> str:
        """`scheduler` or `ensemble`: how requests for this endpoint run."""
        return "scheduler" if endpoint.step_model in self.pipelines else "ensemble"

    async def run(
        self, model: ServedModel, inputs: Inputs, *, truncate: bool, backend: Backend | None, deadline: float,
        output: str | None = None,
    ) -> BatchResult:
        """Infer all `inputs` (any count) on `model` by `deadline` (time.monotonic()); 413 before any
        inference when `truncate` is off and an input is too long (where the gateway can tokenize).
        `output`: a per-token output of the step (contract.PER_TOKEN_OUTPUTS) instead of the pooled one."""
        endpoint = model.endpoint(backend)
        pipeline = self.pipelines.get(endpoint.step_model)
        try:
            if output is not None:
                pipeline = await self._token_pipeline(model, endpoint, output)
            if pipeline is None:
                return await self._run_ensemble(model, endpoint, inputs, truncate, deadline)
            backlog = pipeline.scheduler.backlog
            chars = _characters(inputs)
            guess = backlog.guess_units(chars)
            backlog.admit(guess, deadline, rows=len(inputs))  # before tokenizing: a refusal costs next to nothing
            try:
                start = time.perf_counter()
                with tracing.span("tokenize"):
                    if inputs.token_ids is not None:
                        encoded = pipeline.tokenizer.encoder.encode_ids(inputs.token_ids)
                    else:
                        encoded = await pipeline.tokenizer.encode(inputs.texts, inputs.pairs, inputs.direction)
                pipeline.metrics.tokenize.observe(time.perf_counter() - start)
                tokens = _check_lengths(model, encoded.num_tokens, truncate)
            except BaseException:
                backlog.done(guess, len(inputs))
                raise
            actual = sum(len(ids) for ids in encoded.ids)
            backlog.learn_units_per_char(chars, actual)
            backlog.add(actual - guess)  # the guess, corrected
            outputs = await pipeline.scheduler.submit(encoded, deadline, counted=True)
            return BatchResult(outputs, encoded.num_tokens, tokens, encoded.ids)
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
        pipeline = self.pipelines.get(endpoint.step_model)
        if pipeline is not None:
            return pipeline.scheduler.backlog
        entry = self.backlogs.get(endpoint.triton_model)
        return entry[0] if entry is not None else None

    def _ensemble_admission(self, endpoint: Endpoint) -> tuple[Backlog, InFlightLimit]:
        """The texts admitted to an ensemble, and the bound on those in flight to Triton (made on first use)."""
        entry = self.backlogs.get(endpoint.triton_model)
        size = endpoint.max_batch_size
        in_flight = _batches_in_flight(self.settings, endpoint)
        if entry is None or entry[1].limit != size * in_flight:
            entry = self.backlogs[endpoint.triton_model] = (
                Backlog(endpoint.triton_model, "texts", self.settings.max_queue_wait_s, call_units=None),
                InFlightLimit(size * in_flight),
            )
        return entry

    def tokenizer_for(self, model: ServedModel) -> TokenizerQueue | None:
        """The tokenizer the gateway runs for `model`, off the event loop (None when it cannot read the model's
        tokenizer): the scheduler pipeline's, or the one an ensemble-pipeline model counts its tokens with."""
        endpoint = model.endpoint(None)
        pipeline = self.pipelines.get(endpoint.step_model)
        return pipeline.tokenizer if pipeline is not None else self.encoders.get(model.name)

    async def _run_ensemble(
        self, model: ServedModel, endpoint: Endpoint, inputs: Inputs, truncate: bool, deadline: float
    ) -> BatchResult:
        if inputs.token_ids is not None:
            raise token_input_unsupported(model)
        texts, pairs = inputs.texts, inputs.pairs
        tokenizer = self.encoders.get(model.name)
        if not truncate and tokenizer is not None:  # refuse before paying for the inference
            encoded_here = await tokenizer.encode(texts, pairs, inputs.direction)
            _check_lengths(model, encoded_here.num_tokens, truncate)
        backlog, limit = self._ensemble_admission(endpoint)
        backlog.check(deadline)
        size = endpoint.max_batch_size
        backlog.add(len(texts), calls=math.ceil(len(texts) / size))
        encoded = [t.encode() for t in texts]  # the API admits valid Unicode only
        second = [t.encode() for t in pairs] if pairs is not None else None
        starts = range(0, len(encoded), size)
        chunks = [(encoded[i : i + size], second[i : i + size] if second is not None else None) for i in starts]
        output = Output(model.output_name, model.output_width, model.name)

        remaining = [len(chunk[0]) for chunk in chunks]  # texts of each chunk still counted in the backlog (one call each)

        async def call(k: int) -> tuple[np.ndarray, np.ndarray]:
            first, second_texts = chunks[k]
            held = await limit.acquire(len(first))  # waits here, not in Triton's queue, behind earlier chunks
            if deadline - time.monotonic() < backlog.call_latency_s:  # would expire in Triton: never send it
                limit.release(held)
                raise GatewayError(ErrorType.TIMEOUT, "the request would not be answered before its deadline")
            mark, sent = backlog.call_started(), time.perf_counter()
            try:
                result = await self.client.infer_ensemble(
                    endpoint.triton_model, first, output, deadline, pairs=second_texts, direction=inputs.direction)
            except BaseException:
                backlog.call_ended(mark)
                raise
            finally:
                limit.release(held)
            backlog.observe_latency(time.perf_counter() - sent)
            backlog.served(len(first), len(first), mark)
            remaining[k] = 0
            return result

        try:
            if len(chunks) == 1:
                parts = [await call(0)]
            else:
                tasks = [asyncio.ensure_future(call(k)) for k in range(len(chunks))]
                try:
                    parts = await asyncio.gather(*tasks)
                except BaseException:
                    for task in tasks:
                        task.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)
                    raise
        finally:
            backlog.done(sum(remaining), calls=sum(1 for n in remaining if n))  # chunks that failed or never ran
        outputs = parts[0][0] if len(parts) == 1 else np.concatenate([p[0] for p in parts])
        num_tokens = parts[0][1] if len(parts) == 1 else np.concatenate([p[1] for p in parts])
        return BatchResult(outputs, num_tokens, _check_lengths(model, num_tokens, truncate))

    # --- keeping pipelines and shm pools in step with the served models --------------------------
    async def sync(self, models: list[ServedModel]) -> None:
        """Create what new endpoints need (pipelines, shm pools); drop pipelines of endpoints that went."""
        s = self.settings
        wanted: set[str] = set()
        pooled: set[str] = set()
        self.encoders = {}
        for model in models:
            for endpoint in model.endpoints.values():
                try:
                    if s.pipeline == "scheduler" and endpoint.step_model and self._pipeline(model, endpoint):
                        wanted.add(endpoint.step_model)
                        pooled.add(endpoint.step_model)
                        await self._ensure_step_pool(model, endpoint)
                        continue
                    pooled.add(endpoint.triton_model)
                    self._remember_encoder(model)
                    await self._ensure_ensemble_pool(model, endpoint)
                except GatewayError:
                    raise  # Triton itself is unavailable: this refresh fails as a whole
                except Exception:  # noqa: BLE001 - one endpoint's trouble must not stop the others
                    log.exception("%s: could not set up shared memory for %s; its tensors go over plain gRPC",
                                  model.name, endpoint.triton_model)
        for step in set(self.pipelines) - wanted:
            await self.pipelines.pop(step).scheduler.close()
        for key in list(self.token_pipelines):  # remade on next use, after the step they follow
            current = self.pipelines.get(key[0])
            if current is None or current.scheduler is not self.token_pipelines[key].parent:
                await self.token_pipelines.pop(key).scheduler.close()
            else:
                pooled.add(_token_pool(*key))
        for name in set(self.client.pools) - pooled:
            await self.client.drop_pool(name)

    def _remember_encoder(self, model: ServedModel) -> None:
        """Where the gateway can read an ensemble-pipeline model's tokenizer, it counts tokens for
        `truncate: false` itself, so that a too-long text is refused before inference."""
        if model.name not in self.encoders:
            try:
                encoder = load_encoder(self.settings.repository, model)
                self.encoders[model.name] = TokenizerQueue(encoder, self.settings.tokenize_inline_chars)
            except (TokenizerUnavailable, OSError, ValueError):
                pass

    def _pipeline(self, model: ServedModel, endpoint: Endpoint) -> TokenPipeline | None:
        """The endpoint's scheduler pipeline, made or remade when the tokenizer, the batch policy or the
        output changed (a rebuilt model); None when the gateway cannot tokenize for it."""
        current = self.pipelines.get(endpoint.step_model)
        sha = model.tokenizer.sha256 if model.tokenizer else ""
        policy = self._policy(model, endpoint)
        output = Output(model.output_name, model.output_width, model.name)
        same_step = current is not None and current.scheduler.policy == policy and current.output == output
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
        step = endpoint.step_model

        async def run_batch(tensors: dict[str, np.ndarray], rows: int, deadline: float) -> np.ndarray:
            return await self.client.infer_step(step, tensors, (rows, output.width), output, deadline)

        if same_step and current is not None:  # only the tokenizer changed: new encoder, same queue
            current.tokenizer.encoder, current.sha256 = encoder, sha
            return current
        metrics = BatchMetrics(model.name)
        tokenizer = TokenizerQueue(encoder, self.settings.tokenize_inline_chars)
        scheduler = BatchScheduler(step, model.output_width, policy, run_batch, metrics)
        pipeline = TokenPipeline(tokenizer, sha, scheduler, metrics, output)
        self.pipelines[step] = pipeline
        if current is not None:  # rebuilt step: what runs finishes, what waits is refused (503, retry)
            task = asyncio.get_running_loop().create_task(current.scheduler.close())
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)
        log.info("%s: scheduler pipeline on %s (%s)", model.name, step, policy)
        return pipeline

    def _policy(self, model: ServedModel, endpoint: Endpoint) -> BatchPolicy:
        """How batches for this step are formed: the settings, within what the step declares."""
        s = self.settings
        max_rows = min(s.max_batch_requests, endpoint.step_max_batch_size)
        budget = min(s.max_batch_tokens, endpoint.step_max_tokens) if endpoint.step_max_tokens else s.max_batch_tokens
        widths = endpoint.step_widths or (
            tuple(sorted({*range(8, model.max_seq_len, 8), model.max_seq_len})) if endpoint.step_on_gpu else ())
        rows = tuple(r for r in endpoint.step_rows if r <= max_rows)
        if rows and rows[-1] != max_rows:  # GATEWAY_MAX_BATCH_REQUESTS below the step's largest: a declared count
            max_rows = rows[-1]
        cost = s.batch_call_cost_tokens
        if endpoint.step_layout == "packed":  # only real tokens count: no widths, no row counts, no padding bound
            return BatchPolicy(
                max_rows=s.max_batch_requests,  # a packed request is one of Triton's batch, whatever its rows
                max_tokens=max(budget, model.max_seq_len), max_in_flight=_batches_in_flight(s, endpoint),
                shapes=Shapes(model.max_seq_len), call_cost_tokens=0,
                pad_id=model.tokenizer.pad_token_id if model.tokenizer else 0, max_queue_wait_s=s.max_queue_wait_s,
                layout="packed",
            )
        return BatchPolicy(
            max_rows=max_rows,
            max_tokens=max(budget, model.max_seq_len),
            max_in_flight=_batches_in_flight(s, endpoint),
            shapes=Shapes(model.max_seq_len, widths, rows),
            call_cost_tokens=_CALL_COST_TOKENS["GPU" if endpoint.step_on_gpu else "CPU"] if cost is None else cost,
            pad_id=model.tokenizer.pad_token_id if model.tokenizer else 0,
            max_queue_wait_s=s.max_queue_wait_s,
        )

    async def _token_pipeline(self, model: ServedModel, endpoint: Endpoint, output: str) -> TokenPipeline:
        """The scheduler of one per-token output of a step (made on first use): same tokenizer and batching rule,
        its own token budget (GATEWAY_TOKEN_OUTPUT_MAX_TOKENS: tokens x floats per token x 4 bytes come back)."""
        main = self.pipelines.get(endpoint.step_model)
        dim = endpoint.token_width(output)
        if dim is None:
            raise GatewayError(ErrorType.OUTPUT_NOT_AVAILABLE, f"model {model.name!r} has no per-token output "
                               f"{output!r} (rebuild it with this builder)")
        if main is None:
            raise GatewayError(ErrorType.PIPELINE_UNSUPPORTED, f"per-token outputs of {model.name!r} need the "
                               "gateway's scheduler pipeline: it must read the model's tokenizer (GATEWAY_REPOSITORY)")
        key = (endpoint.step_model, output)
        current = self.token_pipelines.get(key)
        if current is not None and current.parent is main.scheduler:
            current.tokenizer = main.tokenizer
            return current
        step, pool = endpoint.step_model, _token_pool(*key)
        out = Output(output, dim, model.name, per_token=True)
        budget = max(model.max_seq_len, min(self.settings.token_output_max_tokens, main.scheduler.policy.max_tokens))
        policy = dataclasses.replace(main.scheduler.policy, max_tokens=budget)

        async def run_batch(tensors: dict[str, np.ndarray], rows: int, deadline: float) -> np.ndarray:
            return await self.client.infer_step(step, tensors, _token_shape(tensors, rows, dim), out, deadline,
                                                pool=pool)

        scheduler = BatchScheduler(step, dim, policy, run_batch, main.metrics, per_token=True)
        pipeline = TokenPipeline(main.tokenizer, main.sha256, scheduler, main.metrics, out, parent=main.scheduler)
        self.token_pipelines[key] = pipeline
        if current is not None:
            await current.scheduler.close()
        try:
            sizes = _input_sizes(policy, model.max_seq_len)
            tokens = sizes[INPUT_IDS] // 4
            sizes[output] = tokens * max(dim, 1) * 4
            await self.client.ensure_pool(pool, sizes, policy.max_in_flight + 1)
        except GatewayError:  # Triton unavailable: made again, pool included, on the next request
            if self.token_pipelines.get(key) is pipeline:
                del self.token_pipelines[key]
            await scheduler.close()
            raise
        except Exception:  # noqa: BLE001 - the output still goes over plain gRPC
            log.exception("%s: could not set up shared memory for %s; it goes over plain gRPC", model.name, output)
        log.info("%s: per-token pipeline for %s on %s (budget %d tokens)", model.name, output, step, budget)
        return pipeline

    async def _ensure_step_pool(self, model: ServedModel, endpoint: Endpoint) -> None:
        policy = self.pipelines[endpoint.step_model].scheduler.policy
        sizes = _input_sizes(policy, model.max_seq_len)
        sizes[model.output_name] = policy.max_rows * model.output_width * 4
        await self.client.ensure_pool(endpoint.step_model, sizes, policy.max_in_flight + 1)

    async def _ensure_ensemble_pool(self, model: ServedModel, endpoint: Endpoint) -> None:
        s, mb = self.settings, endpoint.max_batch_size
        sizes = {
            TEXT: mb * (4 + model.max_seq_len * s.shm_bytes_per_token),
            model.output_name: mb * model.output_width * 4,
            NUM_TOKENS: mb * 4,
        }
        if model.pairs:
            sizes[TEXT_PAIR] = sizes[TEXT]
        await self.client.ensure_pool(endpoint.triton_model, sizes, s.shm_pool_size)

    async def close(self) -> None:
        await asyncio.gather(*self._retiring, return_exceptions=True)
        for pipeline in [*self.pipelines.values(), *self.token_pipelines.values()]:
            await pipeline.scheduler.close()
        self.pipelines.clear()
        self.token_pipelines.clear()
