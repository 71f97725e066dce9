"""gateway/service/tokenization.py's TokenizerQueue on a real tokenizer: concurrent requests are tokenized together
off the event loop, each caller gets its own rows (as one encode of its texts gives them), a small request on an idle
tokenizer runs inline, failures reach their callers only, a caller that left does not stop the others, and the
draining thread takes what queued meanwhile in its next turn without the loop's help.

Each test that needs requests queued together holds the queue's first turn on a threading.Event (a `call` that waits
for it), queues the rest behind it, then lets it go: which requests share a turn does not depend on timing."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from contract.tokenization import EncodedTexts, TextEncoder
from gateway.service.tokenization import TokenizerQueue
from tests.fixtures.tiny_models import _save_tokenizer

TEXTS = ["hello world", "the quick brown fox", "", "jumps over the lazy dog", "café ünïcode"]
MAX_SEQ_LEN = 16


class CountingEncoder(TextEncoder):
    """A TextEncoder that records each encode call's texts and the thread it ran on."""

    def __init__(self, path: Path) -> None:
        super().__init__(TextEncoder.from_file(str(path), MAX_SEQ_LEN).tokenizer, MAX_SEQ_LEN)
        self.calls: list[tuple[list[str], int]] = []

    def encode(self, texts: list[str], pairs: list[str] | None = None, direction: str = "right") -> EncodedTexts:
        self.calls.append((list(texts), threading.get_ident()))
        return super().encode(texts, pairs, direction)


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("wordpiece")
    _save_tokenizer(directory)
    return directory / "tokenizer.json"


def rows(encoded: EncodedTexts) -> list[list[int]]:
    return [row.tolist() for row in encoded.ids]


def alone(tokenizer_file: Path, texts: list[str], pairs: list[str] | None = None,
          direction: str = "right") -> list[list[int]]:
    return rows(TextEncoder.from_file(str(tokenizer_file), MAX_SEQ_LEN).encode(texts, pairs, direction))


async def behind_a_held_turn(queue: TokenizerQueue, queue_more: Callable[[], list[asyncio.Future[Any]]],
                             while_held: Callable[[list[asyncio.Future[Any]]], None] = lambda queued: None
                             ) -> list[Any]:
    """Start a turn that waits for an event, queue `queue_more()` behind it (their tasks' first steps run while the
    turn is held), call `while_held` on them, let the turn go; the outcomes of what was queued (exceptions too)."""
    started, gate = threading.Event(), threading.Event()

    def hold() -> None:
        started.set()
        gate.wait(timeout=30)

    held = asyncio.ensure_future(queue.call(hold, queue.inline_chars + 1))  # too large to run inline
    assert await asyncio.to_thread(started.wait, 30)
    queued = queue_more()
    await asyncio.to_thread(lambda: None)  # the loop runs the queued tasks' first steps: each queues its job
    while_held(queued)
    gate.set()
    await held
    return list(await asyncio.gather(*queued, return_exceptions=True))


def test_concurrent_requests_are_tokenized_together_off_the_loop(tokenizer_file: Path) -> None:
    encoder = CountingEncoder(tokenizer_file)
    queue = TokenizerQueue(encoder, inline_chars=1024)
    results = asyncio.run(behind_a_held_turn(queue, lambda: [asyncio.ensure_future(queue.encode([t])) for t in TEXTS]))
    assert [rows(r) for r in results] == [alone(tokenizer_file, [t]) for t in TEXTS]
    assert [texts for texts, _ in encoder.calls] == [TEXTS]  # one encode_batch for the five requests
    assert encoder.calls[0][1] != threading.get_ident()  # not on the event loop's thread


def test_a_small_request_on_an_idle_tokenizer_runs_inline(tokenizer_file: Path) -> None:
    encoder = CountingEncoder(tokenizer_file)
    queue = TokenizerQueue(encoder, inline_chars=1024)
    assert rows(asyncio.run(queue.encode(["hello world"]))) == alone(tokenizer_file, ["hello world"])
    assert encoder.calls == [(["hello world"], threading.get_ident())]


