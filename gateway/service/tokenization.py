"""The gateway's own tokenizer: the repository's tokenizer.json under the contract's rule.

The file is the one Triton serves (the repository is mounted here read-only); the tokenizer
config's `tokenizer_sha256` proves it, so the gateway never tokenizes with a stale copy.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
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


Outcome = tuple[asyncio.Future[Any], Any, BaseException | None]  # a waiting caller's future, its result or error


class TokenizerQueue:
    """Tokenizes for one model off the event loop: the texts of concurrent requests are encoded
    together by one `encode_batch` in a worker thread (the Rust tokenizer releases the GIL and
    runs on several cores), while the next requests gather behind it. The thread drains the queue
    itself, turn after turn, and hands each turn's results to the event loop in one callback: the
    loop spends no task and no wake-up on a turn, and the next turn does not wait for the loop.
    A small request that finds the tokenizer idle is encoded inline: at low load that is quicker
    than a thread hop. A very long request is encoded in a thread of its own, so that the short
    ones never wait behind it. Other work on the tokenizer (`call`: /tokenize, /decode) follows the
    same rule."""

    SOLO_CHARS = 32_768

    def __init__(self, encoder: TextEncoder, inline_chars: int) -> None:
        self.encoder = encoder
        self.inline_chars = inline_chars
        self._lock = threading.Lock()  # _waiting and _busy, shared by the event loop and the draining thread
        self._waiting: list[_Job | _Call] = []
        self._busy = False  # a thread is draining _waiting

    async def encode(self, texts: list[str], pairs: list[str] | None = None, direction: str = "right") -> EncodedTexts:
        """Token ids of `texts` (or of the pairs texts[i], pairs[i]) under the contract's rule."""
        chars = sum(map(len, texts)) + (sum(map(len, pairs)) if pairs is not None else 0)
        if chars > self.SOLO_CHARS:
            return await asyncio.to_thread(self.encoder.encode, texts, pairs, direction)
        if self._idle(chars):
            return self.encoder.encode(texts, pairs, direction)
        future: asyncio.Future[EncodedTexts] = asyncio.get_running_loop().create_future()
        self._enqueue(_Job(texts, pairs, direction, future))
        return await future

    async def call(self, work: Callable[[], T], chars: int) -> T:
        """`work()` (a call of the tokenizer over `chars` characters or ids) off the event loop, as `encode` runs:
        inline when small and the tokenizer is idle, in a thread of its own when very large, else in turn."""
        if chars > self.SOLO_CHARS:
            return await asyncio.to_thread(work)
        if self._idle(chars):
            return work()
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._enqueue(_Call(work, future))
        return await future

    def _idle(self, chars: int) -> bool:
        """Whether work of `chars` characters runs inline: small, and nothing queued or running. Read without the
        lock: only this (the loop's) thread queues work or starts a drain; the draining thread only empties the
        queue and stops, which can only turn False into True."""
        return chars <= self.inline_chars and not self._busy and not self._waiting

    def _enqueue(self, job: _Job | _Call) -> None:
        """Queue `job`; start a draining thread if none runs."""
        with self._lock:
            self._waiting.append(job)
            if self._busy:
                return
            self._busy = True
        loop = asyncio.get_running_loop()
        try:
            loop.run_in_executor(None, self._drain, loop)
        except BaseException:  # e.g. the executor is shut down: this job is not queued
            with self._lock:  # nothing else was queued: the queue was empty when no thread ran
                self._waiting.remove(job)
                self._busy = False
            raise

    def _drain(self, loop: asyncio.AbstractEventLoop) -> None:
        """In a worker thread: turn after turn, take what waits, encode it, hand the results to the loop; stop when
        nothing waits. The last turn marks the tokenizer idle before its results go out, so that a caller's next
        small request, sent once it has its answer, is tokenized inline."""
        with self._lock:
            jobs, self._waiting = self._waiting, []
            if not jobs:
                self._busy = False
                return
        while jobs:
            try:
                outcomes = self._turn(jobs)
            except Exception as exc:  # noqa: BLE001 - _turn answers failures; a bug must not leave callers waiting
                outcomes = [(job.future, None, exc) for job in jobs]
            with self._lock:
                jobs, self._waiting = self._waiting, []
                if not jobs:
                    self._busy = False  # from here the loop may start another drain
            try:
                loop.call_soon_threadsafe(_deliver, outcomes)
            except RuntimeError:  # the loop is closed (nothing can queue any more): nobody waits for these
                with self._lock:
                    self._waiting.clear()
                    self._busy = False
                return

    def _turn(self, jobs: list[_Job | _Call]) -> list[Outcome]:
        """One turn's outcomes: one encode_batch per kind of job (texts or pairs, truncation direction), then the
        calls, in order."""
        outcomes: list[Outcome] = []
        groups: dict[tuple[bool, str], list[_Job]] = {}
        for job in jobs:
            if isinstance(job, _Job):
                groups.setdefault(job.kind, []).append(job)
        for group in groups.values():
            outcomes += self._encode_group(group)
        for call in jobs:
            if isinstance(call, _Call):
                try:
                    outcomes.append((call.future, call.work(), None))
                except Exception as exc:  # noqa: BLE001 - its caller hears about it
                    outcomes.append((call.future, None, exc))
        return outcomes

    def _encode_group(self, jobs: list[_Job]) -> list[Outcome]:
        texts = [t for job in jobs for t in job.texts]
        pairs = [p for job in jobs for p in job.pairs or ()] if jobs[0].pairs is not None else None
        try:
            encoded = self.encoder.encode(texts, pairs, jobs[0].direction)
        except Exception as exc:  # noqa: BLE001 - every request of the group must hear about it
            return [(job.future, None, exc) for job in jobs]
        outcomes: list[Outcome] = []
        start = 0
        for job in jobs:
            part = slice(start, start + len(job.texts))
            start += len(job.texts)
            types = encoded.type_ids[part] if encoded.type_ids is not None else None
            outcomes.append((job.future, EncodedTexts(encoded.ids[part], types, encoded.num_tokens[part]), None))
        return outcomes


def _deliver(outcomes: list[Outcome]) -> None:
    """On the event loop: each waiting caller gets its result or error (one that gave up meanwhile, nothing)."""
    for future, result, error in outcomes:
        if future.done():
            continue
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
