"""What both inference pipelines share: a request's inputs, its result, the interface the services call
through, and the rules every pipeline applies the same way (billed tokens, batches in flight)."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from contract import TruncationDirection
from gateway.errors import ErrorType, GatewayError, invalid
from gateway.service.admission import INTERACTIVE, Backlog, Urgency
from gateway.service.registry import Endpoint, ServedModel
from gateway.service.batch_queue import Outputs
from gateway.service.tokenization import TokenizerQueue
from gateway.settings import GatewaySettings

log = logging.getLogger("gateway.inference")


@dataclass(frozen=True)
class Inputs:
    """What one request infers: texts, or text pairs, or texts given as token ids (no special tokens), and how it
    may wait."""

    texts: list[str]
    pairs: list[str] | None = None  # second texts of pairs, one per text
    direction: TruncationDirection = "right"  # which end of an over-long input is cut off
    token_ids: list[list[int]] | None = None  # instead of texts: the model's own token ids
    urgency: Urgency = INTERACTIVE

    def __len__(self) -> int:
        return len(self.token_ids) if self.token_ids is not None else len(self.texts)


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
        texts = [output for output in self.outputs if isinstance(output, np.ndarray)]
        if len(texts) != len(self.outputs):
            raise RuntimeError("a text's output is missing or holds several outputs")
        return texts

    @property
    def per_text_outputs(self) -> list[tuple[np.ndarray, ...]]:
        """The outputs of a call that asked for several, text by text: one array per output, in the order asked."""
        texts = [output for output in self.outputs if isinstance(output, tuple)]
        if len(texts) != len(self.outputs):
            raise RuntimeError("a text's outputs are missing")
        return texts


class Pipeline(Protocol):
    """One way requests run: the endpoints it serves, their admission backlog and tokenizer, and the run."""

    name: str  # "scheduler" or "ensemble" (the catalog shows it)

    def serves(self, endpoint: Endpoint) -> bool:
        """Whether requests for `endpoint` run here."""
        ...

    async def run(
        self, model: ServedModel, endpoint: Endpoint, inputs: Inputs, *, truncate: bool, deadline: float
    ) -> BatchResult:
        """Infer all `inputs` of one request by `deadline` (time.monotonic())."""
        ...

    def backlog(self, endpoint: Endpoint) -> Backlog | None:
        """The admission backlog requests for `endpoint` meet (None before it has one)."""
        ...

    def tokenizer(self, model: ServedModel, endpoint: Endpoint) -> TokenizerQueue | None:
        """The tokenizer the gateway runs for `model` (None when it cannot read the model's)."""
        ...

    async def sync(self, served: list[tuple[ServedModel, Endpoint]]) -> set[str]:
        """Take the endpoints among `served` this pipeline can serve, drop what went: the shm pools it keeps."""
        ...

    async def close(self) -> None: ...


def check_lengths(model: ServedModel, num_tokens: np.ndarray, truncate: bool) -> int:
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


AUTO_BATCHES_IN_FLIGHT = {"GPU": 2, "CPU": 1}  # per instance: GATEWAY_MAX_BATCHES_IN_FLIGHT=auto


def batches_in_flight(settings: GatewaySettings, endpoint: Endpoint) -> int:
    """Batches one worker keeps in flight to a step: GATEWAY_MAX_BATCHES_IN_FLIGHT per instance Triton runs of
    the step (`auto`: by the step's device), shared by the gateway's workers whatever their count."""
    per_instance = settings.max_batches_in_flight
    if per_instance == "auto":
        per_instance = AUTO_BATCHES_IN_FLIGHT["GPU" if endpoint.step_on_gpu else "CPU"]
    return max(1, math.ceil(per_instance * endpoint.step_instances / settings.worker_count))


@contextmanager
def endpoint_setup(model: ServedModel, endpoint: Endpoint) -> Iterator[None]:
    """Around one endpoint's set-up in a sync: Triton unavailable (a GatewayError) fails the sync as a whole;
    any other trouble is logged, and the endpoint's tensors go over plain gRPC."""
    try:
        yield
    except GatewayError:
        raise
    except Exception:  # noqa: BLE001 - one endpoint's trouble must not stop the others
        log.exception("%s: could not set up shared memory for %s; its tensors go over plain gRPC",
                      model.name, endpoint.triton_model)
