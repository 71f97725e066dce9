"""/tokenize and /decode, and the checks of token-id input: the model's own tokenizer, run by the gateway.

A /tokenize answer is some 30 times its input (an object per token): GATEWAY_MAX_TOKENIZE_TOKENS bounds the tokens
one answer may hold (413 `answer_too_large`), counted before the answer is built."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contract.tokenization import TextEncoder, clean_text
from gateway.errors import ErrorType, GatewayError, invalid
from gateway.service.inference import Inference
from gateway.service.prompts import prompt_text, with_prompt
from gateway.service.registry import ServedModel
from gateway.service.serving import Call, ModelRef, Service
from gateway.service.tokenization import TokenizerQueue


def tokenizer_of(inference: Inference, model: ServedModel) -> TokenizerQueue:
    """The model's tokenizer as the gateway runs it; 501 when the gateway cannot read it."""
    tokenizer = inference.tokenizer_for(model)
    if tokenizer is None:
        raise GatewayError(ErrorType.TOKENIZER_UNAVAILABLE, f"the gateway cannot read the tokenizer of {model.name!r} "
                           "(set GATEWAY_REPOSITORY to the model repository Triton serves)")
    return tokenizer


def check_token_ids(encoder: TextEncoder, rows: list[list[int]]) -> None:
    """400 unless every id is in the model's vocabulary."""
    size = encoder.tokenizer.get_vocab_size(with_added_tokens=True)
    for i, row in enumerate(rows):
        bad = next((t for t in row if not 0 <= t < size), None)
        if bad is not None:
            raise invalid(f"input {i} has token id {bad}, outside this model's vocabulary (0..{size - 1})",
                          type=ErrorType.INVALID_TOKEN_ID)


async def tokenize(tokenizer: TokenizerQueue, texts: list[str], add_special_tokens: bool,
                   max_tokens: int) -> list[list[dict[str, Any]]]:
    """Every token of every text, untruncated: id, text, special flag and character offsets in the input
    (on the model's tokenizer pool: off the event loop unless small); 413 for more than `max_tokens` in all."""
    return await tokenizer.call(lambda: _tokens(tokenizer.encoder, texts, add_special_tokens, max_tokens),
                                sum(map(len, texts)))


def _tokens(encoder: TextEncoder, texts: list[str], add_special_tokens: bool,
            max_tokens: int) -> list[list[dict[str, Any]]]:
    cleaned = [clean_text(t) for t in texts]
    encodings = encoder.tokenizer.encode_batch(cleaned, add_special_tokens=add_special_tokens)
    count = sum(len(encoding.ids) for encoding in encodings)
    if count > max_tokens:
        raise GatewayError(ErrorType.ANSWER_TOO_LARGE, f"the answer would hold {count:,} tokens, over the "
                           f"{max_tokens:,} one /tokenize request may ask for (GATEWAY_MAX_TOKENIZE_TOKENS): send "
                           "fewer or shorter texts per request")
    result = []
    for text, encoding in zip(cleaned, encodings):
        tokens = []
        for token_id, token, (start, stop), special in zip(
            encoding.ids, encoding.tokens, encoding.offsets, encoding.special_tokens_mask
        ):
            if special:
                tokens.append({"id": token_id, "text": token, "special": True, "start": None, "stop": None})
            else:
                tokens.append({"id": token_id, "text": text[start:stop], "special": False, "start": start,
                               "stop": stop})
        result.append(tokens)
    return result


async def decode(tokenizer: TokenizerQueue, rows: list[list[int]], skip_special_tokens: bool) -> list[str]:
    """The text of every row of token ids (on the model's tokenizer pool: off the event loop unless small)."""

    def work() -> list[str]:
        check_token_ids(tokenizer.encoder, rows)
        return list(tokenizer.encoder.tokenizer.decode_batch(rows, skip_special_tokens=skip_special_tokens))

    return await tokenizer.call(work, sum(map(len, rows)))


@dataclass(frozen=True, slots=True)
class Tokens:
    model: str
    tokens: list[list[dict[str, Any]]]  # per text: {id, text, special, start, stop} per token


@dataclass(frozen=True, slots=True)
class Decoded:
    model: str
    texts: list[str]  # one per row of ids


class TokenService(Service):
    """The model's own tokenizer as the gateway runs it (/tokenize, /decode and TEI's)."""

    async def tokenize(self, call: Call, model: ModelRef, texts: list[str], *, add_special_tokens: bool = True,
                       prompt_name: str | None = None) -> Tokens:
        """Every token of every text, untruncated; `prompt_name`: with that prompt of the model before each."""
        self.check_texts(call, texts)
        served = await self.model(call, model, None)
        prefix = prompt_text(served, prompt_name) if prompt_name is not None else ""
        tokenizer = tokenizer_of(self.inference, served)
        return Tokens(served.name, await tokenize(tokenizer, with_prompt(texts, prefix), add_special_tokens,
                                                  self.max_tokenize_tokens))

    async def decode(self, call: Call, model: ModelRef, rows: list[list[int]], *,
                     skip_special_tokens: bool = True) -> Decoded:
        """The text of every row of token ids; 400 for an id outside the model's vocabulary."""
        self.check_count(call, len(rows))
        served = await self.model(call, model, None)
        return Decoded(served.name, await decode(tokenizer_of(self.inference, served), rows, skip_special_tokens))
