"""Parity of exported artifacts against PyTorch fp32 on a fixed set of sentences."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from pydantic import BaseModel
from transformers import PreTrainedTokenizerFast

from builder.errors import BuildError
from builder.export import RepositoryModel
from builder.logs import Log
from contract import ATTENTION_MASK, INPUT_IDS, TOKEN_INPUTS, TOKEN_TYPE_IDS
from contract.packing import PackedRows, pack_padded

# Short, long, truncated (longer than any max_seq_len), empty, non-ASCII.
SENTENCES: tuple[str, ...] = (
    "good",
    "The movie was really good, I would see it again.",
    "",
    "안녕하세요, 이 영화 정말 좋아요!",
    "这个电影很好看。",
    "Ça marche très bien — naïve café, émojis 😀👍.",
    " ".join(["a long sentence with many words that keeps going"] * 12),
    " ".join(["truncated text beyond the limit of the model"] * 120),
)

ONNX_MIN_COSINE = 0.99999
ONNX_MAX_ABS_DIFF = 1e-4
TRT_MIN_COSINE = 0.999

Runner = Callable[[dict[str, np.ndarray]], np.ndarray]


class ParityResult(BaseModel):
    """Numbers of one artifact against PyTorch fp32, and whether they pass the thresholds."""

    artifact: str
    output: str = ""  # which output of the artifact ("" = its first: logits, embeddings, sparse_embeddings)
    sentences: int
    tokens: int | None = None  # a per-token output: its rows compared are the sentences' real tokens
    max_seq_len: int
    max_abs_diff: float
    min_cosine: float
    argmax_agree: bool | None  # logits (classify, rerank) only
    passed: bool
    thresholds: dict[str, float | str]
    layout: str = "padded"  # packed: the sentences were fed packed (rows back to back, cu_seqlens)
    ran_on: str = ""  # the onnxruntime provider of a packed artifact's run (a GPU form runs as its CPU form on CPU)

    def summary(self) -> str:
        agree = "" if self.argmax_agree is None else f", argmax agree={self.argmax_agree}"
        what = f"{self.artifact}[{self.output}]" if self.output else self.artifact
        rows = f"{self.sentences} sentences"
        if self.tokens is not None:
            rows = f"{self.tokens} tokens of {rows}"
        return (f"{what}: max_abs_diff={self.max_abs_diff:.3g}, min_cosine={self.min_cosine:.8f}{agree} "
                f"over {rows} (thresholds {self.thresholds})")


def parity_pairs() -> tuple[list[str], list[str]]:
    """Pair models: each sentence with the next one as its second text (both segments' token types, long pairs
    cut longest-first, empty first and second texts)."""
    texts = list(SENTENCES)
    return texts, texts[1:] + texts[:1]


def parity_inputs(tokenizer: PreTrainedTokenizerFast, max_seq_len: int, pairs: bool = False) -> dict[str, np.ndarray]:
    """The parity sentences (or sentence pairs) as INT32 token tensors, truncated to max_seq_len and padded to the
    longest."""
    texts, second = parity_pairs() if pairs else (list(SENTENCES), None)
    batch = tokenizer(texts, second, truncation=True, max_length=max_seq_len, padding="longest",
                      return_tensors="np", return_token_type_ids=True)
    return {name: np.asarray(batch[name], dtype=np.int32) for name in TOKEN_INPUTS}


def packed_parity_inputs(inputs: dict[str, np.ndarray]) -> PackedRows:
    """The padded parity inputs in the packed layout (contract/packing.py); `.feed(names)` is a graph's feed."""
    return pack_padded(inputs[INPUT_IDS], inputs[ATTENTION_MASK], inputs[TOKEN_TYPE_IDS])


