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
import time

import triton_python_backend_utils as pb_utils

# tokenization.py beside this file: the repository copy of contract/tokenization.py
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tokenization import TextEncoder

# Requests cancelled while they waited (the caller cancelled, or its gRPC deadline passed) are answered
# with an error and left out of the batch. Triton 2.51 already drops requests cancelled before it hands
# them to the model; this catches those cancelled later. request.is_cancelled() is one round trip to the
# server per request (~50 us on 2 CPU cores, more than tokenizing a short text), so the requests are
# checked only after a long execute(), behind which they may have waited long.
CHECK_CANCELLED_AFTER_S = 0.02


def _cancelled_response():
    """TritonError.CANCELLED exists from Triton 23.10 on; pb_utils gets its classes only once the stub
    runs, so they are looked up here, not at import."""
    code = getattr(pb_utils.TritonError, "CANCELLED", None)
    message = "request cancelled before it ran"
    error = pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)
    return pb_utils.InferenceResponse(error=error)


class SkipCancelled:
    """Wraps execute(requests) -> responses: cancelled requests get an error and are not run."""

    def __init__(self, execute):
        self.execute = execute
        self.previous_s = 0.0  # how long this instance's previous execute() took

    def __call__(self, requests):
        start = time.perf_counter()
        try:
            if self.previous_s < CHECK_CANCELLED_AFTER_S:
                return self.execute(requests)
            cancelled = [request.is_cancelled() for request in requests]
            if not any(cancelled):
                return self.execute(requests)
            live = iter(self.execute([r for r, c in zip(requests, cancelled) if not c]) if not all(cancelled) else ())
            return [_cancelled_response() if c else next(live) for c in cancelled]
        finally:
            self.previous_s = time.perf_counter() - start


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
