"""The packed model step's graph (docs/contract.md "Packed model steps"): only real tokens are computed.

From the optimizer's MultiHeadAttention-fused graph (fp16 on GPU builds), in two steps:

1. onnxruntime's packing mode (`BertOnnxModel.convert_to_packing_mode`): RemovePadding after the
   embeddings, PackedMultiHeadAttention in every layer, RestorePadding after the last LayerNorm.
   Its interface is still padded ([B, S] ids + mask), and RemovePadding reads the token count back
   to the host once per call.
2. The rewrite to the truly packed interface `input_ids [T]`, `token_type_ids [T]`,
   `cu_seqlens [B + 1]`, plus the index tensors the runner derives from cu_seqlens on the host
   (contract/packing.py `PackedRows.feed`): `token_offset [B, S]` (onnxruntime's RemovePadding layout,
   S the longest row), `position_ids [T]` and, for mean pooling, `token_rows [T]` and `row_ids [B]`
   (int32), output `[B, out]`. RemovePadding and RestorePadding are gone; no value becomes a shape
   and nothing is copied back to the host inside the graph; the embeddings run on the T tokens with
   the fed position ids (plus the RoBERTa/XLM-R offset); pooling (mean, CLS, last token) and the
   classifier head run on [T, H]; per-token outputs (the last hidden state, bge-m3's heads) come out
   [T, ...], their ops' axes adapted.

Two forms of the same contract:
- GPU form (`gpu`): PackedMultiHeadAttention, which onnxruntime's CUDA provider runs with
  FlashAttention-2 varlen on SM80+ in fp16. onnxruntime has no CPU kernel for it (1.32): a CPU
  session refuses the graph, naming the op.
- CPU form (`cpu`): the same graph, every node shared except attention: each PackedMultiHeadAttention
  becomes the CPU MultiHeadAttention op on that layer's tokens scattered into [B, max_seqlen] rows
  with the fed token_offset (attention only is padded; the GEMMs run on [T, H]), gathered
  back to [T, H] after.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from builder.graph_edit import (
    MS_DOMAIN,
    NodeWriter,
    attribute,
    constant_value,
    consumers,
    ensure_opset,
    producers,
    prune,
    the_node,
    topological_sort,
)
from contract import CU_SEQLENS, INPUT_IDS, POSITION_IDS, ROW_IDS, TOKEN_OFFSET, TOKEN_ROWS, TOKEN_TYPE_IDS

PackedForm = Literal["gpu", "cpu"]
# the embedding table a Gather feeds, by the graph input it reads (anything else: the position table)
_EMBEDDING_KINDS: dict[str | None, str] = {INPUT_IDS: "word", TOKEN_TYPE_IDS: "type"}
GPU_ATTENTION = "PackedMultiHeadAttention"  # what the builder ships (FlashAttention varlen on SM90)
CPU_ATTENTION = "MultiHeadAttention"
# fused attention -> its packed op (packing mode) -> where that op reads token_offset. The builder fuses
# MultiHeadAttention; the Attention form (PackedAttention: one QKV GEMM, TensorRT fused kernels on SM 70-89,
# CUTLASS memory-efficient attention on SM90) is kept for loadtest/packed_step.py's comparison.
PACKED_OPS = {"MultiHeadAttention": "PackedMultiHeadAttention", "Attention": "PackedAttention"}
_TOKEN_OFFSET_INPUT = {"PackedMultiHeadAttention": 4, "PackedAttention": 3}
# Model families whose optimized graph the rewrite knows (fused or unfused BERT/RoBERTa embeddings, a head
# that starts with hidden[:, 0]); tested on BERT and RoBERTa. Others keep the padded layout.
PACKED_FAMILIES = frozenset({"bert", "roberta", "xlm-roberta", "camembert"})
# Families whose position ids start after padding_idx (HF's create_position_ids_from_input_ids).
_OFFSET_FAMILIES = frozenset({"roberta", "xlm-roberta", "camembert"})
_I32, _I64, _F32 = TensorProto.INT32, TensorProto.INT64, TensorProto.FLOAT


class PackingError(ValueError):
    """The optimized graph does not have the structure the packed rewrite needs."""


def position_offset(model_type: str, pad_token_id: int | None) -> int:
    """First position id of a row: pad_token_id + 1 for RoBERTa-style families, else 0."""
    return int(pad_token_id or 0) + 1 if model_type in _OFFSET_FAMILIES else 0


def packed_model(optimized: onnx.ModelProto, *, task: str, pooling: str | None, num_heads: int, hidden_size: int,
                 offset: int = 0, form: PackedForm = "gpu") -> onnx.ModelProto:
    """The packed graph (GPU or CPU form) of an optimized graph with fused MultiHeadAttention (or Attention)."""
    packed = truly_packed(ort_packing_mode(optimized, num_heads, hidden_size), task=task, pooling=pooling,
                          offset=offset)
    return merge_qkv(packed) if form == "gpu" else cpu_form(packed)


def merge_qkv(packed: onnx.ModelProto) -> onnx.ModelProto:
    """The GPU form's query, key and value projections as one GEMM per layer (in place; returns `packed`).

    PackedMultiHeadAttention reads a packed QKV input [T, N, 3, head] (query alone, key and value empty) and adds
    its bias, still laid out [q | k | v], itself (onnxruntime's packed_multihead_attention_impl.cu, the TN3H
    kernels). So the three [H, H] weights become one [H, 3H] whose columns go head by head (q, k, v of head 0,
    then of head 1, ...), and a Reshape to [T, N, 3, head] feeds the attention: three MatMuls become a MatMul and
    a Reshape, a wider GEMM at the small token counts where launches dominate. A layer whose three projections are
    not plain MatMuls of one input by constant weights is left as it is."""
    g = packed.graph
    made_by = producers(g)
    inits = {i.name: i for i in g.initializer}
    w = NodeWriter(g, "qkv/")
    for node in [n for n in g.node if n.op_type == GPU_ATTENTION]:
        found = [made_by.get(name) for name in node.input[:3]]
        projections = [p for p in found if p is not None and p.op_type == "MatMul" and p.input[1] in inits]
        if len(projections) != 3:
            continue
        if len({p.input[0] for p in projections}) != 1 or any(len(consumers(g, p.output[0])) != 1 for p in projections):
            continue
        heads = int(attribute(node, "num_heads"))
        weights = [numpy_helper.to_array(inits[p.input[1]]) for p in projections]
        if len({wt.shape for wt in weights}) != 1 or weights[0].shape[1] % heads:
            continue
        hidden, width = weights[0].shape
        head = width // heads
        # [H, 3, N, head] -> [H, N, 3, head] -> [H, N * 3 * head]
        merged = np.stack(weights, axis=1).reshape(hidden, 3, heads, head).transpose(0, 2, 1, 3).reshape(hidden, -1)
        qkv = w.op("MatMul", [projections[0].input[0], w.const("weight", merged)])
        node.input[0] = w.op("Reshape", [qkv, w.const("shape", [0, heads, 3, head], np.int64)])
        node.input[1], node.input[2] = "", ""
        for projection in projections:
            g.node.remove(projection)
    prune(g, [o.name for o in g.output])
    topological_sort(g)
    return packed


def ort_packing_mode(optimized: onnx.ModelProto, num_heads: int, hidden_size: int) -> onnx.ModelProto:
    """Step 1: onnxruntime's packing mode (a copy; the padded interface stays)."""
    from onnxruntime.transformers.onnx_model_bert import BertOnnxModel

    model = onnx.ModelProto.FromString(optimized.SerializeToString())
    ensure_opset(model)
    ops = {n.op_type for n in model.graph.node} & set(PACKED_OPS)
    if len(ops) != 1:
        raise PackingError(f"the optimized graph has no fused MultiHeadAttention to pack (fused: {sorted(ops)})")
    (fused_op,) = ops
    fused = sum(n.op_type == fused_op for n in model.graph.node)
    bert = BertOnnxModel(model, num_heads, hidden_size)
    bert.convert_to_packing_mode(use_symbolic_shape_infer=False)  # its shapes are cleared by the rewrite anyway
    packed = sum(n.op_type == PACKED_OPS[fused_op] for n in bert.model.graph.node)
    if packed != fused:  # the tool returns quietly on graphs it does not support
        raise PackingError(f"onnxruntime's packing mode converted {packed} of {fused} {fused_op} nodes")
    return bert.model