def torch_references(model: RepositoryModel, inputs: dict[str, np.ndarray],
                     attn_implementation: str | None = None) -> list[np.ndarray]:
    """PyTorch fp32 outputs for `inputs`, one array per model output (settings.output_names order).

    `attn_implementation` runs them with that attention (e.g. "sdpa") and puts the model's own back after.
    """
    encoder = model.model
    before = encoder.config._attn_implementation
    if attn_implementation and attn_implementation != before:
        encoder.set_attn_implementation(attn_implementation)
    try:
        with torch.inference_mode():
            out = model(*(torch.from_numpy(inputs[name]) for name in TOKEN_INPUTS))
    finally:
        if attn_implementation and attn_implementation != before:
            encoder.set_attn_implementation(before)
    return [o.float().numpy() for o in (out if isinstance(out, tuple) else (out,))]


def torch_reference(model: RepositoryModel, inputs: dict[str, np.ndarray]) -> np.ndarray:
    """PyTorch fp32 output for `inputs` (the first output: logits, embeddings or the sparse row)."""
    return torch_references(model, inputs)[0]


def real_tokens(per_token: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
    """The rows of a per-token output [batch, seq, ...] that belong to real tokens, as [tokens, dim]."""
    rows = per_token[attention_mask.astype(bool)]
    return rows.reshape(len(rows), -1)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine of each row; of the one column when rows have one value (a single logit's cosine is only its sign)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    if a64.shape[1] == 1:
        a64, b64 = a64.T, b64.T
    norm_a, norm_b = np.linalg.norm(a64, axis=1), np.linalg.norm(b64, axis=1)
    cosines = (a64 * b64).sum(axis=1) / np.maximum(norm_a * norm_b, 1e-30)
    # two all-zero rows agree (a SPLADE row or ReLU weights can be all zero); one zero row does not
    return np.where((norm_a < 1e-12) & (norm_b < 1e-12), 1.0, cosines)


def compare(artifact: str, task: str, reference: np.ndarray, candidate: np.ndarray, max_seq_len: int,
            output: str = "", sentences: int | None = None) -> ParityResult:
    """Compare one artifact's outputs with the reference; thresholds depend on the artifact (onnx / trt_fp16).
    Per-token outputs are compared as rows of their real tokens (`real_tokens`), like embeddings: `sentences`
    then says how many sentences those tokens are of."""
    rows = {"sentences": len(reference)} if sentences is None else {"sentences": sentences, "tokens": len(reference)}
    if candidate.shape != reference.shape or not np.isfinite(candidate).all():
        return ParityResult(artifact=artifact, output=output, **rows, max_seq_len=max_seq_len,
                            max_abs_diff=float("inf"), min_cosine=-1.0, argmax_agree=False if task in ("classify", "rerank") else None,
                            passed=False, thresholds={"shape": str(reference.shape)})
    logits = task in ("classify", "rerank")
    diff = float(np.abs(candidate.astype(np.float64) - reference).max())
    cosine = float(_cosines(reference, candidate).min())
    agree = bool((reference.argmax(1) == candidate.argmax(1)).all()) if logits else None
    if artifact == "onnx":
        thresholds: dict[str, float | str] = (
            {"max_abs_diff": ONNX_MAX_ABS_DIFF} if logits else {"min_cosine": ONNX_MIN_COSINE}
        )
        passed = diff <= ONNX_MAX_ABS_DIFF if logits else cosine >= ONNX_MIN_COSINE
    else:
        thresholds = {"min_cosine": TRT_MIN_COSINE}
        if logits:
            thresholds["argmax"] = "equal"
        passed = cosine >= TRT_MIN_COSINE and (agree is not False)
    return ParityResult(artifact=artifact, output=output, **rows, max_seq_len=max_seq_len, max_abs_diff=diff,
                        min_cosine=cosine, argmax_agree=agree, passed=passed, thresholds=thresholds)


def check(result: ParityResult, name: str, log: Log) -> None:
    """Log one artifact's parity; a failed one fails the build of model `name` before anything is published."""
    log(f"parity {name} {result.summary()}")
    if not result.passed:
        raise BuildError(f"{name}: parity failed, nothing published: {result.summary()}")
