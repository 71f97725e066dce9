"""The tokenizer-split experiment's sitecustomize: with TOKENIZER_SPLIT_TEXTS, a large `TextEncoder.encode` is cut
over threads and gives exactly what one call gives (ids, type ids, counts before truncation); without it, nothing is
patched."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer

from contract.tokenization import TextEncoder
from tests.fixtures.experiments import probe_with_experiment
from tests.fixtures.tiny_models import _save_tokenizer

MAX_SEQ_LEN = 24
TEXTS = [f"text number {i} " + "tokens go on " * (i % 9) for i in range(37)]  # some over MAX_SEQ_LEN
PAIRS = [f"its pair {i} " + "more " * (i % 7) for i in range(37)]

PROBE = """
import json, threading
import contract.tokenization as tokenization
from tokenizers import Tokenizer
path, texts, pairs = json.load(open({args!r}))
encoder = tokenization.TextEncoder(Tokenizer.from_file(path), {max_seq_len})
threads = set()
encode_rows = tokenization._encode
def watched(tokenizer, inputs):
    threads.add(threading.current_thread().name.split("_")[0])
    return encode_rows(tokenizer, inputs)
tokenization._encode = watched
def plain(e):
    return [[r.tolist() for r in e.ids], None if e.type_ids is None else [r.tolist() for r in e.type_ids],
            e.num_tokens.tolist()]
print(json.dumps({{"patched": tokenization.TextEncoder.encode.__name__, "texts": plain(encoder.encode(texts)),
                  "pairs": plain(encoder.encode(texts, pairs)), "few": plain(encoder.encode(texts[:3])),
                  "threads": sorted(threads)}}))
"""


def plain(encoded: object) -> list[object]:
    ids, types, counts = encoded.ids, encoded.type_ids, encoded.num_tokens  # type: ignore[attr-defined]
    return [[r.tolist() for r in ids], None if types is None else [r.tolist() for r in types], counts.tolist()]


def run(tmp_path: Path, split: str | None) -> dict[str, object]:
    _save_tokenizer(tmp_path)
    args = tmp_path / "args.json"
    args.write_text(json.dumps([str(tmp_path / "tokenizer.json"), TEXTS, PAIRS]))
    out = probe_with_experiment("tokenizer_split", "TOKENIZER_SPLIT_TEXTS", split,
                                PROBE.format(args=str(args), max_seq_len=MAX_SEQ_LEN))
    return json.loads(out)


def test_a_split_call_gives_what_one_call_gives_and_runs_on_the_split_threads(tmp_path: Path) -> None:
    result = run(tmp_path, "16")
    encoder = TextEncoder(Tokenizer.from_file(str(tmp_path / "tokenizer.json")), MAX_SEQ_LEN)
    assert result["patched"] == "split_encode"
    assert result["texts"] == plain(encoder.encode(TEXTS))
    assert result["pairs"] == plain(encoder.encode(TEXTS, PAIRS))
    assert result["few"] == plain(encoder.encode(TEXTS[:3]))
    assert max(result["texts"][2]) > MAX_SEQ_LEN  # type: ignore[index]  # the cut is exercised
    assert result["pairs"][1] is not None  # type: ignore[index]  # pairs carry type ids
    assert result["threads"] == ["MainThread", "tokenizer-split"]


def test_without_the_variable_nothing_is_patched(tmp_path: Path) -> None:
    result = run(tmp_path, None)
    assert result["patched"] == "encode"
    assert result["threads"] == ["MainThread"]