def test_work_queued_while_a_turn_runs_goes_in_the_next_turn_without_the_loop(tokenizer_file: Path) -> None:
    """The loop is kept busy (blocked on a threading.Event) while the first turn ends: the thread still starts the
    next turn, and the loop then delivers both turns' results."""
    queue = TokenizerQueue(CountingEncoder(tokenizer_file), inline_chars=0)
    second_turn = threading.Event()

    def second() -> str:
        second_turn.set()
        return "second"

    async def main() -> list[Any]:
        started, gate = threading.Event(), threading.Event()

        def first() -> str:
            started.set()
            gate.wait(timeout=30)
            return "first"

        one = asyncio.ensure_future(queue.call(first, 1))
        assert await asyncio.to_thread(started.wait, 30)
        two = asyncio.ensure_future(queue.call(second, 1))
        three = asyncio.ensure_future(queue.encode(["the quick brown fox"]))
        await asyncio.to_thread(lambda: None)  # both queue behind the running turn
        assert not second_turn.is_set()
        gate.set()
        assert second_turn.wait(timeout=30)  # the event loop does nothing meanwhile
        return [await one, await two, await three]

    first, second_result, encoded = asyncio.run(main())
    assert (first, second_result) == ("first", "second")
    assert rows(encoded) == alone(tokenizer_file, ["the quick brown fox"])


def test_a_failure_reaches_its_callers_only_and_a_caller_that_left_stops_nobody(tokenizer_file: Path) -> None:
    encoder = CountingEncoder(tokenizer_file)
    queue = TokenizerQueue(encoder, inline_chars=1024)

    def fails() -> None:
        raise ValueError("bad ids")

    def queue_three() -> list[asyncio.Future[Any]]:
        return [asyncio.ensure_future(queue.encode(["left early"])), asyncio.ensure_future(queue.call(fails, 1)),
                asyncio.ensure_future(queue.encode(["hello world"]))]

    def leave(queued: list[asyncio.Future[Any]]) -> None:
        queued[0].cancel()  # queued already: its rows are encoded, its answer dropped

    async def main() -> tuple[list[Any], EncodedTexts]:
        outcomes = await behind_a_held_turn(queue, queue_three, leave)
        return outcomes, await queue.encode(["after"])  # the queue still serves

    (gone, failing, fine), after = asyncio.run(main())
    assert isinstance(gone, asyncio.CancelledError)
    assert isinstance(failing, ValueError) and str(failing) == "bad ids"
    assert isinstance(fine, EncodedTexts) and rows(fine) == alone(tokenizer_file, ["hello world"])
    assert rows(after) == alone(tokenizer_file, ["after"])
    assert [texts for texts, _ in encoder.calls][0] == ["left early", "hello world"]  # one turn, one encode_batch


def test_pairs_and_directions_are_encoded_apart_in_one_turn(tokenizer_file: Path) -> None:
    encoder = CountingEncoder(tokenizer_file)
    queue = TokenizerQueue(encoder, inline_chars=1024)
    long = " ".join(["word"] * 40)

    def queue_three() -> list[asyncio.Future[Any]]:
        return [asyncio.ensure_future(queue.encode([long], direction="left")),
                asyncio.ensure_future(queue.encode(["a query"], ["a passage"])),
                asyncio.ensure_future(queue.encode([long]))]

    left, pair, right = asyncio.run(behind_a_held_turn(queue, queue_three))
    assert rows(left) == alone(tokenizer_file, [long], direction="left")
    assert rows(pair) == alone(tokenizer_file, ["a query"], ["a passage"])
    assert rows(right) == alone(tokenizer_file, [long])
    assert rows(left) != rows(right)
    assert len(encoder.calls) == 3  # one encode_batch per kind, all in the turn after the held one


def test_a_callers_next_small_request_after_a_queued_one_runs_inline(tokenizer_file: Path) -> None:
    """The draining thread marks the tokenizer idle before the last turn's answers go out: a caller that sends a
    small request once it has its answer finds the tokenizer idle (test_peer_api's /tokenize after /decode)."""
    encoder = CountingEncoder(tokenizer_file)
    queue = TokenizerQueue(encoder, inline_chars=64)
    long = "word " * 40  # over inline_chars: queued, encoded in the thread

    async def main() -> None:
        for _ in range(20):
            await queue.encode([long])
            await queue.encode(["a"])

    asyncio.run(main())
    on_loop = [thread == threading.get_ident() for _, thread in encoder.calls]
    assert on_loop == [False, True] * 20
