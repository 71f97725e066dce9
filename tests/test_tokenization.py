"""contract/tokenization.py's TextEncoder against transformers' tokenizers (the oracle): ids, token type ids and
lengths before truncation, for one text and for batches, cut from either side, on a WordPiece (BERT) and a
Unigram (XLM-R) tokenizer; and the same through a `tokenizers` without `encode_batch_fast` (older Triton images)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tokenizers import Tokenizer
from transformers import AutoTokenizer

from contract.tokenization import TextEncoder
from tests.fixtures.tiny_models import _save_tokenizer, _save_unigram_tokenizer, long_text

MAX_SEQ_LEN = 24
TEXTS = ["hello world", "Héllo, WORLD! ünïcode café 😀", "", long_text(60, seed=1), "the quick brown fox",
         long_text(40, seed=2)]


class OlderTokenizer:
    """A Tokenizer as a `tokenizers` before 0.21 offers it: no encode_batch_fast."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer

    def __getattr__(self, name: str) -> Any:
        if name == "encode_batch_fast":
            raise AttributeError(name)
        return getattr(self._tokenizer, name)


@pytest.fixture(scope="module", params=["wordpiece", "unigram"])
def tokenizer_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp(request.param)
    if request.param == "wordpiece":
        _save_tokenizer(directory)
    else:
        _save_unigram_tokenizer(directory, 512)
    return directory


@pytest.mark.parametrize("older", [False, True], ids=["encode_batch_fast", "encode_batch"])
@pytest.mark.parametrize("direction", ["right", "left"])
@pytest.mark.parametrize("batch", [1, len(TEXTS)])
def test_encoder_equals_transformers(tokenizer_dir: Path, older: bool, direction: str, batch: int) -> None:
    tokenizer: Any = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    encoder = TextEncoder(OlderTokenizer(tokenizer) if older else tokenizer, MAX_SEQ_LEN)
    oracle = AutoTokenizer.from_pretrained(tokenizer_dir, truncation_side=direction)
    for start in range(0, len(TEXTS), batch):
        texts = TEXTS[start:start + batch]
        encoded = encoder.encode(texts, direction=direction)
        expected = oracle(texts, truncation=True, max_length=MAX_SEQ_LEN, return_token_type_ids=True)
        assert [row.tolist() for row in encoded.ids] == expected["input_ids"]
        types = encoded.type_ids or [np.zeros(len(row), np.int32) for row in encoded.ids]
        assert [row.tolist() for row in types] == expected["token_type_ids"]
        assert encoded.num_tokens.tolist() == [len(ids) for ids in oracle(texts)["input_ids"]]
    assert any(n > MAX_SEQ_LEN for n in encoder.encode(TEXTS).num_tokens)  # the cut is exercised
