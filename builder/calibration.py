"""int8/uint8 calibration of an embedder: a calibration set embedded by the built model, and the [min; max] of every
component at each width requests may ask for (contract/ranges.py), as the gateway serves the vectors there: the
model's pooled output, cut to the width, then L2-normalized when the model normalizes.

The set is the user's (`--calibration-texts FILE`, one text per line) or the builder's own multilingual one
(calibration_texts.txt), each text embedded bare and with every prompt of the model, so that the ranges cover what
any request may get. The engine is the published ONNX graph, where it will run (builder/onnx_parity.py); a
TensorRT-only build uses the plain fp32 export.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import numpy as np
from transformers import PreTrainedTokenizerBase

from builder.errors import BuildError, UsageError
from builder.logs import Log, step
from builder.onnx_parity import published_session, run_published
from builder.settings import ResolvedSettings
from contract import TOKEN_INPUTS

DEFAULT_TEXTS = "calibration_texts.txt"
BATCH_ROWS = 64  # texts per onnxruntime call: a user's large set is embedded a batch at a time


def read_texts(path: str | None) -> list[str]:
    """The non-blank lines of `path`, or of the builder's default set (None); UsageError when there are none."""
    if path is None:
        text = resources.files("builder").joinpath(DEFAULT_TEXTS).read_text(encoding="utf-8")
    else:
        try:
            text = Path(path).expanduser().read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"--calibration-texts {path}: cannot read it as UTF-8 text ({exc})") from None
    texts = [line for line in text.splitlines() if line.strip()]
    if not texts:
        raise UsageError(f"--calibration-texts {path}: no text in it (one text per line)")
    return texts


def texts_digest(texts: list[str]) -> str:
    """sha256 of the calibration set, which the build fingerprint (and so a rebuild) depends on."""
    return hashlib.sha256("\n".join(texts).encode()).hexdigest()


def widths(s: ResolvedSettings, width: int) -> list[int]:
    """The widths requests may ask for: the matryoshka dimensions (ending with the full one), or the full one."""
    return list(s.matryoshka_dims) or [width]


def ranges_of(vectors: np.ndarray, dims: list[int], normalize: bool) -> dict[int, np.ndarray]:
    """Per width, [min; max] of each component of `vectors` [n, full width] cut to it and, when the model
    normalizes, L2-normalized after the cut (the gateway's order), as float32 [2, width]."""
    ranges = {}
    for dim in dims:
        cut = vectors[:, :dim].astype(np.float32)
        if normalize:
            norms = np.linalg.norm(cut, axis=1, keepdims=True)
            cut = cut / np.maximum(norms, np.float32(1e-12))
        ranges[dim] = np.vstack((cut.min(axis=0), cut.max(axis=0))).astype(np.float32)
    return ranges


def calibrate(s: ResolvedSettings, tokenizer: PreTrainedTokenizerBase, graph: Path, published: bool, width: int,
              work: Path, log: Log) -> dict[int, np.ndarray]:
    """The ranges of each width, from the calibration set embedded by `graph`: the published ONNX graph
    (`published`, run as the step will run it) or the plain fp32 export (on the CPU)."""
    texts = read_texts(s.calibration_texts or None)
    prefixed = [prefix + text for prefix in ["", *dict.fromkeys(s.prompts.values())] for text in texts]
    layout = s.layout if published else "padded"
    with step(log, f"{s.name}: calibrating int8/uint8 ranges on {len(texts)} texts x {len(prefixed) // len(texts)} "
                   "prompt(s)"):
        session, _ = published_session(graph, s.device if published else "cpu", s.runtime, layout, work)
        vectors = np.concatenate([run_published(session, batch, [s.output_name], layout)[0]
                                  for batch in _batches(tokenizer, prefixed, s.max_seq_len)])
    if not np.isfinite(vectors).all():
        raise BuildError(f"{s.name}: the calibration set's embeddings are not finite; nothing published")
    return ranges_of(vectors, widths(s, width), s.normalize is not False)


def _batches(tokenizer: PreTrainedTokenizerBase, texts: list[str], max_seq_len: int
             ) -> Iterator[dict[str, np.ndarray]]:
    """INT32 token tensors of BATCH_ROWS texts at a time, texts of similar length together (less padding)."""
    ordered = sorted(texts, key=len)
    for start in range(0, len(ordered), BATCH_ROWS):
        batch = tokenizer(ordered[start:start + BATCH_ROWS], truncation=True, max_length=max_seq_len,
                          padding="longest", return_tensors="np", return_token_type_ids=True)
        yield {name: np.asarray(batch[name], dtype=np.int32) for name in TOKEN_INPUTS}
