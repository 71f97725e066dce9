"""Facts about an exported ONNX graph (operator counts, e.g. fused Attention nodes)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import onnx


def onnx_op_counts(path: Path) -> dict[str, int]:
    """Number of nodes per operator type in the main graph, most frequent first."""
    model = onnx.load(str(path), load_external_data=False)
    return dict(Counter(node.op_type for node in model.graph.node).most_common())


FUSED_OPS = ("Attention", "MultiHeadAttention", "SkipLayerNormalization", "EmbedLayerNormalization",
             "BiasGelu", "FastGelu", "Gelu", "LayerNormalization", "SkipSimplifiedLayerNormalization")


def optimize_for_onnxruntime(source: Path, target: Path, num_heads: int, hidden_size: int) -> dict[str, int]:
    """Run onnxruntime's transformer optimizer (BERT fusions, fp32) from `source` into `target`.

    Returns the fused-operator counts of the result.
    """
    from onnxruntime.transformers.optimizer import optimize_model

    optimized = optimize_model(str(source), model_type="bert", num_heads=num_heads, hidden_size=hidden_size,
                               opt_level=0, use_gpu=False)
    optimized.save_model_to_file(str(target))
    counts = onnx_op_counts(target)
    return {op: counts[op] for op in FUSED_OPS if op in counts}
