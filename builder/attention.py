"""Fused attention in the exported graph for models onnxruntime's transformer optimizer cannot fuse.

onnxruntime's optimizer fuses BERT-style attention, but not ModernBERT's (rotary position embeddings,
and every third layer global while the others attend within a sliding window applied as an S x S mask):
its graph kept every layer's attention as MatMul/Softmax ops over [batch, heads, S, S] scores (fused
ops on the tiny ModernBERT: SkipLayerNormalization 6, Gelu 3, LayerNormalization 1, no Attention).

Here the export writes onnxruntime's `com.microsoft.MultiHeadAttention` itself: transformers calls the
attention function registered as `ort_mha` (`attn_implementation="ort_mha"`) with the rotated queries and
keys; under `torch.onnx.export` it becomes one MultiHeadAttention node per layer, with the padding as a
`key_padding_mask` [batch, S] and, on sliding-window layers, the window as an additive `attention_bias`
[1, 1, S, S] shared by the batch (onnxruntime's CUDA kernels then run memory-efficient attention, or
flash attention on the global layers, instead of materialising the scores). In PyTorch the same
function computes the attention with SDPA, so the build's parity check compares the fused graph with the
eager model.

The plain export (eager attention, standard ops) is still what TensorRT parses.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Protocol

import torch
from transformers import AttentionInterface, AttentionMaskInterface

ATTENTION = "ort_mha"
# model types whose attention the export fuses itself (onnxruntime's optimizer fuses BERT-style ones)
FUSED_EXPORT_TYPES = frozenset({"modernbert"})
MASK_FILTER = -10000.0  # onnxruntime's mask_filter_value: representable in fp16, exp() of it is 0

_padding: list[torch.Tensor] = []  # the [batch, S] attention mask of the forward being run


@contextlib.contextmanager
def padding_mask(mask: torch.Tensor) -> Iterator[None]:
    """Make the batch's [batch, S] attention mask (1 = token) known to the attention function."""
    _padding.append(mask)
    try:
        yield
    finally:
        _padding.pop()


def window_bias(length: torch.Tensor | int, window: int, dtype: torch.dtype) -> torch.Tensor:
    """[1, 1, S, S] additive bias: 0 where |i - j| <= window, MASK_FILTER elsewhere."""
    index = torch.arange(length)  # type: ignore[arg-type]  # a 0-d tensor while tracing: the length stays dynamic
    distance = (index.unsqueeze(0) - index.unsqueeze(1)).abs()
    zero = torch.zeros((), dtype=dtype)
    return torch.where(distance <= window, zero, zero + MASK_FILTER).unsqueeze(0).unsqueeze(0)


def _sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, key_padding_mask: torch.Tensor,
          attention_bias: torch.Tensor | None, num_heads: int, scale: float) -> torch.Tensor:
    """What MultiHeadAttention computes, in PyTorch: q, k, v [B, S, H*D] -> [B, S, H*D]."""
    batch, length, hidden = query.shape

    def heads(x: torch.Tensor) -> torch.Tensor:
        return x.view(batch, length, num_heads, hidden // num_heads).transpose(1, 2)

    bias = torch.where(key_padding_mask.bool()[:, None, None, :], 0.0, MASK_FILTER).to(query.dtype)
    if attention_bias is not None:
        bias = bias + attention_bias
    out = torch.nn.functional.scaled_dot_product_attention(heads(query), heads(key), heads(value), attn_mask=bias,
                                                           scale=scale)
    return out.transpose(1, 2).reshape(batch, length, hidden)


class _MultiHeadAttention(torch.autograd.Function):
    """Global attention: SDPA in PyTorch, com.microsoft.MultiHeadAttention with a key padding mask in ONNX."""

    @staticmethod
    def forward(ctx: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, qkv_bias: torch.Tensor,
                key_padding_mask: torch.Tensor, num_heads: int, scale: float) -> torch.Tensor:
        return _sdpa(query, key, value, key_padding_mask, None, num_heads, scale)

    @staticmethod
    def symbolic(g: Any, query: Any, key: Any, value: Any, qkv_bias: Any, key_padding_mask: Any, num_heads: int,
                 scale: float) -> Any:
        return g.op("com.microsoft::MultiHeadAttention", query, key, value, qkv_bias, key_padding_mask,
                    num_heads_i=num_heads, scale_f=scale, mask_filter_value_f=MASK_FILTER)


class _WindowedMultiHeadAttention(torch.autograd.Function):
    """Sliding-window attention: the same, with the window as an additive attention_bias [1, 1, S, S]."""

    @staticmethod
    def forward(ctx: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, qkv_bias: torch.Tensor,
                key_padding_mask: torch.Tensor, attention_bias: torch.Tensor, num_heads: int,
                scale: float) -> torch.Tensor:
        return _sdpa(query, key, value, key_padding_mask, attention_bias, num_heads, scale)

    @staticmethod
    def symbolic(g: Any, query: Any, key: Any, value: Any, qkv_bias: Any, key_padding_mask: Any,
                 attention_bias: Any, num_heads: int, scale: float) -> Any:
        return g.op("com.microsoft::MultiHeadAttention", query, key, value, qkv_bias, key_padding_mask,
                    attention_bias, num_heads_i=num_heads, scale_f=scale, mask_filter_value_f=MASK_FILTER)


class _AttentionModule(Protocol):
    """What the interface reads of transformers' attention module."""

    config: Any
    head_dim: int


def ort_mha_attention(module: _AttentionModule, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, scaling: float | None = None,
                      sliding_window: int | None = None, **_: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: q, k, v [B, H, S, D] (rotated) -> ([B, S, H, D], None)."""
    if not _padding:
        raise RuntimeError(f"attn_implementation={ATTENTION!r} runs inside builder.attention.padding_mask() only")
    batch, length = query.shape[0], query.shape[2]
    # plain ints, not sizes read from traced tensors (the tracer cannot pass those to an autograd.Function)
    heads, dim = int(module.config.num_attention_heads), int(module.head_dim)
    mask = _padding[-1].to(torch.int32)

    def flat(x: torch.Tensor) -> torch.Tensor:
        return x.transpose(1, 2).reshape(batch, length, heads * dim)

    # ModernBERT hands flash attention its half window + 1 (inclusive bounds); its masks allow |i - j| <= half
    zeros = torch.zeros(3 * heads * dim, dtype=query.dtype)  # MultiHeadAttention's q/k/v bias: none here
    scale = float(scaling if scaling is not None else dim ** -0.5)
    if sliding_window:
        bias = window_bias(length, sliding_window - 1, query.dtype)
        out = _WindowedMultiHeadAttention.apply(flat(query), flat(key), flat(value), zeros, mask, bias, heads, scale)
    else:
        out = _MultiHeadAttention.apply(flat(query), flat(key), flat(value), zeros, mask, heads, scale)
    return out.view(batch, length, heads, dim), None


def _no_mask(*_: Any, **__: Any) -> None:
    """The fused attention builds its own masks: transformers need not make [B, 1, S, S] ones."""
    return None


AttentionInterface.register(ATTENTION, ort_mha_attention)
AttentionMaskInterface.register(ATTENTION, _no_mask)
