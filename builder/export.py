"""PyTorch model with the repository's tensor interface, and its ONNX export.

The exported graph takes INT32 `input_ids`, `attention_mask`, `token_type_ids` [batch, seq]
(cast to int64 inside), and returns raw `logits` [batch, labels] (classify, rerank) or pooled `embeddings` [batch, dim]
(mean, CLS or last-token pooling, not normalized).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn
from transformers import AutoModel, AutoModelForSequenceClassification, PreTrainedModel

from builder.errors import BuildError
from builder.settings import ResolvedSettings
from contract import TOKEN_INPUTS as INPUT_NAMES


class RepositoryModel(nn.Module):
    """Wraps a Hugging Face encoder: int32 tokens in, logits or pooled embeddings out."""

    def __init__(self, model: PreTrainedModel, task: str, pooling: str | None) -> None:
        super().__init__()
        self.model = model
        self.task = task
        self.pooling = pooling
        self.uses_token_types = int(getattr(model.config, "type_vocab_size", 0) or 0) > 0

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor) -> torch.Tensor:
        ids = input_ids.to(torch.int64)
        mask = attention_mask.to(torch.int64)
        kwargs = {"input_ids": ids, "attention_mask": mask}
        if self.uses_token_types:
            kwargs["token_type_ids"] = token_type_ids.to(torch.int64)
        else:  # keep the third input in the graph so every model has the same interface
            kwargs["attention_mask"] = mask + token_type_ids.to(torch.int64) * 0
        if self.task in ("classify", "rerank"):
            return self.model(**kwargs).logits.float()
        hidden = self.model(**kwargs).last_hidden_state.float()
        if self.pooling == "cls":
            return hidden[:, 0]
        if self.pooling == "lasttoken":  # rows are right-padded: the last attended token is at length - 1
            last = (mask.sum(dim=1) - 1).clamp(min=0)
            return torch.gather(hidden, 1, last.view(-1, 1, 1).expand(-1, 1, hidden.shape[-1])).squeeze(1)
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)


def load_repository_model(path: Path, settings: ResolvedSettings, attn_implementation: str | None = None) -> RepositoryModel:
    """Load the checkpoint at `path` in fp32 eval mode, wrapped for the repository interface."""
    kwargs: dict[str, object] = {"dtype": torch.float32}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    logits = settings.task in ("classify", "rerank")
    loader = AutoModelForSequenceClassification if logits else AutoModel
    if logits and settings.labels:
        kwargs["num_labels"] = len(settings.labels)
        kwargs["id2label"] = dict(enumerate(settings.labels))
        kwargs["label2id"] = {label: i for i, label in enumerate(settings.labels)}
    torch.manual_seed(0)  # a newly added head (base checkpoint) is the same on every build
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = loader.from_pretrained(path, **kwargs)
    except (OSError, ValueError) as exc:
        raise BuildError(f"cannot load the weights of {settings.model!r}: {str(exc).splitlines()[0]}") from None
    return RepositoryModel(model.eval(), settings.task, settings.pooling).eval()


def example_inputs(batch: int, seq: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Dummy int32 inputs for tracing."""
    ids = torch.full((batch, seq), 5, dtype=torch.int32)
    mask = torch.ones((batch, seq), dtype=torch.int32)
    return ids, mask, torch.zeros((batch, seq), dtype=torch.int32)


def export_onnx(model: RepositoryModel, output_name: str, path: Path, opset: int) -> None:
    """Export with dynamic batch and sequence axes (TorchScript exporter: stable, optimizer-friendly)."""
    axes = {name: {0: "batch", 1: "sequence"} for name in INPUT_NAMES}
    axes[output_name] = {0: "batch"}
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            example_inputs(2, 16),
            str(path),
            input_names=list(INPUT_NAMES),
            output_names=[output_name],
            dynamic_axes=axes,
            opset_version=opset,
            do_constant_folding=True,
            dynamo=False,
        )
