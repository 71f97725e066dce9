"""Text -> token ids, exactly as the repository defines it; shared by the gateway and Triton's tokenizer.

The builder copies this file next to the tokenizer's model.py in the repository, so the
python-backend tokenizer (ensemble path) and the gateway (scheduler path) run the same code on
the same tokenizer.json: only numpy and `tokenizers` may be imported here.

Rules (docs/contract.md): special tokens are added; a text (or pair) longer than `max_seq_len` is
cut by the tokenizer's own truncation, exactly as Hugging Face's `truncation=True` does
(`longest_first` for pairs, from the right unless `left` is asked), keeping its special tokens;
`num_tokens` is the length before truncation.
"""

from __future__ import annotations

from typing import Any

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
    """A `tokenizers.Tokenizer` applying the repository's truncation rule to texts or text pairs."""

    def __init__(self, tokenizer: Tokenizer, max_seq_len: int) -> None:
        self.tokenizer = tokenizer
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        self.max_seq_len = max_seq_len
        self._truncating: dict[str, Tokenizer] = {}  # by direction, made on first use
        self._specials: tuple[list[int], list[int]] | None = None

    @classmethod
    def from_file(cls, path: str, max_seq_len: int) -> "TextEncoder":
        return cls(Tokenizer.from_file(path), max_seq_len)

    def encode(self, texts: list[str], pairs: list[str] | None = None, direction: str = "right") -> EncodedTexts:
        """Tokenize `texts` (or the pairs `texts[i]`, `pairs[i]`) in one call (parallel in Rust when its pool is
        on); rows over max_seq_len are cut from `direction` as Hugging Face's truncation cuts them."""
        if direction not in ("right", "left"):
            raise ValueError(f"truncation direction must be right or left, not {direction!r}")
        inputs: list[Any] = texts if pairs is None else list(zip(texts, pairs))
        encodings = _encode(self.tokenizer, inputs)
        ids: list[np.ndarray] = []
        types: list[np.ndarray] = []
        any_type = False
        num_tokens = np.empty(len(encodings), dtype=np.int32)
        over: list[int] = []
        for i, encoding in enumerate(encodings):
            row_ids, row_types = encoding.ids, encoding.type_ids
            num_tokens[i] = len(row_ids)
            if len(row_ids) > self.max_seq_len:
                if pairs is not None:  # longest-first over two texts: the tokenizer's own truncation, below
                    over.append(i)
                else:
                    row_ids, row_types = self._cut(encoding, row_ids, row_types, direction)
            ids.append(np.asarray(row_ids, dtype=np.int32))
            type_array = np.asarray(row_types, dtype=np.int32)
            types.append(type_array)
            any_type = any_type or bool(type_array.any())
        if over:
            for i, encoding in zip(over, _encode(self._truncator(direction), [inputs[i] for i in over])):
                ids[i] = np.asarray(encoding.ids, dtype=np.int32)
                types[i] = np.asarray(encoding.type_ids, dtype=np.int32)
        return EncodedTexts(ids, types if any_type else None, num_tokens)

    def _cut(self, encoding: Encoding, ids: list[int], types: list[int], direction: str) -> tuple[list[int], list[int]]:
        """One text's ids and type ids cut to max_seq_len, keeping its leading and trailing special tokens
        (what the tokenizer's truncation does to one sequence before its special tokens are added)."""
        special = encoding.special_tokens_mask
        head = 0
        while head < len(special) and special[head]:
            head += 1
        tail = 0
        while tail < len(special) - head and special[len(special) - 1 - tail]:
            tail += 1
        head, tail = min(head, self.max_seq_len), min(tail, max(self.max_seq_len - head, 0))
        keep = self.max_seq_len - head - tail
        end = len(ids) - tail
        start = head if direction == "right" else end - keep
        return (ids[:head] + ids[start : start + keep] + ids[end:],
                types[:head] + types[start : start + keep] + types[end:])

    def encode_ids(self, rows: list[list[int]]) -> EncodedTexts:
        """Texts given as token ids without special tokens (what `encode` gives, specials removed):
        the special tokens are added, and content over max_seq_len is cut from the right."""
        head, tail = self.special_ids()
        room = max(self.max_seq_len - len(head) - len(tail), 0)
        ids = [np.asarray(head + list(row[:room]) + tail, dtype=np.int32) for row in rows]
        num_tokens = np.fromiter((len(head) + len(row) + len(tail) for row in rows), dtype=np.int32, count=len(rows))
        return EncodedTexts(ids, None, num_tokens)

    def special_ids(self) -> tuple[list[int], list[int]]:
        """The special token ids one text starts and ends with (e.g. [CLS] and [SEP])."""
        if self._specials is None:
            probe = self.tokenizer.encode("a", add_special_tokens=True)
            mask = probe.special_tokens_mask
            head = next((i for i, m in enumerate(mask) if not m), len(mask))
            tail = next((i for i, m in enumerate(reversed(mask)) if not m), 0)
            self._specials = (probe.ids[:head], probe.ids[len(mask) - tail:])
        return self._specials

    def _truncator(self, direction: str) -> Tokenizer:
        tokenizer = self._truncating.get(direction)
        if tokenizer is None:
            tokenizer = Tokenizer.from_str(self.tokenizer.to_str())
            tokenizer.no_padding()
            tokenizer.enable_truncation(self.max_seq_len, strategy="longest_first", direction=direction)
            self._truncating[direction] = tokenizer
        return tokenizer


def _encode(tokenizer: Tokenizer, inputs: list[Any]) -> list[Encoding]:
    """Encodings with special tokens; a lone surrogate anywhere is replaced (U+FFFD) and tried again."""
    try:
        return _encode_once(tokenizer, inputs)
    except (TypeError, ValueError, UnicodeError):
        return _encode_once(tokenizer, [clean_text(i) if isinstance(i, str) else tuple(map(clean_text, i))
                                        for i in inputs])


def _encode_once(tokenizer: Tokenizer, inputs: list[Any]) -> list[Encoding]:
    # encode_batch_fast (tokenizers 0.21+) gives the same ids, type ids and special-token masks without the
    # offsets, which nothing here reads and which cost time per text, for one text too. An older tokenizers (a
    # Triton image's) has encode_batch.
    encode = getattr(tokenizer, "encode_batch_fast", None) or tokenizer.encode_batch
    return encode(inputs, add_special_tokens=True)
