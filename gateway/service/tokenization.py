"""The gateway's own tokenizer: the repository's tokenizer.json under the contract's rule.

The file is the one Triton serves (the repository is mounted here read-only); the tokenizer
config's `tokenizer_sha256` proves it, so the gateway never tokenizes with a stale copy.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from tokenizers import Tokenizer

from contract import TOKENIZER_FILE
from contract.tokenization import EncodedTexts, TextEncoder
from gateway.service.registry import ServedModel

log = logging.getLogger("gateway.tokenization")


class TokenizerUnavailable(Exception):
    """Why the gateway cannot tokenize for a model itself (it then uses the model's ensemble)."""


def tokenizer_bytes(repository: Path, tokenizer_model: str, sha256: str = "") -> tuple[Path, bytes]:
    """tokenizer.json of `tokenizer_model`: the newest version directory whose file has `sha256` (the one
    Triton serves: a newer version may be published and not loaded yet, or an older one be served on
    purpose), or the newest one when no hash is known."""
    folder = repository / tokenizer_model
    versions = sorted((int(p.name) for p in folder.iterdir() if p.name.isdigit()), reverse=True) if folder.is_dir() else []
    found = False
    for version in versions:
        candidate = folder / str(version) / TOKENIZER_FILE
        if candidate.is_file():
            found = True
            data = candidate.read_bytes()
            if not sha256 or hashlib.sha256(data).hexdigest() == sha256:
                return candidate, data
    if found:
        raise TokenizerUnavailable(f"no {TOKENIZER_FILE} under {folder} is the one Triton serves (sha256 mismatch)")
    raise TokenizerUnavailable(f"no {TOKENIZER_FILE} under {folder}")


def load_encoder(repository: str, model: ServedModel) -> TextEncoder:
    """The model's tokenizer, checked against the hash its Triton config records."""
    if not repository:
        raise TokenizerUnavailable("GATEWAY_REPOSITORY is not set")
    if model.tokenizer is None:
        raise TokenizerUnavailable("its ensemble does not name a tokenizer model and a model step")
    _, data = tokenizer_bytes(Path(repository), model.tokenizer.triton_model, model.tokenizer.sha256)
    return TextEncoder(Tokenizer.from_str(data.decode("utf-8")), model.max_seq_len)


T = TypeVar("T")


class _Call:
    """Other work on the tokenizer (/tokenize, /decode), run in its turn."""

    __slots__ = ("work", "future")

    def __init__(self, work: Callable[[], Any], future: asyncio.Future[Any]) -> None:
        self.work, self.future = work, future


class _Job:
    __slots__ = ("texts", "pairs", "direction", "future")

    def __init__(self, texts: list[str], pairs: list[str] | None, direction: str,
                 future: asyncio.Future[EncodedTexts]) -> None:
        self.texts, self.pairs, self.direction, self.future = texts, pairs, direction, future

    @property
    def kind(self) -> tuple[bool, str]:
        return self.pairs is not None, self.direction


class TokenizerQueue:
    """Tokenizes for one model off the event loop: the texts of concurrent requests are encoded
    together by one `encode_batch` in a worker thread (the Rust tokenizer releases the GIL and
    runs on several cores), while the next requests gather behind it. A small request that finds
    the tokenizer idle is encoded inline: at low load that is quicker than a thread hop. A very long
    request is encoded in a thread of its own, so that the short ones never wait behind it. Other work
    on the tokenizer (`call`: /tokenize, /decode) follows the same rule."""

    SOLO_CHARS = 32_768

    def __init__(self, encoder: TextEncoder, inline_chars: int) -> None:
        self.encoder = encoder
        self.inline_chars = inline_chars
        self._waiting: list[_Job | _Call] = []
        self._busy = False

    async def encode(self, texts: list[str], pairs: list[str] | None = None, direction: str = "right") -> EncodedTexts:
        """Token ids of `texts` (or of the pairs texts[i], pairs[i]) under the contract's rule."""
        chars = sum(map(len, texts)) + (sum(map(len, pairs)) if pairs is not None else 0)
        if chars > self.SOLO_CHARS:
            return await asyncio.to_thread(self.encoder.encode, texts, pairs, direction)
        if not self._busy and not self._waiting and chars <= self.inline_chars:
            return self.encoder.encode(texts, pairs, direction)
        future: asyncio.Future[EncodedTexts] = asyncio.get_running_loop().create_future()
        self._waiting.append(_Job(texts, pairs, direction, future))
        if not self._busy:
            self._next()
        return await future

    async def call(self, work: Callable[[], T], chars: int) -> T:
        """`work()` (a call of the tokenizer over `chars` characters or ids) off the event loop, as `encode` runs:
        inline when small and the tokenizer is idle, in a thread of its own when very large, else in turn."""
        if chars > self.SOLO_CHARS:
            return await asyncio.to_thread(work)
        if not self._busy and not self._waiting and chars <= self.inline_chars:
            return work()
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._waiting.append(_Call(work, future))
        if not self._busy:
            self._next()
        return await future

    def _next(self) -> None:
        jobs, self._waiting = self._waiting, []
        self._busy = True
        asyncio.get_running_loop().create_task(self._run(jobs))

    async def _run(self, jobs: list[_Job | _Call]) -> None:
        try:
            groups: dict[tuple[bool, str], list[_Job]] = {}
            for job in jobs:  # one encode_batch per kind: texts or pairs, truncation direction
                if isinstance(job, _Job):
                    groups.setdefault(job.kind, []).append(job)
            for group in groups.values():
                await self._encode_group(group)
            for call in jobs:
                if isinstance(call, _Call):
                    await self._call(call)
        except Exception as exc:  # noqa: BLE001 - every waiting request must hear about it
            for job in jobs:
                if not job.future.done():
                    job.future.set_exception(exc)
        finally:
            self._busy = False
            if self._waiting:
                self._next()

    @staticmethod
    async def _call(call: _Call) -> None:
        try:
            result = await asyncio.to_thread(call.work)
        except Exception as exc:  # noqa: BLE001 - its caller hears about it
            if not call.future.done():
                call.future.set_exception(exc)
            return
        if not call.future.done():
            call.future.set_result(result)

    async def _encode_group(self, jobs: list[_Job]) -> None:
        texts = [t for job in jobs for t in job.texts]
        pairs = [p for job in jobs for p in job.pairs or ()] if jobs[0].pairs is not None else None
        encoded = await asyncio.to_thread(self.encoder.encode, texts, pairs, jobs[0].direction)
        start = 0
        for job in jobs:
            part = slice(start, start + len(job.texts))
            start += len(job.texts)
            if not job.future.done():
                types = encoded.type_ids[part] if encoded.type_ids is not None else None
                job.future.set_result(EncodedTexts(encoded.ids[part], types, encoded.num_tokens[part]))
