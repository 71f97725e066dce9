"""gateway/service/tokenization.py's TokenizerQueue on a real tokenizer: concurrent requests are tokenized together
off the event loop, each caller gets its own rows (as one encode of its texts gives them), a small request on an idle
tokenizer runs inline, failures reach their callers only, a caller that left does not stop the others, and the
draining thread takes what queued meanwhile in its next turn without the loop's help."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

from contract.tokenization import EncodedTexts, TextEncoder
from gateway.service.tokenization import TokenizerQueue
from tests.fixtures.tiny_models import _save_tokenizer

TEXTS = ["hello world", "the quick brown fox", "", "jumps over the lazy dog", "café ünïcode"]


class CountingEncoder(TextEncoder):
    """A TextEncoder that records each encode call's texts and the thread it ran on."""

    def __init__(self, path: Path) -> None:
        super().__init__(TextEncoder.from_file(str(path), 16).tokenizer, 16)
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


def test_concurrent_requests_are_tokenized_together_off_the_loop(tokenizer_file: Path) -> None:
    encoder = CountingEncoder(tokenizer_file)
    queue = TokenizerQueue(encoder, inline_chars=0)  # never inline: every request queues
    expected = [rows(TextEncoder.from_file(str(tokenizer_file), 16).encode([t])) for t in TEXTS]

    async def main() -> list[EncodedTexts]:
        return await asyncio.gather(*(queue.encode([t]) for t in TEXTS))

    loop_thread = threading.get_ident()
    results = asyncio.run(main())
    assert [rows(r) for r in results] == expected
    assert all(thread != loop_thread for _, thread in encoder.calls)
    assert sum(len(texts) for texts, _ in encoder.calls) == len(TEXTS)
    assert len(encoder.calls) < len(TEXTS)  # queued behind the first turn, the rest went in one encode_batch


def test_a_small_request_on_an_idle_tokenizer_runs_inline(tokenizer_file: Path) -> None:
    encoder = CountingEncoder(tokenizer_file)
    queue = TokenizerQueue(encoder, inline_chars=1024)
    loop_thread = threading.get_ident()
    assert rows(asyncio.run(queue.encode(["hello world"]))) == rows(TextEncoder.from_file(str(tokenizer_file), 16)
                                                                     .encode(["hello world"]))
    assert encoder.calls == [(["hello world"], loop_thread)]


def test_work_queued_while_a_turn_runs_goes_in_the_next_turn_without_the_loop(tokenizer_file: Path) -> None:
    """The loop is kept busy (blocked on a threading.Event, not asleep) while the first turn ends: the thread
    still starts the next turn, and the loop then delivers both turns' results."""
    encoder = CountingEncoder(tokenizer_file)
    queue = TokenizerQueue(encoder, inline_chars=0)
    first_started, release_first, second_turn = threading.Event(), threading.Event(), threading.Event()

    def first() -> str:
        first_started.set()
        release_first.wait(timeout=30)
        return "first"

    def second() -> str:
        second_turn.set()
        return "second"

    async def main() -> tuple[str, str, EncodedTexts]:
        one = asyncio.ensure_future(queue.call(first, 1))
        assert await asyncio.to_thread(first_started.wait, 30)  # queued, and its turn runs
        two = asyncio.ensure_future(queue.call(second, 1))
        three = asyncio.ensure_future(queue.encode(["the quick brown fox"]))
        await asyncio.to_thread(lambda: None)  # the loop runs the two tasks' first steps: both queue
        assert not second_turn.is_set()
        release_first.set()
        # the event loop does nothing until the thread has started the next turn on its own
        assert second_turn.wait(timeout=30)
        return await one, await two, await three

    a, b, c = asyncio.run(main())
    assert (a, b) == ("first", "second")
    assert rows(c) == rows(TextEncoder.from_file(str(tokenizer_file), 16).encode(["the quick brown fox"]))


def test_a_failure_reaches_its_callers_only_and_a_caller_that_left_stops_nobody(tokenizer_file: Path) -> None:
    encoder = CountingEncoder(tokenizer_file)
    queue = TokenizerQueue(encoder, inline_chars=0)

    def fails() -> None:
        raise ValueError("bad ids")

    async def main() -> list[object]:
        gone = asyncio.ensure_future(queue.encode(["left early"]))
        failing = asyncio.ensure_future(queue.call(fails, 1))
        fine = asyncio.ensure_future(queue.encode(["hello world"]))
        gone.cancel()
        results = await asyncio.gather(gone, failing, fine, return_exceptions=True)
        assert await queue.encode(["after"])  # the queue still serves
        return results

    gone, failing, fine = asyncio.run(main())
    assert isinstance(gone, asyncio.CancelledError)
    assert isinstance(failing, ValueError) and str(failing) == "bad ids"
    assert isinstance(fine, EncodedTexts) and rows(fine) == rows(
        TextEncoder.from_file(str(tokenizer_file), 16).encode(["hello world"]))


def test_pairs_and_directions_are_encoded_apart_in_one_turn(tokenizer_file: Path) -> None:
    encoder = CountingEncoder(tokenizer_file)
    queue = TokenizerQueue(encoder, inline_chars=0)
    oracle = TextEncoder.from_file(str(tokenizer_file), 16)
    long = " ".join(["word"] * 40)

    async def main() -> list[EncodedTexts]:
        return await asyncio.gather(queue.encode([long], direction="left"), queue.encode(["a query"], ["a passage"]),
                                    queue.encode([long]))

    left, pair, right = asyncio.run(main())
    assert rows(left) == rows(oracle.encode([long], direction="left"))
    assert rows(pair) == rows(oracle.encode(["a query"], ["a passage"]))
    assert rows(right) == rows(oracle.encode([long]))
    assert rows(left) != rows(right)
