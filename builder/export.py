"""PyTorch model with the repository's tensor interface, and its ONNX export.

The exported graph takes INT32 `input_ids`, `attention_mask`, `token_type_ids` [batch, seq]
(cast to int64 inside), and returns raw `logits` [batch, labels] (classify, rerank), pooled `embeddings` [batch, dim]
(mean, CLS or last-token pooling, not normalized) and per-token outputs (embed), or a SPLADE
`sparse_embeddings` [batch, vocabulary] row (sparse-embed).
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn
from transformers import AutoModel, AutoModelForMaskedLM, AutoModelForSequenceClassification, PreTrainedModel

from builder.attention import padding_mask
from builder.errors import BuildError
from builder.settings import ResolvedSettings
from builder.source import COLBERT_HEAD_FILE, SPARSE_HEAD_FILE
from contract import TOKEN_INPUTS as INPUT_NAMES


class RepositoryModel(nn.Module):
    """Wraps a Hugging Face encoder: int32 tokens in, the repository's outputs out (settings.output_names):
    logits, pooled embeddings, or a SPLADE vocabulary row; embedders also per-token outputs (the last hidden
    state, and bge-m3's lexical weights and ColBERT vectors when the model ships those heads)."""

    def __init__(self, model: PreTrainedModel, task: str, pooling: str | None, *, token_outputs: bool = False,
                 sparse_head: nn.Linear | None = None, colbert_head: nn.Linear | None = None,
                 splade: tuple[str, str] | None = None) -> None:
        super().__init__()
        self.model = model
        self.task = task
        self.pooling = pooling
        self.token_outputs = token_outputs
        self.sparse_head = sparse_head
        self.colbert_head = colbert_head
        self.splade = splade  # (pooling, activation) of sparse-embed
        self.uses_token_types = int(getattr(model.config, "type_vocab_size", 0) or 0) > 0

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        ids = input_ids.to(torch.int64)
        mask = attention_mask.to(torch.int64)
        kwargs = {"input_ids": ids, "attention_mask": mask}
        if self.uses_token_types:
            kwargs["token_type_ids"] = token_type_ids.to(torch.int64)
        else:  # keep the third input in the graph so every model has the same interface
            mask = mask + token_type_ids.to(torch.int64) * 0
            kwargs["attention_mask"] = mask
        with padding_mask(mask):  # for the export's own fused attention (builder/attention.py), when used
            result = self.model(**kwargs)
        if self.task in ("classify", "rerank"):
            return result.logits.float()
        if self.task == "sparse-embed":
            return self._splade(result.logits.float(), mask)
        hidden = result.last_hidden_state.float()
        pooled = self._pool(hidden, mask)
        if not self.token_outputs:
            return pooled
        outputs = [pooled, hidden]
        if self.sparse_head is not None:  # FlagEmbedding: relu(sparse_linear(hidden)), one weight per token
            outputs.append(torch.relu(self.sparse_head(hidden)).squeeze(-1))
        if self.colbert_head is not None:  # FlagEmbedding: normalize(colbert_linear(hidden)) per token
            outputs.append(nn.functional.normalize(self.colbert_head(hidden), dim=-1))
        return tuple(outputs)

    def _pool(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.pooling == "cls":
            return hidden[:, 0]
        if self.pooling == "lasttoken":  # rows are right-padded: the last attended token is at length - 1
            last = (mask.sum(dim=1) - 1).clamp(min=0)
            return torch.gather(hidden, 1, last.view(-1, 1, 1).expand(-1, 1, hidden.shape[-1])).squeeze(1)
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)

    def _splade(self, logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """sentence-transformers' SpladePooling: log1p(relu(logits)) (twice log1p for log1p_relu) of the
        real tokens (padding masked to 0), max or sum over the tokens: [batch, vocabulary]."""
        pooling, activation = self.splade or ("max", "relu")
        values = torch.log1p(torch.relu(logits * mask.unsqueeze(-1).to(logits.dtype)))
        if activation == "log1p_relu":
            values = torch.log1p(values)
        return values.amax(dim=1) if pooling == "max" else values.sum(dim=1)


def _flag_head(path: Path, hidden: int, name: str) -> nn.Linear:
    """A FlagEmbedding head (`sparse_linear.pt` / `colbert_linear.pt`: a torch.nn.Linear state dict)."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        out_features, in_features = state["weight"].shape
        head = nn.Linear(in_features, out_features, bias="bias" in state)
        head.load_state_dict(state)
    except Exception as exc:  # noqa: BLE001 - a corrupt or foreign file: say which one
        raise BuildError(f"cannot load the bge-m3 {name} head {path.name}: {str(exc).splitlines()[0]}") from None
    if in_features != hidden:
        raise BuildError(f"the bge-m3 {name} head {path.name} takes {in_features} features, the encoder gives {hidden}")
    return head.eval()


def load_repository_model(path: Path, settings: ResolvedSettings, attn_implementation: str | None = None) -> RepositoryModel:
    """Load the checkpoint at `path` in fp32 eval mode, wrapped for the repository interface."""
    kwargs: dict[str, object] = {"dtype": torch.float32}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    logits = settings.task in ("classify", "rerank")
    loader = AutoModelForSequenceClassification if logits else (
        AutoModelForMaskedLM if settings.task == "sparse-embed" else AutoModel)
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
    hidden = int(getattr(model.config, "hidden_size", 0) or 0)
    sparse = _flag_head(path / SPARSE_HEAD_FILE, hidden, "sparse") if "sparse" in settings.flag_heads else None
    colbert = _flag_head(path / COLBERT_HEAD_FILE, hidden, "colbert") if "colbert" in settings.flag_heads else None
    splade = (settings.splade_pooling or "max", settings.splade_activation or "relu")
    return RepositoryModel(model.eval(), settings.task, settings.pooling, token_outputs=bool(settings.token_outputs),
                           sparse_head=sparse, colbert_head=colbert,
                           splade=splade if settings.task == "sparse-embed" else None).eval()


def example_inputs(batch: int, seq: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Dummy int32 inputs for tracing."""
    ids = torch.full((batch, seq), 5, dtype=torch.int32)
    mask = torch.ones((batch, seq), dtype=torch.int32)
    return ids, mask, torch.zeros((batch, seq), dtype=torch.int32)


def export_onnx(model: RepositoryModel, output_names: list[str], path: Path, opset: int) -> None:
    """Export with dynamic batch and sequence axes (TorchScript exporter: stable, optimizer-friendly); the
    first output is per text [batch, ...], the others per token [batch, sequence, ...]."""
    axes = {name: {0: "batch", 1: "sequence"} for name in INPUT_NAMES}
    axes[output_names[0]] = {0: "batch"}
    for name in output_names[1:]:
        axes[name] = {0: "batch", 1: "sequence"}
    with torch.no_grad(), warnings.catch_warnings():  # not inference_mode: it breaks tracing autograd.Functions
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            example_inputs(2, 16),
            str(path),
            input_names=list(INPUT_NAMES),
            output_names=list(output_names),
            dynamic_axes=axes,
            opset_version=opset,
            custom_opsets={"com.microsoft": 1},  # builder/attention.py's MultiHeadAttention, when used
            do_constant_folding=True,
            dynamo=False,
        )
