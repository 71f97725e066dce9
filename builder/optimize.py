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


# protobuf cannot hold more than 2 GiB: larger models keep their weights in `model.onnx.data`.
EXTERNAL_DATA_THRESHOLD = 1_800_000_000


def exported_size(path: Path) -> int:
    """Bytes of an exported model, counting external-data files written beside it."""
    return sum(f.stat().st_size for f in path.parent.iterdir() if f.is_file())


def publish_onnx(source: Path, target: Path) -> None:
    """Write `source` (whose directory may hold torch's per-tensor external files) as `target`:
    one self-contained file, or `target` + `target.name`.data above the protobuf limit."""
    large = exported_size(source) > EXTERNAL_DATA_THRESHOLD
    model = onnx.load(str(source), load_external_data=True)
    onnx.save_model(model, str(target), save_as_external_data=large, all_tensors_to_one_file=True,
                    location=f"{target.name}.data")


def optimize_for_onnxruntime(source: Path, target: Path, num_heads: int, hidden_size: int) -> dict[str, int]:
    """Run onnxruntime's transformer optimizer (BERT fusions, fp32) from `source` into `target`.

    Returns the fused-operator counts of the result.
    """
    from onnxruntime.transformers.optimizer import optimize_model

    optimized = optimize_model(str(source), model_type="bert", num_heads=num_heads, hidden_size=hidden_size,
                               opt_level=0, use_gpu=False)
    optimized.save_model_to_file(str(target), use_external_data_format=exported_size(source) > EXTERNAL_DATA_THRESHOLD)
    counts = onnx_op_counts(target)
    return {op: counts[op] for op in FUSED_OPS if op in counts}
