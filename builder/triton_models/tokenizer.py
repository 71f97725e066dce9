"""Triton python-backend tokenizer: `text` -> INT32 input_ids, attention_mask, token_type_ids, num_tokens.

All texts of one execute() call are tokenized with one `encode_batch` (Rust, parallel).
Each request is truncated to `max_seq_len` and padded to the smallest length bucket that
holds its longest item (config parameter `length_buckets`, capped at max_seq_len).
`num_tokens` counts tokens (special tokens included) before truncation.
"""

import bisect
import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer


def _parameter(config, key, default=None):
    value = config.get("parameters", {}).get(key, {}).get("string_value")
    return default if value in (None, "") else value


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        self.tokenizer = Tokenizer.from_file(os.path.join(version_dir, "tokenizer.json"))
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        self.max_seq_len = int(_parameter(config, "max_seq_len"))
        buckets = {min(int(b), self.max_seq_len) for b in _parameter(config, "length_buckets", "").split(",") if b.strip()}
        self.buckets = sorted(buckets | {self.max_seq_len})
        self.pad_id = int(_parameter(config, "pad_token_id", "0"))

    def _bucket(self, length):
        return self.buckets[min(bisect.bisect_left(self.buckets, length), len(self.buckets) - 1)]

    def _truncate(self, encoding):
        """ids, type ids of one encoding cut to max_seq_len, keeping its trailing special tokens."""
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

    def execute(self, requests):
        texts, counts = [], []
        for request in requests:
            batch = pb_utils.get_input_tensor_by_name(request, "text").as_numpy().reshape(-1)
            counts.append(len(batch))
            for item in batch:
                texts.append(item.decode("utf-8", errors="replace") if isinstance(item, bytes) else str(item))
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=True)
        responses, start = [], 0
        for count in counts:
            chunk = encodings[start:start + count]
            start += count
            cut = [self._truncate(e) for e in chunk]
            width = self._bucket(max(len(ids) for ids, _ in cut))
            input_ids = np.full((count, width), self.pad_id, dtype=np.int32)
            attention = np.zeros((count, width), dtype=np.int32)
            types = np.zeros((count, width), dtype=np.int32)
            for row, (ids, type_ids) in enumerate(cut):
                input_ids[row, :len(ids)] = ids
                attention[row, :len(ids)] = 1
                types[row, :len(ids)] = type_ids
            num_tokens = np.array([[len(e.ids)] for e in chunk], dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("input_ids", input_ids),
                pb_utils.Tensor("attention_mask", attention),
                pb_utils.Tensor("token_type_ids", types),
                pb_utils.Tensor("num_tokens", num_tokens),
            ]))
        return responses
