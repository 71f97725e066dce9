"""What every task's service shares: the request limits (GATEWAY_MAX_INPUTS, GATEWAY_MAX_INPUT_CHARS, and the
bounds on what one answer may hold: GATEWAY_MAX_TOKEN_VALUES, GATEWAY_MAX_TOKENIZE_TOKENS), the request deadline (GATEWAY_REQUEST_TIMEOUT_S), the model a request names, and the note of what a request is.

A service method takes a request's validated values (never an HTTP object), checks them in one order
(limits, then the model, then what the model allows) and returns plain results; the HTTP layer parses,
calls one method and shapes the answer (vLLM's OpenAIServing*, text-embeddings-inference's `Infer`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

from contract import Task, TruncationDirection
from gateway.errors import ErrorType, GatewayError
from gateway.service.admission import INTERACTIVE, Urgency
from gateway.service.registry import ServedModel
from gateway.service.runtime import Runtime

T = TypeVar("T")
# A model a request names (None: the only one served for the task), or one resolved already (the model of a
# URL path, whose 404 comes before any check of the body).
ModelRef = str | None | ServedModel


class Call(Protocol):
    """Where a service notes a request's model and input count as soon as they are known (the HTTP layer passes
    its request state: the access log and per-model metrics read them, also when the request fails)."""

    model: str
    inputs: int


class Service:
    """The limits, deadline and model resolution of one worker's requests (each task's service extends it)."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self.inference = runtime.inference
        settings = runtime.settings
        self.max_inputs = settings.max_inputs
        self.max_input_chars = settings.max_input_chars
        self.max_token_values = settings.max_token_values  # floats per answer of per-token vectors
        self.max_tokenize_tokens = settings.max_tokenize_tokens  # tokens per /tokenize answer
        self.timeout_s = settings.request_timeout_s

    def check_count(self, call: Call, count: int) -> None:
        """413 for more inputs than GATEWAY_MAX_INPUTS."""
        call.inputs = count
        if count > self.max_inputs:
            raise GatewayError(ErrorType.TOO_MANY_INPUTS, f"{count} inputs, over the limit of {self.max_inputs}")

    def check_texts(self, call: Call, texts: Sequence[str], *more: Sequence[str]) -> None:
        """413 for too many inputs (`texts` counts them) or a text over GATEWAY_MAX_INPUT_CHARS characters (tokens
        are checked after tokenization)."""
        self.check_count(call, len(texts))
        limit = self.max_input_chars
        for group in (texts, *more):
            for i, text in enumerate(group):
                if len(text) > limit:
                    raise GatewayError(ErrorType.INPUT_TOO_LONG, f"input {i} has {len(text)} characters, over the "
                                       f"limit of {limit}")

    def cut(self, texts: list[str], direction: TruncationDirection) -> list[str]:
        """Texts over GATEWAY_MAX_INPUT_CHARS characters cut there, from `direction`'s end (TEI's `truncate`:
        it cuts at 250 characters per token of max_input_length), where a refusal is not wanted."""
        limit = self.max_input_chars
        if all(len(t) <= limit for t in texts):
            return texts
        return [t if len(t) <= limit else t[:limit] if direction == "right" else t[-limit:] for t in texts]

    async def model(self, call: Call, ref: ModelRef, task: Task | None) -> ServedModel:
        """The model `ref` names, of `task` (None: any task); 404 when not served, 400 when it serves another
        task (or none is named and the choice is not one)."""
        if isinstance(ref, ServedModel):
            return ref
        model = await (self.runtime.model(ref, task) if task is not None else self.runtime.any_model(ref))
        call.model = model.name
        return model

    async def model_with(self, call: Call, name: str | None, has: Callable[[ServedModel], bool],
                         what: str) -> ServedModel:
        """The model a request names (any task: the service checks its outputs), or the only served model that
        `has` the output `what`."""
        if name is not None:
            return await self.model(call, name, None)
        runtime = self.runtime
        if runtime.registry.refresh_due():
            await runtime.refresh()
        candidates = [m for m in runtime.registry.models.values() if has(m)]
        if len(candidates) == 1:
            call.model = candidates[0].name
            return candidates[0]
        if not candidates:
            raise GatewayError(ErrorType.MODEL_NOT_FOUND, f"no model with {what} is served")
        raise GatewayError(ErrorType.MODEL_REQUIRED, f"several models with {what} are served "
                           f"({sorted(m.name for m in candidates)}): name one in `model`")

    def urgency(self, call: Call) -> Urgency:
        """How the request may wait (its lane, whether its deadline is its own), as the HTTP edge read it."""
        return getattr(call, "urgency", INTERACTIVE)

    async def within_deadline(self, call: Call, work: Callable[[float], Awaitable[T]]) -> T:
        """`work(deadline)` (time.monotonic()) done by the request's deadline (X-Request-Timeout, else
        GATEWAY_REQUEST_TIMEOUT_S from its arrival), or 504. Work whose deadline has passed is never started."""
        deadline = getattr(call, "deadline", None)
        if deadline is None:  # a call from elsewhere than the HTTP edge
            deadline = time.monotonic() + self.timeout_s
        try:
            async with asyncio.timeout(deadline - time.monotonic()):
                return await work(deadline)
        except TimeoutError:
            raise GatewayError(ErrorType.TIMEOUT, "the request's deadline passed (X-Request-Timeout, or "
                               f"{self.timeout_s:g}s without one)") from None
