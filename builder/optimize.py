"""Facts about an exported ONNX graph (operator counts, e.g. fused Attention nodes)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import onnx


def onnx_op_counts(path: Path) -> dict[str, int]:
    """Number of nodes per operator type in the main graph, most frequent first."""
    model = onnx.load(str(path), load_external_data=False)
    return dict(Counter(node.op_type for node in model.graph.node).most_common())
