"""Triton python-backend tokenizer: `text` (+ `text_pair`) -> INT32 input_ids, attention_mask, token_type_ids, num_tokens.

Tokenization is `tokenization.py` beside this file (the repository's copy of contract/tokenization.py,
the code the gateway runs too): the texts (or text pairs) of one execute() call in one `encode_batch`
per truncation direction (Rust, parallel), cut to `max_seq_len` as Hugging Face's truncation does
(longest first for pairs), `num_tokens` before truncation. The direction is the request parameter
`truncation_direction` (`right`, the default, or `left`; an ensemble forwards its request parameters
here). Each request is padded to the smallest length bucket that holds its longest item (config
parameter `length_buckets`, capped at max_seq_len). Requests cancelled while they waited are not
tokenized (SkipCancelled).
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

TEXT, TEXT_PAIR = "text", "text_pair"
TRUNCATION_PARAMETER = "truncation_direction"
DIRECTIONS = ("right", "left")


def _parameter(config, key, default=None):
    value = config.get("parameters", {}).get(key, {}).get("string_value")
    return default if value in (None, "") else value


def _strings(request, name):
    """The request's strings of input `name`, or None when the request has no such input."""
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return None
    return [item.decode("utf-8", errors="replace") if isinstance(item, bytes) else str(item)
            for item in tensor.as_numpy().reshape(-1)]


def _direction(request):
    """The request's truncation direction; ValueError when it asks for one that does not exist."""
    raw = request.parameters()
    parameters = json.loads(raw) if raw else {}
    direction = parameters.get(TRUNCATION_PARAMETER, "right")
    if direction not in DIRECTIONS:
        raise ValueError(f"{TRUNCATION_PARAMETER} must be 'right' or 'left', not {direction!r}")
    return direction


def _error_response(message):
    code = getattr(pb_utils.TritonError, "INVALID_ARG", None)
    error = pb_utils.TritonError(message) if code is None else pb_utils.TritonError(message, code)
    return pb_utils.InferenceResponse(error=error)


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
        responses = [None] * len(requests)
        groups = {}  # (direction, with pairs) -> [(request index, texts, pairs)]
        for index, request in enumerate(requests):
            try:
                direction = _direction(request)
            except ValueError as exc:
                responses[index] = _error_response(str(exc))
                continue
            texts, pairs = _strings(request, TEXT), _strings(request, TEXT_PAIR)
            if pairs is not None and len(pairs) != len(texts):
                responses[index] = _error_response(f"{len(texts)} texts but {len(pairs)} text pairs")
                continue
            groups.setdefault((direction, pairs is not None), []).append((index, texts, pairs))
        for (direction, with_pairs), items in groups.items():
            texts = [t for _, request_texts, _ in items for t in request_texts]
            pairs = [p for _, _, request_pairs in items for p in request_pairs] if with_pairs else None
            encoded = self.encoder.encode(texts, pairs, direction)
            start = 0
            for index, request_texts, _ in items:
                part = slice(start, start + len(request_texts))
                start += len(request_texts)
                responses[index] = self._response(encoded, part)
        return responses

    def _response(self, encoded, part):
        ids = encoded.ids[part]
        types = encoded.type_ids[part] if encoded.type_ids is not None else None
        width = self._bucket(max(len(i) for i in ids))
        chunk = type(encoded)(ids, types, encoded.num_tokens[part])
        input_ids, attention, token_types = chunk.padded(width, self.pad_id)
        return pb_utils.InferenceResponse([
            pb_utils.Tensor("input_ids", input_ids),
            pb_utils.Tensor("attention_mask", attention),
            pb_utils.Tensor("token_type_ids", token_types),
            pb_utils.Tensor("num_tokens", chunk.num_tokens.reshape(-1, 1)),
        ])