@dataclass(frozen=True)
class _Indices:
    """Row bounds computed in the graph from cu_seqlens (int32, [B] each; only what is read stays, prune drops
    the rest). The index tensors are graph inputs the runner feeds (contract/packing.py)."""

    starts: str  # first token of each row
    ends: str  # one past its last token
    lengths: str


def _indices(w: NodeWriter) -> _Indices:
    """Row bounds from cu_seqlens [B+1]: two Slices and a Sub on the GPU. Everything that needs the longest row
    or a token's row (token_offset, position_ids, token_rows, row_ids) is a graph input the host fills: computed
    in the graph they took ~45 nodes, some of them on the CPU behind a device-to-host copy, on every call."""
    zero, one, last = w.const("zero", [0], np.int64), w.const("one", [1], np.int64), w.const("last", [-1], np.int64)
    axis0 = w.const("axis0", [0], np.int64)
    starts = w.op("Slice", [CU_SEQLENS, zero, last, axis0])
    ends = w.op("Slice", [CU_SEQLENS, one, w.const("end", [2**31 - 1], np.int64), axis0])
    return _Indices(starts=starts, ends=ends, lengths=w.op("Sub", [ends, starts]))


def _add_input(g: onnx.GraphProto, name: str, dims: list[str]) -> None:
    if not any(i.name == name for i in g.input):
        g.input.append(helper.make_tensor_value_info(name, _I32, dims))


