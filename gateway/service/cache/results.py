"""The embedding result cache in the request path: every text of a request is looked up, only the misses are
inferred, and the rows are merged back in input order, with each text's token count so that usage is the same
whether a row was cached or not.

Token-id inputs bypass it (they are rare, and their ids would need a key of their own). With `truncate: false`
a request is served from the cache only when every text hits (their token counts give the same 413 a fresh
request gets); otherwise all of its texts are inferred, so that a refusal names the same input."""

from __future__ import annotations

import numpy as np

from gateway.metrics import CACHE_LOOKUPS
from gateway.service.cache.keys import model_identity, text_key
from gateway.service.cache.store import Store, pack, unpack
from gateway.service.inference import Inference, Inputs
from gateway.service.inference.pipeline import check_lengths
from gateway.service.registry import Backend, Registry, ServedModel


class ResultCache:
    """The pooled rows of one worker's embedding requests, through a store (None: the cache is off)."""

    def __init__(self, store: Store | None, registry: Registry, inference: Inference) -> None:
        self.store = store
        self.registry = registry
        self.inference = inference
        # the identity of each (model, backend), until the registry or the pipeline changes
        self._identities: dict[tuple[str, str], tuple[ServedModel, object, str, bytes]] = {}

    async def rows(self, model: ServedModel, inputs: Inputs, *, truncate: bool, backend: Backend | None,
                   deadline: float) -> tuple[np.ndarray, int]:
        """The pooled rows [n, width] float32 of `inputs` in order, and the billed token count."""
        store = self.store
        if store is None or inputs.token_ids is not None or not inputs.texts:
            result = await self.inference.run(model, inputs, truncate=truncate, backend=backend, deadline=deadline)
            return result.rows, result.tokens
        identity = self._identity(model, backend)
        keys = [text_key(identity, inputs.direction, text) for text in inputs.texts]
        values, epoch = await store.get(model.name, keys)
        width = model.output_width
        found = [unpack(value, epoch, width) if epoch is not None else None for value in values]
        misses = [i for i, entry in enumerate(found) if entry is None]
        if misses and not truncate:
            misses = list(range(len(found)))
        hits = len(found) - len(misses)
        if hits:
            CACHE_LOOKUPS.labels(model.name, "hit").inc(hits)
        if misses:
            CACHE_LOOKUPS.labels(model.name, "miss").inc(len(misses))
        rows = np.empty((len(found), width), dtype=np.float32)
        num_tokens = np.empty(len(found), dtype=np.int64)
        for i, entry in enumerate(found):
            if entry is not None:
                rows[i], num_tokens[i] = entry.row, entry.num_tokens
        if misses:
            texts = inputs.texts if len(misses) == len(found) else [inputs.texts[i] for i in misses]
            result = await self.inference.run(model, Inputs(texts, None, inputs.direction, urgency=inputs.urgency),
                                              truncate=truncate, backend=backend, deadline=deadline)
            rows[misses], num_tokens[misses] = result.rows, result.num_tokens
            if epoch is not None:
                await store.put([(keys[i], pack(epoch, rows[i], int(num_tokens[i]))) for i in misses])
        return rows, check_lengths(model, num_tokens, truncate)

    def _identity(self, model: ServedModel, backend: Backend | None) -> bytes:
        endpoint = model.endpoint(backend)
        pipeline = self.inference.pipeline_of(model, endpoint)
        index = self.registry.index
        known = self._identities.get((model.name, endpoint.backend))
        if known is not None and known[0] is model and known[1] is index and known[2] == pipeline:
            return known[3]
        identity = model_identity(self.registry, model, endpoint, pipeline)
        self._identities[(model.name, endpoint.backend)] = (model, index, pipeline, identity)
        return identity

    async def invalidate(self, model: str) -> None:
        """Make every entry of `model` unreachable (an admin load, unload or reload of its family)."""
        if self.store is not None:
            await self.store.invalidate(model)

    async def close(self) -> None:
        if self.store is not None:
            await self.store.close()
