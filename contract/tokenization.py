"""Text -> token ids, exactly as the repository defines it; shared by the gateway and Triton's tokenizer.

The builder copies this file next to the tokenizer's model.py in the repository, so the
python-backend tokenizer (ensemble path) and the gateway (scheduler path) run the same code on
the same tokenizer.json: only numpy and `tokenizers` may be imported here.

Rules (docs/contract.md): special tokens are added; a text longer than `max_seq_len` keeps its
first tokens and its trailing special tokens (what Hugging Face's truncation does for one
sequence); `num_tokens` is the length before truncation.
"""

from __future__ import annotations

import numpy as np
from tokenizers import Encoding, Tokenizer


def clean_text(text: str) -> str:
    """`text` with lone surrogates (not encodable as UTF-8) replaced by U+FFFD."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


class EncodedTexts:
    """Token ids of several texts (truncated), their token type ids, and lengths before truncation."""

    __slots__ = ("ids", "type_ids", "num_tokens")

    def __init__(self, ids: list[np.ndarray], type_ids: list[np.ndarray] | None, num_tokens: np.ndarray) -> None:
        self.ids = ids  # int32 per text, at most max_seq_len long
        self.type_ids = type_ids  # int32 per text, or None when every type id is 0
        self.num_tokens = num_tokens  # int32 [n], before truncation

    def __len__(self) -> int:
        return len(self.ids)

    def padded(self, width: int, pad_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """input_ids, attention_mask, token_type_ids as int32 [n, width], right-padded."""
        n = len(self.ids)
        lengths = np.fromiter((len(i) for i in self.ids), dtype=np.int64, count=n)
        mask = np.arange(width) < lengths[:, None]
        input_ids = np.full((n, width), pad_id, dtype=np.int32)
        input_ids[mask] = np.concatenate(self.ids) if n else np.empty(0, np.int32)
        types = np.zeros((n, width), dtype=np.int32)
        if self.type_ids is not None:
            types[mask] = np.concatenate(self.type_ids)
        return input_ids, mask.astype(np.int32), types


class TextEncoder:
    """A `tokenizers.Tokenizer` applying the repository's truncation rule."""

    def __init__(self, tokenizer: Tokenizer, max_seq_len: int) -> None:
        self.tokenizer = tokenizer
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        self.max_seq_len = max_seq_len

    @classmethod
    def from_file(cls, path: str, max_seq_len: int) -> "TextEncoder":
        return cls(Tokenizer.from_file(path), max_seq_len)

    def encode(self, texts: list[str]) -> EncodedTexts:
        """Tokenize `texts` (one call; several texts run in parallel in Rust)."""
        if len(texts) == 1:
            encodings = [self._encode_one(texts[0])]
        else:
            try:
                encodings = self.tokenizer.encode_batch(texts, add_special_tokens=True)
            except (TypeError, ValueError, UnicodeError):  # a lone surrogate somewhere: clean every text
                encodings = self.tokenizer.encode_batch([clean_text(t) for t in texts], add_special_tokens=True)
        ids: list[np.ndarray] = []
        types: list[np.ndarray] = []
        any_type = False
        num_tokens = np.empty(len(encodings), dtype=np.int32)
        for i, encoding in enumerate(encodings):
            row_ids, row_types = self._truncate(encoding)
            num_tokens[i] = len(encoding.ids)
            ids.append(np.asarray(row_ids, dtype=np.int32))
            type_array = np.asarray(row_types, dtype=np.int32)
            types.append(type_array)
            any_type = any_type or bool(type_array.any())
        return EncodedTexts(ids, types if any_type else None, num_tokens)

    def _encode_one(self, text: str) -> Encoding:
        try:
            return self.tokenizer.encode(text, add_special_tokens=True)
        except (TypeError, ValueError, UnicodeError):
            return self.tokenizer.encode(clean_text(text), add_special_tokens=True)

    def _truncate(self, encoding: Encoding) -> tuple[list[int], list[int]]:
        """ids and type ids cut to max_seq_len, keeping the trailing special tokens."""
        ids, types = encoding.ids, encoding.type_ids
        if len(ids) <= self.max_seq_len:
            return ids, types
        special = encoding.special_tokens_mask
        tail = 0
        while tail < len(special) and special[len(special) - 1 - tail]:
            tail += 1
        tail = min(tail, self.max_seq_len)
        keep = self.max_seq_len - tail
        return ids[:keep] + ids[len(ids) - tail:], types[:keep] + types[len(types) - tail:]