def _pool(w: NodeWriter, g: onnx.GraphProto, hidden: str, idx: _Indices, pooling: str, float16: bool) -> str:
    """[T, H] -> [B, H] float32. Mean: a [B, T] membership matrix (1 where the token is the row's: row_ids
    against token_rows, both fed) times the hidden states, divided by the lengths: one GEMM, deterministic,
    2*B*T*H flops (B / (144 * H) of a 12-layer encoder's work)."""
    axis0, axis1 = w.const("axis0", [0], np.int64), w.const("axis1", [1], np.int64)
    if pooling in ("cls", "lasttoken"):
        index = idx.starts if pooling == "cls" else w.op("Sub", [idx.ends, w.const("one", [1], np.int32)])
        picked = w.op("Gather", [hidden, index], axis=0)
        return w.op("Cast", [picked], to=_F32) if float16 else picked
    if pooling != "mean":
        raise PackingError(f"pooling {pooling!r} has no packed form")
    _add_input(g, TOKEN_ROWS, ["tokens"])
    _add_input(g, ROW_IDS, ["rows"])
    hidden32 = w.op("Cast", [hidden], to=_F32) if float16 else hidden
    member = w.op("Equal", [w.op("Unsqueeze", [ROW_IDS, axis1]), w.op("Unsqueeze", [TOKEN_ROWS, axis0])])
    sums = w.op("MatMul", [w.op("Cast", [member], to=_F32), hidden32])
    return w.op("Div", [sums, w.op("Unsqueeze", [w.op("Cast", [idx.lengths], to=_F32), axis1])])


