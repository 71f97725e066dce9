"""A PyTorch forward of the packed layout (contract/packing.py): the reference the packed graph is tested
against, and the PyTorch varlen peer of `loadtest.packed_step`.

`packed_output(model, ids, types, cu, max_seqlen)` runs a builder.export.RepositoryModel (a Hugging Face
BERT or RoBERTa/XLM-R encoder with its pooling or classifier head) on rows back to back: embeddings with
position ids restarting per row (after padding_idx for RoBERTa), each layer's attention block-diagonal
(a token attends to its own row only), pooling and the head on [T, H]. No padded tensor anywhere except
inside the `loop` attention's per-row calls. Attention implementations (q, k, v: [T, heads, head_dim]):
- `loop`: one SDPA call per row (the plainest statement of varlen attention; CPU and CUDA);
- `nested`: SDPA on nested jagged tensors (CPU math; flash/efficient kernels on CUDA);
- `varlen`: torch.nn.attention.varlen.varlen_attn (FlashAttention varlen; CUDA, fp16/bf16, torch >= 2.10).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]


def segment_ids(cu: torch.Tensor, total: int) -> torch.Tensor:
    """The row of every token, [T] int64 (output_size given: no device->host copy)."""
    lengths = (cu[1:] - cu[:-1]).long()
    return torch.repeat_interleave(torch.arange(len(lengths), device=cu.device), lengths, output_size=total)


def position_ids(cu: torch.Tensor, total: int) -> torch.Tensor:
    """Position of every token inside its row, restarting at 0, [T] int64."""
    return torch.arange(total, device=cu.device) - cu[:-1].long()[segment_ids(cu, total)]


def token_offset(cu: np.ndarray, width: int) -> np.ndarray:
    """onnxruntime's RemovePadding token_offset [rows, width] (getTokenOffset in contrib_ops/cuda/bert/
    bert_padding.cu): the padded slot b*width+s of every real token in packed order, then every padding slot."""
    lengths = np.diff(np.asarray(cu))
    real = [b * width + s for b, n in enumerate(lengths) for s in range(n)]
    pads = [b * width + s for b, n in enumerate(lengths) for s in range(n, width)]
    return np.asarray(real + pads, np.int32).reshape(len(lengths), width)


def attention_loop(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_seqlen: int) -> torch.Tensor:
    bounds = cu.tolist()
    return torch.cat([F.scaled_dot_product_attention(q[a:b].transpose(0, 1), k[a:b].transpose(0, 1),
                                                     v[a:b].transpose(0, 1)).transpose(0, 1)
                      for a, b in zip(bounds[:-1], bounds[1:])])


def attention_nested(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_seqlen: int) -> torch.Tensor:
    def jagged(x: torch.Tensor) -> torch.Tensor:  # [T, h, d] -> [B, h, j, d]
        return torch.nested.nested_tensor_from_jagged(x, cu.long(), max_seqlen=max_seqlen).transpose(1, 2)

    return F.scaled_dot_product_attention(jagged(q), jagged(k), jagged(v)).transpose(1, 2).values()


def attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor, max_seqlen: int) -> torch.Tensor:
    from torch.nn.attention.varlen import varlen_attn  # the 7 positional arguments every release since 2.10 takes

    return varlen_attn(q, k, v, cu, cu, max_seqlen, max_seqlen)


ATTENTIONS: dict[str, Attention] = {"loop": attention_loop, "nested": attention_nested, "varlen": attention_varlen}


def _encoder(hf: torch.nn.Module) -> torch.nn.Module:
    """The BertModel / RobertaModel inside a Hugging Face model (itself for a base model)."""
    for name in ("bert", "roberta"):
        if hasattr(hf, name):
            return getattr(hf, name)
    return hf


@torch.inference_mode()
def packed_hidden(encoder: torch.nn.Module, input_ids: torch.Tensor, token_type_ids: torch.Tensor, cu: torch.Tensor,
                  max_seqlen: int, attention: Attention = attention_loop) -> torch.Tensor:
    """Last hidden state [T, H] of a BERT/RoBERTa encoder (eval mode) on packed rows."""
    total = input_ids.shape[0]
    emb = encoder.embeddings
    positions = position_ids(cu, total)
    if getattr(emb, "padding_idx", None) is not None and encoder.config.model_type != "bert":
        positions = positions + emb.padding_idx + 1  # RoBERTa/XLM-R: positions start after padding_idx
    x = emb.word_embeddings(input_ids.long()) + emb.position_embeddings(positions)
    x = emb.LayerNorm(x + emb.token_type_embeddings(token_type_ids.long()))
    heads = encoder.config.num_attention_heads
    head_dim = encoder.config.hidden_size // heads
    for layer in encoder.encoder.layer:
        sa = layer.attention.self
        q, k, v = (proj(x).view(total, heads, head_dim) for proj in (sa.query, sa.key, sa.value))
        context = attention(q, k, v, cu, max_seqlen).reshape(total, heads * head_dim)
        x = layer.attention.output.LayerNorm(layer.attention.output.dense(context) + x)
        inner = layer.intermediate.intermediate_act_fn(layer.intermediate.dense(x))
        x = layer.output.LayerNorm(layer.output.dense(inner) + x)
    return x


def pool(hidden: torch.Tensor, cu: torch.Tensor, pooling: str) -> torch.Tensor:
    """[T, H] -> [B, H] float32: mean over each row's tokens, its first token (cls) or its last (lasttoken)."""
    starts, ends = cu[:-1].long(), cu[1:].long()
    if pooling == "cls":
        return hidden[starts].float()
    if pooling == "lasttoken":
        return hidden[ends - 1].float()
    sums = torch.zeros(len(starts), hidden.shape[1], dtype=torch.float32, device=hidden.device)
    sums.index_add_(0, segment_ids(cu, hidden.shape[0]), hidden.float())
    return sums / (ends - starts).unsqueeze(1).float()


@torch.inference_mode()
def packed_output(model: torch.nn.Module, input_ids: torch.Tensor, token_type_ids: torch.Tensor, cu: torch.Tensor,
                  max_seqlen: int, attention: Attention = attention_loop) -> torch.Tensor:
    """What a builder.export.RepositoryModel returns, computed on packed rows: logits or pooled embeddings."""
    hf = model.model
    encoder = _encoder(hf)
    cu = cu.to(input_ids.device)
    hidden = packed_hidden(encoder, input_ids, token_type_ids, cu, max_seqlen, attention)
    if model.task in ("classify", "rerank"):
        first = hidden[cu[:-1].long()]
        if hasattr(hf, "bert"):  # BertForSequenceClassification: pooler (dense + tanh), then the classifier
            return hf.classifier(encoder.pooler(first.unsqueeze(1))).float()
        return hf.classifier(first.unsqueeze(1)).float()  # RobertaClassificationHead reads features[:, 0]
    return pool(hidden, cu, model.pooling or "mean")
