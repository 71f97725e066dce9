"""The repository's tokenization rule before and after a change, side by side on the realistic corpus (issue 10).

    .venv/bin/python -m loadtest.experiments.tokenize_bench --before REV [--max-seq-len 512 128] [--rounds 15]

Loads contract/tokenization.py as it was at git revision REV and as it is now, builds both encoders
on the same tokenizer.json (loadtest/models.py's BERT vocabulary), checks that they give the same
ids and token counts, then times `encode` on requests of 1, 8 and 64 texts of the corpus
(loadtest/corpus.py length mix), alternating the two in every round so that machine noise hits
both alike. Prints a Markdown table of the median milliseconds per call and the ratio after/before.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from loadtest.corpus import CorpusSpec, make_corpus
from loadtest.models import make_bert

SIZES = (1, 8, 64)


def load_module(source: str, name: str) -> ModuleType:
    """A module from source text (the tokenization module imports only numpy and tokenizers)."""
    spec = importlib.util.spec_from_loader(name, loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and annotations look the module up
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)  # noqa: S102 - our own file at a git revision
    return module


def encoders(before: str, tokenizer_json: Path, max_seq_len: int) -> tuple[Any, Any]:
    old_source = subprocess.run(["git", "show", f"{before}:contract/tokenization.py"], check=True,
                                capture_output=True, text=True).stdout
    new_source = Path("contract/tokenization.py").read_text()
    old = load_module(old_source, "tokenization_before").TextEncoder.from_file(str(tokenizer_json), max_seq_len)
    new = load_module(new_source, "tokenization_after").TextEncoder.from_file(str(tokenizer_json), max_seq_len)
    return old, new


def same_result(a: Any, b: Any) -> bool:
    return (all(np.array_equal(x, y) for x, y in zip(a.ids, b.ids)) and np.array_equal(a.num_tokens, b.num_tokens)
            and len(a.ids) == len(b.ids))


def time_call(encoder: Any, texts: list[str]) -> float:
    start = time.perf_counter()
    encoder.encode(texts)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.experiments.tokenize_bench",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="git revision of the old contract/tokenization.py")
    parser.add_argument("--max-seq-len", type=int, nargs="+", default=[512, 128])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--corpus", type=int, default=2048)
    args = parser.parse_args(argv)
    texts = make_corpus(CorpusSpec(size=args.corpus))
    with tempfile.TemporaryDirectory() as tmp:
        model = make_bert(Path(tmp) / "bert", "embed", "small")
        tokenizer_json = model / "tokenizer.json"
        print(f"corpus {len(texts)} texts; rounds {args.rounds}; before = {args.before}\n")
        print("| max_seq_len | texts/call | truncated | before ms | after ms | after/before |")
        print("| --- | --- | --- | --- | --- | --- |")
        for max_seq_len in args.max_seq_len:
            old, new = encoders(args.before, tokenizer_json, max_seq_len)
            whole_old, whole_new = old.encode(texts), new.encode(texts)
            if not same_result(whole_old, whole_new):
                print(f"max_seq_len {max_seq_len}: before and after DIFFER", file=sys.stderr)
                return 1
            truncated = float((whole_new.num_tokens > max_seq_len).mean())
            for size in SIZES:
                calls = [texts[i : i + size] for i in range(0, min(len(texts), 64 * size), size)]
                times: dict[str, list[float]] = {"before": [], "after": []}
                for _ in range(args.rounds):
                    for label, encoder in (("before", old), ("after", new)):
                        times[label].append(sum(time_call(encoder, c) for c in calls) / len(calls))
                before = statistics.median(times["before"]) * 1e3
                after = statistics.median(times["after"]) * 1e3
                print(f"| {max_seq_len} | {size} | {truncated:.0%} | {before:.3f} | {after:.3f} | "
                      f"{after / before:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
