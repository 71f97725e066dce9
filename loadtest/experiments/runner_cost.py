"""The packed step's python runner on its own: µs of its Python per execute(), without onnxruntime's work.

    .venv/bin/python -m loadtest.experiments.runner_cost [--calls 2000] [--max-seq-len 512] [--runner FILE]

Loads builder/triton_models/packed_runner.py as the python backend's stub does (`packing` is the repository's copy
of contract/packing.py). The stub's `triton_python_backend_utils` is replaced by the few plain classes the runner
calls (input tensors, output tensors, responses), and onnxruntime by a session that returns zeros of the output's
shape. So this times only what the runner does around session.run: checking each request, merging, cutting runs,
filling, the index tensors, the outputs per request. It does not time Triton's or the python backend's IPC.

Requests are packed ones as the gateway's scheduler sends them: rows of the corpus's length mix
(loadtest/corpus.py, through loadtest/models.py's BERT tokenizer), back to back. Prints a Markdown table of µs per
execute() (median of 5 rounds) for a few (requests, rows each) shapes.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

import contract.packing as packing
from loadtest.corpus import CorpusSpec, make_corpus
from tests.fixtures.python_backend import Request, stand_in_utils

RUNNER = Path(__file__).resolve().parents[2] / "builder" / "triton_models" / "packed_runner.py"
SHAPES = ((1, 1), (1, 8), (2, 8), (4, 8), (1, 32))  # (requests per execute, rows per request)
HIDDEN = 768


class _Input:
    def __init__(self, name: str) -> None:
        self.name = name


class _ZeroSession:
    """onnxruntime's part taken out: session.run answers zeros [rows, HIDDEN]."""

    def get_inputs(self) -> list[_Input]:
        return [_Input(name) for name in packing.GRAPH_INPUTS]

    def run(self, names: list[str], feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        return [np.zeros((len(feed[packing.CU_SEQLENS]) - 1, HIDDEN), np.float32)]


def load_runner(path: Path = RUNNER) -> ModuleType:
    """packed_runner.py (`path`) with `packing` and a stand-in `triton_python_backend_utils` in sys.modules."""
    sys.modules["packing"] = packing
    sys.modules["triton_python_backend_utils"] = stand_in_utils()
    spec = importlib.util.spec_from_file_location("packed_runner_cost", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def corpus_rows(count: int, max_seq_len: int) -> tuple[list[np.ndarray], int]:
    """Token ids of `count` corpus texts (loadtest/models.py's BERT tokenizer, truncated at max_seq_len), and the
    tokenizer's vocabulary size."""
    from tokenizers import Tokenizer

    from loadtest.models import make_bert

    with tempfile.TemporaryDirectory() as tmp:
        model = make_bert(Path(tmp) / "model", "embed", "small")
        tokenizer = Tokenizer.from_file(str(model / "tokenizer.json"))
    tokenizer.enable_truncation(max_seq_len)
    texts = make_corpus(CorpusSpec(size=count))
    return [np.asarray(e.ids, np.int32) for e in tokenizer.encode_batch(texts)], tokenizer.get_vocab_size()


def _request(rows: list[np.ndarray]) -> Request:
    part = packing.from_rows(rows)
    return Request(input_ids=part.input_ids[None], token_type_ids=part.token_type_ids[None],
                   cu_seqlens=part.cu_seqlens[None])


def _time(steps: Any, calls_in: list[Request], calls: int) -> float:
    """µs per steps(calls_in), median of 5 rounds of `calls`."""
    for _ in range(50):
        steps(calls_in)
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            steps(calls_in)
        rounds.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(rounds)


def measure(calls: int, max_seq_len: int, path: Path = RUNNER) -> list[tuple[str, int, float]]:
    """(requests x rows each, tokens per execute, µs per execute median of 5 rounds) for each of SHAPES, then for a
    lone short text that a one-row CUDA graph covers (the graph's call answers zeros: its own cost is lone_step's)."""
    runner = load_runner(path)
    rows, vocab = corpus_rows(400, max_seq_len)
    steps: Any = runner.PackedSteps(_ZeroSession(), ["embeddings"], 16384, max_seq_len, (vocab, 2), fill=True)
    out = []
    for requests, per_request in SHAPES:
        batch = [rows[(k * per_request + i) % len(rows)] for k in range(requests) for i in range(per_request)]
        calls_in = [_request(batch[k * per_request:(k + 1) * per_request]) for k in range(requests)]
        out.append((f"{requests} x {per_request}", sum(len(r) for r in batch), _time(steps, calls_in, calls)))

    class ZeroGraphs(runner.OneRowGraphs):  # type: ignore[name-defined,misc]
        def __call__(self, feed: dict[str, np.ndarray], tokens: int) -> np.ndarray:
            return np.zeros((1, HIDDEN), np.float32)

    steps.graphs = ZeroGraphs(None, "embeddings", runner.GRAPH_MAX_TOKENS)
    short = next(r for r in rows if len(r) <= 16)
    out.append((f"1 x 1, a lone text of {len(short)} tokens, graphed", len(short), _time(steps, [_request([short])],
                                                                                       calls)))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.experiments.runner_cost",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="execute() calls per round")
    parser.add_argument("--max-seq-len", type=int, default=512)
    parser.add_argument("--runner", type=Path, default=RUNNER, help="the packed_runner.py to time (e.g. an older one "
                        "from `git show REV:builder/triton_models/packed_runner.py`)")
    args = parser.parse_args(argv)
    print("| requests x rows | tokens | µs per execute() |\n| --- | ---: | ---: |")
    for label, tokens, micros in measure(args.calls, args.max_seq_len, args.runner):
        print(f"| {label} | {tokens} | {micros:.1f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
