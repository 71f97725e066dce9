"""Triton python-backend tokenizer: `text` -> INT32 input_ids, attention_mask, token_type_ids, num_tokens.

Tokenization is `tokenization.py` beside this file (the repository's copy of contract/tokenization.py,
the code the gateway runs too): all texts of one execute() call in one `encode_batch` (Rust,
parallel), truncated to `max_seq_len` keeping trailing special tokens, `num_tokens` before
truncation. Each request is padded to the smallest length bucket that holds its longest item
(config parameter `length_buckets`, capped at max_seq_len). Requests cancelled while they waited
are not tokenized (SkipCancelled).
"""

import bisect
import json
import os
import sys

import triton_python_backend_utils as pb_utils

# tokenization.py beside this file: the repository copy of contract/tokenization.py
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cancellation import SkipCancelled
from tokenization import TextEncoder


def _parameter(config, key, default=None):
    value = config.get("parameters", {}).get(key, {}).get("string_value")
    return default if value in (None, "") else value


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        self.max_seq_len = int(_parameter(config, "max_seq_len"))
        self.encoder = TextEncoder.from_file(os.path.join(version_dir, "tokenizer.json"), self.max_seq_len)
        buckets = {min(int(b), self.max_seq_len) for b in _parameter(config, "length_buckets", "").split(",") if b.strip()}
        self.buckets = sorted(buckets | {self.max_seq_len})
        self.pad_id = int(_parameter(config, "pad_token_id", "0"))
        self._execute = SkipCancelled(self._tokenize)

    def _bucket(self, length):
        return self.buckets[min(bisect.bisect_left(self.buckets, length), len(self.buckets) - 1)]

    def execute(self, requests):
        return self._execute(requests)

    def _tokenize(self, requests):
        texts, counts = [], []
        for request in requests:
            batch = pb_utils.get_input_tensor_by_name(request, "text").as_numpy().reshape(-1)
            counts.append(len(batch))
            for item in batch:
                texts.append(item.decode("utf-8", errors="replace") if isinstance(item, bytes) else str(item))
        encoded = self.encoder.encode(texts)
        responses, start = [], 0
        for count in counts:
            part = slice(start, start + count)
            start += count
            ids = encoded.ids[part]
            types = encoded.type_ids[part] if encoded.type_ids is not None else None
            width = self._bucket(max(len(i) for i in ids))
            chunk = type(encoded)(ids, types, encoded.num_tokens[part])
            input_ids, attention, token_types = chunk.padded(width, self.pad_id)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("input_ids", input_ids),
                pb_utils.Tensor("attention_mask", attention),
                pb_utils.Tensor("token_type_ids", token_types),
                pb_utils.Tensor("num_tokens", chunk.num_tokens.reshape(-1, 1)),
            ]))
        return responses
