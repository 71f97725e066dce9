"""The gateway's own tokenizer: the repository's tokenizer.json under the contract's rule.

The file is the one Triton serves (the repository is mounted here read-only); the tokenizer
config's `tokenizer_sha256` proves it, so the gateway never tokenizes with a stale copy.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from pathlib import Path

from tokenizers import Tokenizer

from contract import TOKENIZER_FILE
from contract.tokenization import EncodedTexts, TextEncoder
from gateway.service.registry import ServedModel

log = logging.getLogger("gateway.tokenization")


class TokenizerUnavailable(Exception):
    """Why the gateway cannot tokenize for a model itself (it then uses the model's ensemble)."""


def tokenizer_path(repository: Path, tokenizer_model: str) -> Path:
    """tokenizer.json of the highest version directory of `tokenizer_model` that has one."""
    folder = repository / tokenizer_model
    versions = sorted((int(p.name) for p in folder.iterdir() if p.name.isdigit()), reverse=True) if folder.is_dir() else []
    for version in versions:
        candidate = folder / str(version) / TOKENIZER_FILE
        if candidate.is_file():
            return candidate
    raise TokenizerUnavailable(f"no {TOKENIZER_FILE} under {folder}")


def load_encoder(repository: str, model: ServedModel) -> TextEncoder:
    """The model's tokenizer, checked against the hash its Triton config records."""
    if not repository:
        raise TokenizerUnavailable("GATEWAY_REPOSITORY is not set")
    if model.tokenizer is None:
        raise TokenizerUnavailable("its ensemble does not name a tokenizer model and a model step")
    path = tokenizer_path(Path(repository), model.tokenizer.triton_model)
    data = path.read_bytes()
    if model.tokenizer.sha256 and hashlib.sha256(data).hexdigest() != model.tokenizer.sha256:
        raise TokenizerUnavailable(f"{path} differs from the tokenizer Triton serves (sha256 mismatch)")
    return TextEncoder(Tokenizer.from_str(data.decode("utf-8")), model.max_seq_len)


async def encode(encoder: TextEncoder, texts: list[str], thread_chars: int) -> EncodedTexts:
    """Tokenize `texts`; large requests run in a worker thread so the event loop keeps serving."""
    if thread_chars and sum(map(len, texts)) > thread_chars:
        return await asyncio.to_thread(encoder.encode, texts)
    return encoder.encode(texts)
