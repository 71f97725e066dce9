"""The ensemble pipeline: texts go to Triton's NAME_*_ensemble (tokenizer inside Triton), split by its max batch
size; the chunks run concurrently, each bounded by the in-flight limit, and are reassembled in order."""

from __future__ import annotations

import asyncio
import math
import time

import numpy as np

from contract import NUM_TOKENS, TEXT, TEXT_PAIR
from gateway.errors import ErrorType, GatewayError
from gateway.service.admission import Backlog
from gateway.service.in_flight import InFlightLimit
from gateway.service.inference.pipeline import (
    BatchResult,
    Inputs,
    batches_in_flight,
    check_lengths,
    endpoint_setup,
    token_input_unsupported,
)
from gateway.service.registry import Endpoint, ServedModel
from gateway.service.tokenization import TokenizerQueue, TokenizerUnavailable, load_encoder
from gateway.settings import GatewaySettings
from gateway.triton.client import TritonClient
from gateway.triton.tensors import Output


class EnsemblePipeline:
    """Requests through Triton's ensembles, with an admission backlog and an in-flight bound per ensemble."""

    name = "ensemble"

    def __init__(self, client: TritonClient, settings: GatewaySettings) -> None:
        self.client = client
        self.settings = settings
        self.encoders: dict[str, TokenizerQueue] = {}  # models the gateway can tokenize for, by name
        self.backlogs: dict[str, tuple[Backlog, InFlightLimit]] = {}  # by ensemble

    def serves(self, endpoint: Endpoint) -> bool:
        return True  # every endpoint has its ensemble

    def backlog(self, endpoint: Endpoint) -> Backlog | None:
        entry = self.backlogs.get(endpoint.triton_model)
        return entry[0] if entry is not None else None

    def tokenizer(self, model: ServedModel, endpoint: Endpoint) -> TokenizerQueue | None:
        """The tokenizer the gateway counts `model`'s tokens with, where it can read it."""
        return self.encoders.get(model.name)

    def _admission(self, endpoint: Endpoint) -> tuple[Backlog, InFlightLimit]:
        """The texts admitted to an ensemble, and the bound on those in flight to Triton (made on first use)."""
        entry = self.backlogs.get(endpoint.triton_model)
        size = endpoint.max_batch_size
        in_flight = batches_in_flight(self.settings, endpoint)
        if entry is None or entry[1].limit != size * in_flight:
            entry = self.backlogs[endpoint.triton_model] = (
                Backlog(endpoint.triton_model, "texts", self.settings.max_queue_wait_s, call_units=None),
                InFlightLimit(size * in_flight),
            )
        return entry

    async def run(
        self, model: ServedModel, endpoint: Endpoint, inputs: Inputs, *, truncate: bool, deadline: float
    ) -> BatchResult:
        if inputs.token_ids is not None:
            raise token_input_unsupported(model)
        texts, pairs = inputs.texts, inputs.pairs
        tokenizer = self.encoders.get(model.name)
        if not truncate and tokenizer is not None:  # refuse before paying for the inference
            encoded_here = await tokenizer.encode(texts, pairs, inputs.direction)
            check_lengths(model, encoded_here.num_tokens, truncate)
        backlog, limit = self._admission(endpoint)
        # Triton's ensembles have no lanes: the deadline is what counts here
        await backlog.wait_for_room(deadline, inputs.urgency, self.settings.shed_pause_s)
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
        return BatchResult(outputs, num_tokens, check_lengths(model, num_tokens, truncate))

    async def sync(self, served: list[tuple[ServedModel, Endpoint]]) -> set[str]:
        """Give each ensemble its shm pool, and count tokens where the gateway can read the tokenizer."""
        self.encoders = {}
        pooled: set[str] = set()
        for model, endpoint in served:
            with endpoint_setup(model, endpoint):
                pooled.add(endpoint.triton_model)
                self._remember_encoder(model)
                await self._ensure_pool(model, endpoint)
        return pooled

    def _remember_encoder(self, model: ServedModel) -> None:
        """Where the gateway can read a model's tokenizer, it counts tokens for `truncate: false` itself, so that
        a too-long text is refused before inference."""
        if model.name not in self.encoders:
            try:
                encoder = load_encoder(self.settings.repository, model)
                self.encoders[model.name] = TokenizerQueue(encoder, self.settings.tokenize_inline_chars)
            except (TokenizerUnavailable, OSError, ValueError):
                pass

    async def _ensure_pool(self, model: ServedModel, endpoint: Endpoint) -> None:
        s, mb = self.settings, endpoint.max_batch_size
        sizes = {
            TEXT: mb * (4 + model.max_seq_len * s.shm_bytes_per_token),
            model.output_name: mb * model.output_width * 4,
            NUM_TOKENS: mb * 4,
        }
        if model.pairs:
            sizes[TEXT_PAIR] = sizes[TEXT]
        await self.client.pools.ensure(endpoint.triton_model, sizes, s.shm_pool_size)

    async def close(self) -> None:
        """Nothing to stop: the ensemble pipeline keeps no task of its own."""
