"""The export stage of a build: the checkpoint's weights loaded once, PyTorch's reference outputs on the parity
inputs, and the ONNX exports: the plain one (TensorRT parses it; the optimizer reads it), and for models whose
attention the optimizer cannot fuse, one with onnxruntime's MultiHeadAttention written in."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from transformers import PretrainedConfig

from builder.attention import ATTENTION, FUSED_EXPORT_TYPES
from builder.errors import BuildError
from builder.export import RepositoryModel, export_onnx, load_repository_model
from builder.logs import Log, step
from builder.parity import parity_inputs, torch_references
from builder.plan import PlannedBuild


@dataclass
class Export:
    """What the later stages work from."""

    directory: Path  # the exports' scratch folder in staging, never published
    raw_path: Path  # the plain fp32 export
    optimizer_input: Path  # the export the onnxruntime optimizer reads (the fused-attention one where made)
    config: PretrainedConfig
    inputs: dict[str, np.ndarray]  # the parity inputs
    references: list[np.ndarray]  # PyTorch's outputs on them: the per-row output, then the per-token ones
    token_dims: dict[str, list[int]]  # per-token outputs: [batch, seq] + these dims ([] for one weight per token)

    @property
    def width(self) -> int:
        """The per-row output's width (embedding dimensions, labels, vocabulary)."""
        return int(self.references[0].shape[1])


def export_model(planned: PlannedBuild, staging: Path, log: Log) -> Export:
    """Load the weights, compute the references, and export; raise BuildError when the model's outputs do not
    match its settings."""
    s = planned.settings
    with step(log, f"{s.name}: loading the weights of {s.model}"):
        model: RepositoryModel = load_repository_model(planned.source.path, s, attn_implementation="eager")
    inputs = parity_inputs(planned.source.tokenizer, s.max_seq_len, pairs=s.pairs)
    with step(log, f"{s.name}: computing PyTorch reference outputs"):
        references = torch_references(model, inputs, attn_implementation="sdpa")
    width = int(references[0].shape[1])
    if s.matryoshka_dims and s.matryoshka_dims[-1] != width:
        raise BuildError(f"{s.name}: the embeddings are {width} wide, not {s.matryoshka_dims[-1]} "
                         "(config.hidden_size) as the matryoshka dimensions assumed")
    directory = staging / f".{s.name}_export"
    raw_path = directory / "model.onnx"
    raw_path.parent.mkdir(parents=True)
    with step(log, f"{s.name}: exporting ONNX (opset {s.opset})"):
        export_onnx(model, s.output_names, raw_path, s.opset)
    config = model.model.config
    del model
    optimizer_input = raw_path
    if "onnx" in planned.entries and s.onnx_optimize and config.model_type in FUSED_EXPORT_TYPES:
        optimizer_input = _fused_export(planned, directory, log) or raw_path
    token_dims = {name: [int(d) for d in ref.shape[2:]] for name, ref in zip(s.token_outputs, references[1:])}
    return Export(directory, raw_path, optimizer_input, config, inputs, references, token_dims)


def _fused_export(planned: PlannedBuild, directory: Path, log: Log) -> Path | None:
    """The export with onnxruntime's MultiHeadAttention written in (builder/attention.py), for models whose
    attention the optimizer cannot fuse (ModernBERT); None, with a notice, when that export fails."""
    s = planned.settings
    path = directory / "fused" / "model.onnx"
    path.parent.mkdir(parents=True)
    try:
        with step(log, f"{s.name}: exporting ONNX with fused MultiHeadAttention"):
            fused = load_repository_model(planned.source.path, s, attn_implementation=ATTENTION)
            export_onnx(fused, s.output_names, path, s.opset)
    except Exception as exc:  # noqa: BLE001 - the plain export still works
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        log(f"notice: {s.name}: the export with fused attention failed ({reason}); using the plain export")
        return None
    return path