def truly_packed(model: onnx.ModelProto, *, task: str, pooling: str | None, offset: int = 0) -> onnx.ModelProto:
    """Step 2 (a copy): onnxruntime's packing-mode graph with the packed interface. PackingError when the graph
    does not have the structure this expects."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    g = model.graph
    try:
        remove, restore = the_node(g, "RemovePadding"), the_node(g, "RestorePadding")
    except ValueError as exc:
        raise PackingError(f"not a packing-mode graph: {exc}") from None
    output, per_token = g.output[0], list(g.output[1:])
    if per_token and task != "embed":
        raise PackingError(f"per-token outputs of a {task} graph: {[o.name for o in per_token]}")
    w = NodeWriter(g, "packed/")
    old_inputs = [i.name for i in g.input]
    del g.input[:]
    g.input.extend([helper.make_tensor_value_info(INPUT_IDS, _I32, ["tokens"]),
                    helper.make_tensor_value_info(TOKEN_TYPE_IDS, _I32, ["tokens"]),
                    helper.make_tensor_value_info(CU_SEQLENS, _I32, ["rows_plus_1"]),
                    helper.make_tensor_value_info(TOKEN_OFFSET, _I32, ["rows", "max_seqlen"]),
                    helper.make_tensor_value_info(POSITION_IDS, _I32, ["tokens"])])
    idx = _indices(w)
    positions = POSITION_IDS
    if offset:
        positions = w.op("Add", [positions, w.const("position_offset", [offset], np.int32)])
    hidden = remove.input[0]
    float16 = _rewire_embeddings(g, w, hidden, positions, old_inputs)
    if consumers(g, remove.output[3]):
        raise PackingError("RemovePadding's max_seq_len output is read by the graph")
    for source, target in ((hidden, remove.output[0]), (TOKEN_OFFSET, remove.output[1]),
                           (CU_SEQLENS, remove.output[2])):
        w.op("Identity", [source], [target])
    g.node.remove(remove)
    packed_hidden, restored = restore.input[0], restore.output[0]
    g.node.remove(restore)
    if task == "embed":
        for node in [n for n in g.node if output.name in n.output]:
            g.node.remove(node)  # the padded pooling; prune drops what only it read
        w.op("Identity", [_pool(w, g, packed_hidden, idx, pooling or "mean", float16)], [output.name])
        # per-token outputs: their ops (or the output itself) now read the packed [T, hidden] states
        w.op("Identity", [packed_hidden], [restored])
    else:
        _repoint_head(g, restored, packed_hidden, idx.starts)
    _first_dim(output, "rows")
    for tensor in per_token:  # [batch, sequence, ...] -> [tokens, ...]
        dims = tensor.type.tensor_type.shape.dim
        if len(dims) >= 2:
            del dims[0]
        _first_dim(tensor, "tokens")
    del g.value_info[:]
    prune(g, [o.name for o in g.output])
    ensure_opset(model)
    try:
        topological_sort(g)
    except ValueError as exc:  # a node still reads the padded interface (attention_mask, RestorePadding's output)
        raise PackingError(f"the packed graph is incomplete: {exc}") from None
    if per_token:
        _shift_token_axes(g, w, restored)
    return model


# Ops whose axes are attributes or constant inputs: on the per-token path their data lost a dimension
# ([batch, sequence, ...] -> [tokens, ...]), so a positive axis >= 2 becomes one less (negative ones stay).
_AXIS_ATTRIBUTES = {"Softmax": "axis", "LogSoftmax": "axis", "LpNormalization": "axis", "Concat": "axis",
                    "Split": "axis", "Flatten": "axis", "ArgMax": "axis", "ArgMin": "axis", "Hardmax": "axis"}
_AXES_OPS = {"Squeeze", "Unsqueeze", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMax",
             "ReduceMean", "ReduceMin", "ReduceProd", "ReduceSum", "ReduceSumSquare"}
# rank-agnostic: elementwise, MatMul on the last axis, and shape plumbing that follows the data
_RANK_FREE = {"Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Relu", "Sigmoid", "Tanh", "Erf", "Gelu", "FastGelu",
              "BiasGelu", "Clip", "Max", "Min", "Abs", "Neg", "Exp", "Log", "Cast", "Identity", "MatMul",
              "Expand", "Shape", "Where", "Equal", "Less", "Greater", "Not", "LayerNormalization",
              "SkipLayerNormalization"}


def _shift_token_axes(g: onnx.GraphProto, w: NodeWriter, start: str) -> None:
    """Adapt the per-token ops downstream of `start` (now [T, ...]) to their data's lost leading dimension; a
    PackingError for an op that works across rows (axis 0 or 1 of [batch, sequence, ...]) or that this does not
    know."""
    shifted = {start}
    for node in list(g.node):
        if not any(name in shifted for name in node.input):
            continue
        if node.op_type != "Shape":  # a shape vector is plumbing for Expand and the like, not per-token data
            shifted.update(o for o in node.output if o)
        if node.op_type in _RANK_FREE:
            continue
        if node.op_type in _AXIS_ATTRIBUTES:
            _shift_attribute(node, _AXIS_ATTRIBUTES[node.op_type])
        elif node.op_type in _AXES_OPS:
            if any(a.name == "axes" for a in node.attribute):
                _shift_attribute(node, "axes")
            elif len(node.input) > 1 and node.input[1]:
                axes = constant_value(g, node.input[1])
                if axes is None:
                    raise PackingError(f"{node.op_type} {node.name!r} on a per-token output has computed axes")
                node.input[1] = w.const("token_axes", [_shifted(int(a), node) for a in axes.ravel()], np.int64)
            else:
                raise PackingError(f"{node.op_type} {node.name!r} reduces a per-token output over every axis")
        else:
            raise PackingError(f"{node.op_type} {node.name!r} on a per-token output has no packed form here")


def _shifted(axis: int, node: onnx.NodeProto) -> int:
    if 0 <= axis <= 1:
        raise PackingError(f"{node.op_type} {node.name!r} works across the batch or sequence axis of a per-token output")
    return axis - 1 if axis > 1 else axis


def _shift_attribute(node: onnx.NodeProto, name: str) -> None:
    for a in node.attribute:
        if a.name == name:
            if a.type == onnx.AttributeProto.INTS:
                values = [_shifted(int(v), node) for v in a.ints]
                del a.ints[:]
                a.ints.extend(values)
            else:
                a.i = _shifted(int(a.i), node)


def _first_dim(tensor: onnx.ValueInfoProto, name: str) -> None:
    dims = tensor.type.tensor_type.shape.dim
    if dims:
        dims[0].Clear()
        dims[0].dim_param = name


def _rewire_embeddings(g: onnx.GraphProto, w: NodeWriter, hidden: str, positions: str, old_inputs: list[str]) -> bool:
    """Make the embedding block compute `hidden` as [T, H] from the packed inputs; True when it is float16.

    Fused (BERT): EmbedLayerNormalization on [1, T] with explicit position ids and no mask, squeezed to [T, H].
    Its mask_index output stays named though nothing reads it: CUDA kernels of older onnxruntime write it
    unconditionally. Unfused (RoBERTa/XLM-R, whose cumsum position ids the optimizer does not fuse): the three
    table Gathers feeding the embedding LayerNorm get the packed indices."""
    inits = {i.name: i for i in g.initializer}
    made_by = producers(g)
    node = made_by.get(hidden)
    axis0 = w.const("axis0", [0], np.int64)
    if node is not None and node.op_type == "EmbedLayerNormalization":
        node.input[0] = w.op("Unsqueeze", [INPUT_IDS, axis0])
        if len(node.input) > 1 and node.input[1]:
            node.input[1] = w.op("Unsqueeze", [TOKEN_TYPE_IDS, axis0])
        node.input.extend([""] * (9 - len(node.input)))
        node.input[7] = ""
        node.input[8] = w.op("Unsqueeze", [positions, axis0])
        node.output[0] = f"{hidden}/1xT"
        w.op("Squeeze", [node.output[0], axis0], [hidden])
        return inits[node.input[2]].data_type == TensorProto.FLOAT16
    if node is None or node.op_type not in ("LayerNormalization", "SkipLayerNormalization"):
        found = node.op_type if node is not None else "a graph input"
        raise PackingError(f"the embeddings end in {found}, not EmbedLayerNormalization or LayerNormalization")
    tables: dict[str, onnx.NodeProto] = {}
    frontier, seen = [node], set()
    while frontier:
        current = frontier.pop()
        for name in current.input:
            parent = made_by.get(name)
            if parent is None or id(parent) in seen:
                continue
            seen.add(id(parent))
            if parent.op_type == "Gather" and parent.input[0] in inits:
                kind = _EMBEDDING_KINDS.get(_source_input(made_by, parent.input[1], old_inputs), "position")
                if kind in tables:
                    raise PackingError(f"two {kind} embedding tables feed the embedding LayerNorm")
                tables[kind] = parent
            elif parent.op_type in ("Add", "Cast", "LayerNormalization", "SkipLayerNormalization"):
                frontier.append(parent)
    if "word" not in tables or "position" not in tables:
        raise PackingError(f"embedding tables not found before the first attention (found {sorted(tables)})")
    tables["word"].input[1] = INPUT_IDS
    tables["position"].input[1] = positions
    if "type" in tables:
        tables["type"].input[1] = TOKEN_TYPE_IDS
    return inits[tables["word"].input[0]].data_type == TensorProto.FLOAT16


def _source_input(made_by: dict[str, onnx.NodeProto], name: str, inputs: list[str]) -> str | None:
    """The graph input a tensor is, through Cast/Identity only; None for anything computed."""
    while name not in inputs:
        node = made_by.get(name)
        if node is None or node.op_type not in ("Cast", "Identity"):
            return None
        name = node.input[0]
    return name


def _repoint_head(g: onnx.GraphProto, restored: str, packed_hidden: str, starts: str) -> None:
    """Classifier heads start with hidden[:, 0] (Gather axis 1, index 0): each row's first token is
    Gather(packed hidden, cu_seqlens[:-1], axis 0) in the packed layout."""
    heads = consumers(g, restored)
    first = heads[0] if len(heads) == 1 else None
    index = constant_value(g, first.input[1]) if first is not None and first.op_type == "Gather" else None
    if first is None or index is None or index.ndim != 0 or int(index) != 0 or attribute(first, "axis", 0) != 1:
        raise PackingError("the classifier head does not start with hidden[:, 0] (Gather axis 1, index 0)")
    first.input[0], first.input[1] = packed_hidden, starts
    del first.attribute[:]
    first.attribute.append(helper.make_attribute("axis", 0))


def cpu_form(packed: onnx.ModelProto) -> onnx.ModelProto:
    """The CPU form of a packed graph (a copy): each PackedMultiHeadAttention (PackedAttention) runs as the CPU
    MultiHeadAttention (Attention) op on its layer's tokens scattered into [B, max_seqlen] rows (token_offset),
    masked, then gathered back."""
    model = onnx.ModelProto.FromString(packed.SerializeToString())
    g = model.graph
    nodes = [n for n in g.node if n.op_type in _TOKEN_OFFSET_INPUT]
    if not nodes:
        raise PackingError(f"no {' or '.join(_TOKEN_OFFSET_INPUT)} node to replace")
    w = NodeWriter(g, "cpu_form/")
    zero, last = w.const("zero", [0], np.int64), w.const("last", [-1], np.int64)
    axis0, axis1 = w.const("axis0", [0], np.int64), w.const("axis1", [1], np.int64)
    token_offset = nodes[0].input[_TOKEN_OFFSET_INPUT[nodes[0].op_type]]
    offset_1d = w.op("Reshape", [token_offset, last])
    slots_shape = w.op("Shape", [token_offset])  # [B, S]
    total = w.op("Shape", [INPUT_IDS])  # [1] int64
    real = w.op("Cast", [w.op("Slice", [offset_1d, zero, total, axis0])], to=_I64)  # slot of each token
    # slot -> packed index of its token, or T (a zero row appended below) for padding slots
    padding = w.op("Add", [w.op("ConstantOfShape", [w.op("ReduceProd", [slots_shape], keepdims=1)],
                                value=helper.make_tensor("zero", _I64, [1], [0])), total])
    tokens = w.op("Range", [w.const("t0", 0, np.int64), w.op("Squeeze", [total, axis0]), w.const("t1", 1, np.int64)])
    slot_token = w.op("ScatterElements", [padding, real, tokens], axis=0)
    lengths = w.op("Sub", [w.op("Slice", [CU_SEQLENS, w.const("one", [1], np.int64),
                                          w.const("end", [2**31 - 1], np.int64), axis0]),
                           w.op("Slice", [CU_SEQLENS, zero, last, axis0])])
    longest = w.op("Slice", [slots_shape, w.const("s_at", [1], np.int64), w.const("s_end", [2], np.int64), axis0])
    slot = w.op("Range", [w.const("s0", 0, np.int64), w.op("Squeeze", [longest, axis0]), w.const("s1", 1, np.int64)])
    mask = w.op("Cast", [w.op("Less", [w.op("Unsqueeze", [slot, axis0]),
                                       w.op("Unsqueeze", [w.op("Cast", [lengths], to=_I64), axis1])])],
                to=_I32)  # [B, S], 1 on real tokens
    width_slice = (w.const("w0", [1], np.int64), w.const("w1", [2], np.int64))

    def to_rows(x: str) -> str:  # [T, D] -> [B, S, D], zeros in padding slots
        first = w.op("Slice", [x, zero, w.const("z1", [1], np.int64), axis0])
        with_zero = w.op("Concat", [x, w.op("Sub", [first, first])], axis=0)
        width = w.op("Slice", [w.op("Shape", [x]), *width_slice, axis0])
        return w.op("Reshape", [w.op("Gather", [with_zero, slot_token], axis=0),
                                w.op("Concat", [slots_shape, width], axis=0)])

    for node in nodes:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "PackedAttention":
            x, weights, bias = node.input[:3]
            rows = w.op("Attention", [to_rows(x), weights, bias, mask], domain=MS_DOMAIN, **attrs)
        else:
            q, k, v, bias = node.input[:4]
            if not k:  # packed QKV [T, N, 3, head] (merge_qkv): back to three [T, N * head]
                q, k, v = (w.op("Reshape", [w.op("Gather", [q, w.const("which", index, np.int64)], axis=2),
                                            w.const("flat", [0, -1], np.int64)]) for index in (0, 1, 2))
            rows = w.op(CPU_ATTENTION, [to_rows(q), to_rows(k), to_rows(v), bias, mask], domain=MS_DOMAIN, **attrs)
        depth = w.op("Slice", [w.op("Shape", [rows]), w.const("d0", [2], np.int64), w.const("d1", [3], np.int64),
                               axis0])
        flat = w.op("Reshape", [rows, w.op("Concat", [last, depth], axis=0)])
        w.op("Gather", [flat, real], [node.output[0]], axis=0)
        g.node.remove(node)
    prune(g, [o.name for o in g.output])
    topological_sort(g)
    return model
