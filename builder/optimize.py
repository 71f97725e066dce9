"""Facts about an exported ONNX graph (operator counts, e.g. fused Attention nodes)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import onnx


def onnx_op_counts(path: Path) -> dict[str, int]:
    """Number of nodes per operator type in the main graph, most frequent first."""
    model = onnx.load(str(path), load_external_data=False)
    return dict(Counter(node.op_type for node in model.graph.node).most_common())


FUSED_OPS = ("Attention", "MultiHeadAttention", "PackedAttention", "PackedMultiHeadAttention",
             "SkipLayerNormalization", "EmbedLayerNormalization", "BiasGelu", "FastGelu", "Gelu", "LayerNormalization",
             "SkipSimplifiedLayerNormalization")


# protobuf cannot hold more than 2 GiB: larger models keep their weights in `model.onnx.data`.
EXTERNAL_DATA_THRESHOLD = 1_800_000_000


def exported_size(path: Path) -> int:
    """Bytes of an exported model, counting external-data files written beside it."""
    return sum(f.stat().st_size for f in path.parent.iterdir() if f.is_file())


def save_onnx(model: onnx.ModelProto, target: Path) -> None:
    """Write `model` as `target`: one file, or `target` + `target.name`.data above the protobuf limit."""
    large = model.ByteSize() > EXTERNAL_DATA_THRESHOLD
    onnx.save_model(model, str(target), save_as_external_data=large, all_tensors_to_one_file=True,
                    location=f"{target.name}.data")


def publish_onnx(source: Path, target: Path) -> None:
    """Write `source` (whose directory may hold torch's per-tensor external files) as `target`:
    one self-contained file, or `target` + `target.name`.data above the protobuf limit."""
    large = exported_size(source) > EXTERNAL_DATA_THRESHOLD
    model = onnx.load(str(source), load_external_data=True)
    onnx.save_model(model, str(target), save_as_external_data=large, all_tensors_to_one_file=True,
                    location=f"{target.name}.data")


# Kept in float32 by the float16 conversion: mean pooling sums up to max_seq_len rows of hidden
# states (an fp16 sum of 512 activations of a few hundred overflows), and the mask arithmetic.
FP32_POOLING_OPS = ("Mul", "ReduceSum", "Div", "Clip")


def repair_float16_graph(model: onnx.ModelProto) -> None:
    """Drop duplicate nodes and rename nodes that share a name.

    onnxruntime 1.31's float16 conversion inserts, for a tensor read by several blocked (float32)
    operators, one identical Cast per reader, all under the same node and output name; onnxruntime
    then refuses the model ("Duplicate definition of name"). A node that recomputes an output an
    identical earlier node already defines is removed; any other duplicate definition is an error.
    """
    graph = model.graph
    defined: dict[str, onnx.NodeProto] = {}
    keep = []
    for node in graph.node:
        twin = next((defined[o] for o in node.output if o in defined), None)
        if twin is not None:
            same = (twin.op_type == node.op_type and list(twin.input) == list(node.input)
                    and list(twin.output) == list(node.output) and list(twin.attribute) == list(node.attribute))
            if not same:
                raise ValueError(f"node {node.name!r} redefines {list(node.output)} differently")
            continue
        defined.update({o: node for o in node.output if o})
        keep.append(node)
    if len(keep) < len(graph.node):
        del graph.node[:]
        graph.node.extend(keep)
    seen: set[str] = set()
    for node in graph.node:
        if node.name in seen:
            n = 1
            while f"{node.name}_{n}" in seen:
                n += 1
            node.name = f"{node.name}_{n}"
        seen.add(node.name)


def optimize_for_onnxruntime(source: Path, target: Path, num_heads: int, hidden_size: int, *,
                             float16: bool = False, multi_head_attention: bool = False) -> dict[str, int]:
    """Run onnxruntime's transformer optimizer (BERT fusions) from `source` into `target`.

    With `float16` the fused graph is converted to float16 (inputs and outputs keep their types,
    pooling stays float32), the form onnxruntime's CUDA provider runs fastest. With
    `multi_head_attention` attention fuses into MultiHeadAttention (separate Q/K/V projections, what
    the packed layout's PackedMultiHeadAttention takes: builder/packing.py) instead of Attention.
    Returns the fused-operator counts of the result.
    """
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST
    from onnxruntime.transformers.fusion_options import FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    options = FusionOptions("bert")
    options.use_multi_head_attention = multi_head_attention
    # Not fused: onnxruntime 1.31's RotaryEmbedding fusion (ModernBERT) keeps the export's position_ids [1, S],
    # which its CUDA kernel refuses for any batch over 1 ("dimension 0 should be of size batch_size"); its CPU
    # kernel takes them.
    options.enable_rotary_embeddings = False
    optimized = optimize_model(str(source), model_type="bert", num_heads=num_heads, hidden_size=hidden_size,
                               opt_level=0, use_gpu=float16, optimization_options=options)
    if float16:
        optimized.convert_float_to_float16(keep_io_types=True,
                                           op_block_list=[*DEFAULT_OP_BLOCK_LIST, *FP32_POOLING_OPS])
        repair_float16_graph(optimized.model)
    optimized.save_model_to_file(str(target), use_external_data_format=exported_size(source) > EXTERNAL_DATA_THRESHOLD)
    counts = onnx_op_counts(target)
    return {op: counts[op] for op in FUSED_OPS if op in counts}
