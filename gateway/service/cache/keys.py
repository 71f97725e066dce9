"""The keys of the result cache: what identifies the rows a model step returns for a text.

A key is a 16-byte BLAKE2b digest (bounded, whatever the text's length) of the model's identity and of the text as
the model runs it (the prompt applied, the end truncation cuts). The identity holds the served model as the
registry parsed it from Triton's configs (name, tokenizer hash, max_seq_len, pooling, source, ...), the endpoint
and pipeline the row comes from (TensorRT and ONNX rows differ), and the versions of the family's entries Triton
serves: a rebuilt model is a new version, so its rows have other keys. What is applied after the model step
(dimensions, normalization, the output's encoding) is not in the key: it is applied to the cached row as to a
fresh one."""

from __future__ import annotations

import hashlib

import orjson

from gateway.service.registry import Endpoint, Registry, ServedModel

KEY_BYTES = 16


def model_identity(registry: Registry, model: ServedModel, endpoint: Endpoint, pipeline: str) -> bytes:
    """The digest of what makes `model`'s rows on `endpoint` what they are."""
    family = registry.families.get(model.name)
    served = sorted((e.name, e.version) for e in family.entries if e.state == "READY") if family else []
    canonical = orjson.dumps([repr(model), repr(endpoint), pipeline, served])
    return hashlib.blake2b(canonical, digest_size=KEY_BYTES).digest()


def text_key(identity: bytes, direction: str, text: str) -> bytes:
    """The key of one text's row: the model's identity, the truncation direction, the text."""
    digest = hashlib.blake2b(identity, digest_size=KEY_BYTES)
    digest.update(direction.encode() + b"\0")
    digest.update(text.encode("utf-8", "surrogatepass"))
    return digest.digest()
