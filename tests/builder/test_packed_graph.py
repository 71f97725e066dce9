"""The packed layout's graph (builder/packing.py) against PyTorch fp32, on CPU.

onnxruntime has no CPU kernel for PackedMultiHeadAttention, so the GPU form is checked for its structure
(the IO contract, fused counts) and refusal on the CPU provider, and its CPU form (the same graph but
attention) for its answers. The PyTorch packed forward (loadtest/packed_torch.py) is checked against
Hugging Face's padded one, and mutations that look like real bugs show that these checks can fail."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

from builder.packing import GPU_ATTENTION, PackingError, cpu_form, packed_model, truly_packed
from builder.parity import compare
from contract import CU_SEQLENS, INPUT_IDS, POSITION_IDS, ROW_IDS, TOKEN_OFFSET, TOKEN_ROWS, TOKEN_TYPE_IDS
from contract.packing import PackedRows, cu_seqlens_of, filled_tokens, pack_padded
from loadtest.packed_torch import ATTENTIONS, packed_output, token_offset
from tests.builder.conftest import PackedCase, PackedGraphs
from tests.builder.helpers import padded_rows

# Every row length 1..64 shows up across these; 1-token rows on their own and among longer rows.
LENGTHS = ([1], [1, 1, 1], [64, 1, 7, 33, 2, 1, 64, 18, 5, 40, 1, 12])
CASES = [("bert", "embed", "mean"), ("bert", "embed", "cls"), ("bert", "embed", "lasttoken"),
         ("bert-classify", "classify", None), ("bert-rerank", "rerank", None), ("xlmr", "embed", "mean"),
         ("xlmr-rerank", "rerank", None)]


def _check(case: PackedCase, task: str, lengths: list[int], artifact: str = "onnx", model: onnx.ModelProto | None = None,
           **feed_changes: np.ndarray) -> tuple[bool, str]:
    """(passed, summary) of the parity gate (builder/parity.py) for one batch fed packed."""
    ids, mask, types = padded_rows(lengths, case.vocab, case.pairs, seed=len(lengths))
    feed = {**pack_padded(ids, mask, types).feed(), **feed_changes}
    result = compare(artifact, task, case.reference(ids, mask, types), case.run(feed, model), max(lengths))
    return result.passed, result.summary()


@pytest.mark.parametrize(("model", "task", "pooling"), CASES)
def test_cpu_form_matches_pytorch_fp32(packed_graphs: PackedGraphs, model: str, task: str, pooling: str | None) -> None:
    case = packed_graphs.get(model, task, pooling)
    for lengths in LENGTHS:
        passed, summary = _check(case, task, lengths)
        assert passed, (lengths, summary)
    if task == "embed":  # the gate above for embeddings is the cosine; state it
        ids, mask, types = padded_rows(list(LENGTHS[2]), case.vocab, False)
        got, want = case.run(pack_padded(ids, mask, types).feed()), case.reference(ids, mask, types)
        cosine = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
        assert cosine.min() >= 0.99999


@pytest.mark.parametrize(("model", "task", "pooling"), [("bert", "embed", "mean"), ("xlmr-rerank", "rerank", None)])
def test_float16_cpu_form_matches_pytorch_fp32(packed_graphs: PackedGraphs, model: str, task: str,
                                               pooling: str | None) -> None:
    """fp16 weights (the GPU build's graph; onnxruntime's CPU provider casts around ops it has no fp16 kernel for,
    so this checks the graph and its fp16 rounding, not a GPU's arithmetic)."""
    case = packed_graphs.get(model, task, pooling, float16=True)
    ids, mask, types = padded_rows(list(LENGTHS[2]), case.vocab, case.pairs)
    result = compare("onnx_fp16", task, case.reference(ids, mask, types),
                     case.run(pack_padded(ids, mask, types).feed()), 64)
    assert result.passed and (task != "embed" or result.min_cosine >= 0.9999), result.summary()


def test_per_token_output_comes_out_packed(packed_graphs: PackedGraphs) -> None:
    """An embedder's last hidden state (a per-token output) is [T, hidden] in the packed graph: each real token's
    row, in packed order, equal to PyTorch's for that token; the pooled output beside it stays per row."""
    case = packed_graphs.get("bert", "embed", "mean", token_outputs=True)
    (_, per_token) = case.gpu_form.graph.output
    assert [d.dim_param or d.dim_value for d in per_token.type.tensor_type.shape.dim] == ["tokens", 32]
    ids, mask, types = padded_rows(list(LENGTHS[2]), case.vocab, False)
    feed = pack_padded(ids, mask, types).feed()
    got = case.run(feed, output=1)
    want = case.reference(ids, mask, types, output=1)[mask.astype(bool)]  # [tokens, hidden], row by row
    assert got.shape == want.shape == (int(mask.sum()), 32)
    result = compare("onnx", "embed", want, got, 64)
    assert result.passed, result.summary()
    assert compare("onnx", "embed", case.reference(ids, mask, types), case.run(feed), 64).passed


@pytest.mark.parametrize(("model", "task", "pooling"), [("bert", "embed", "mean"), ("xlmr-rerank", "rerank", None)])
def test_filled_runs_answer_as_unfilled(packed_graphs: PackedGraphs, model: str, task: str, pooling: str | None) -> None:
    """A run filled up to its token count's size (what the GPU runner does) answers its real rows as before: each row
    attends and pools only within itself. Filling the last real row instead (the filler in its attention and mean)
    changes its answer, so the check can fail."""
    case = packed_graphs.get(model, task, pooling, token_outputs=task == "embed")
    rows = pack_padded(*padded_rows(list(LENGTHS[2]), case.vocab, case.pairs))
    filled = rows.filled(filled_tokens(rows.tokens, 16384) + 40, max_row=64)
    assert filled.tokens > rows.tokens and filled.rows > rows.rows
    for output in range(2 if task == "embed" else 1):
        plain, padded_out = case.run(rows.feed(), output=output), case.run(filled.feed(), output=output)
        real = rows.rows if output == 0 else rows.tokens
        np.testing.assert_allclose(padded_out[:real], plain, rtol=1e-5, atol=1e-6)
    lengths = rows.lengths.copy()
    lengths[-1] += filled.tokens - rows.tokens
    joined = PackedRows(filled.input_ids, filled.token_type_ids, cu_seqlens_of(lengths))
    assert not np.allclose(case.run(joined.feed())[rows.rows - 1], case.run(rows.feed())[-1], rtol=1e-3, atol=1e-4)


def test_gpu_form_io_contract_and_fused_counts(packed_graphs: PackedGraphs) -> None:
    for model, task, pooling in (("bert", "embed", "mean"), ("xlmr-rerank", "rerank", None)):
        graph = packed_graphs.get(model, task, pooling, float16=True).gpu_form.graph
        inputs = {i.name: (i.type.tensor_type.elem_type, len(i.type.tensor_type.shape.dim)) for i in graph.input}
        mean_pooling = {TOKEN_ROWS: (TensorProto.INT32, 1), ROW_IDS: (TensorProto.INT32, 1)} if pooling else {}
        assert inputs == {INPUT_IDS: (TensorProto.INT32, 1), TOKEN_TYPE_IDS: (TensorProto.INT32, 1),
                          CU_SEQLENS: (TensorProto.INT32, 1), TOKEN_OFFSET: (TensorProto.INT32, 2),
                          POSITION_IDS: (TensorProto.INT32, 1), **mean_pooling}
        (output,) = graph.output
        assert output.type.tensor_type.elem_type == TensorProto.FLOAT
        assert output.type.tensor_type.shape.dim[0].dim_param == "rows"
        ops = Counter(n.op_type for n in graph.node)
        assert ops[GPU_ATTENTION] == 2  # one per layer of the tiny models
        assert not {"RemovePadding", "RestorePadding", "MultiHeadAttention", "Attention"} & set(ops)
        assert ops["EmbedLayerNormalization"] == (1 if model == "bert" else 0)  # XLM-R's embeddings stay unfused
        assert not any("attention_mask" in n.input for n in graph.node)
        made_by = {o: n for n in graph.node for o in n.output}
        for attention in (n for n in graph.node if n.op_type == GPU_ATTENTION):  # one QKV GEMM per layer
            assert attention.input[1:3] == ["", ""], attention.input
            reshape = made_by[attention.input[0]]
            assert (reshape.op_type, made_by[reshape.input[0]].op_type) == ("Reshape", "MatMul")
        assert ops["MatMul"] <= 2 * 4 + 1  # per layer: qkv, attention output, two FFN (+ the mean pooling's)
        assert not {"Range", "ScatterElements", "Mod", "Where"} & set(ops)  # index arithmetic is fed, not computed
        assert {i.data_type for i in graph.initializer if i.dims and np.prod(i.dims) > 64} == {TensorProto.FLOAT16}


def test_gpu_form_refuses_the_cpu_provider_naming_the_packed_op(packed_graphs: PackedGraphs) -> None:
    """When onnxruntime gains a CPU kernel for the packed attention this fails: then the CPU form may go."""
    case = packed_graphs.get("bert", "embed", "mean")
    with pytest.raises(Exception, match=GPU_ATTENTION):
        ort.InferenceSession(case.gpu_form.SerializeToString(), providers=["CPUExecutionProvider"])


def _with_outputs(model: onnx.ModelProto, names: dict[str, str]) -> onnx.ModelProto:
    """A copy that also outputs the tensors `names` (new output name -> tensor), through Identity nodes."""
    copy = onnx.ModelProto.FromString(model.SerializeToString())
    for out, tensor in names.items():
        copy.graph.node.append(helper.make_node("Identity", [tensor], [out]))
        copy.graph.output.append(helper.make_tensor_value_info(out, TensorProto.INT32, None))
    return copy


def test_fed_indices_equal_onnxruntime_layout(packed_graphs: PackedGraphs) -> None:
    """The host's token_offset (contract/packing.py, vectorized) equals onnxruntime's RemovePadding layout (its
    CUDA getTokenOffset, ported loop by loop in loadtest/packed_torch.py), and the graph hands the fed tensors to
    the attention and the embeddings unchanged; position ids restart per row."""
    assert token_offset(np.array([0, 1, 3, 7]), 4).ravel().tolist() == [0, 4, 5, 8, 9, 10, 11, 1, 2, 3, 6, 7]
    rng = np.random.default_rng(0)
    for lengths in ([1], [3, 1, 6, 2], list(rng.integers(1, 40, 50))):
        feed = pack_padded(*padded_rows(lengths, 100, False)).feed()
        np.testing.assert_array_equal(feed[TOKEN_OFFSET], token_offset(feed[CU_SEQLENS], max(lengths)))
        np.testing.assert_array_equal(feed[POSITION_IDS], np.concatenate([np.arange(n) for n in lengths]))
    case = packed_graphs.get("bert", "embed", "mean")
    eln = next(n for n in case.cpu_form.graph.node if n.op_type == "EmbedLayerNormalization")
    offsets = next(n for n in case.gpu_form.graph.node if n.op_type == GPU_ATTENTION).input[4]
    probe = _with_outputs(case.cpu_form, {"probe_offsets": offsets, "probe_positions": eln.input[8]})
    feed = pack_padded(*padded_rows([3, 1, 6, 2], case.vocab, False)).feed()
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    _, got_offsets, got_positions = session.run(None, feed)
    np.testing.assert_array_equal(got_offsets, feed[TOKEN_OFFSET])
    np.testing.assert_array_equal(got_positions.ravel(), feed[POSITION_IDS])


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize(("model", "task", "pooling"), CASES)
def test_pytorch_packed_reference_matches_hugging_face(packed_graphs: PackedGraphs, model: str, task: str,
                                                       pooling: str | None) -> None:
    """loadtest/packed_torch.py (the reference of the packed layout, and the benchmark's varlen peer) against
    Hugging Face's padded fp32 forward, with its CPU attention implementations."""
    case = packed_graphs.get(model, task, pooling)
    ids, mask, types = padded_rows(list(LENGTHS[2]), case.vocab, case.pairs)
    rows = pack_padded(ids, mask, types)
    want = case.reference(ids, mask, types)
    for name in ("loop", "nested"):
        got = packed_output(case.model, *(torch.from_numpy(a) for a in (rows.input_ids, rows.token_type_ids,
                                                                          rows.cu_seqlens)),
                            int(rows.lengths.max()), ATTENTIONS[name]).numpy()
        result = compare("onnx", task, want, got, 64)
        assert result.passed, (name, result.summary())


# ---- mutations: bugs of the kind a rewrite can have make the same checks fail ------------------------------

def test_mutation_positions_without_the_roberta_offset_fail(packed_graphs: PackedGraphs) -> None:
    case = packed_graphs.get("xlmr", "embed", "mean")
    wrong = cpu_form(packed_model(onnx.load(str(case.optimized)), task="embed", pooling="mean", num_heads=2,
                                  hidden_size=32, offset=0))  # positions from 0 instead of padding_idx + 1
    assert not _check(case, "embed", list(LENGTHS[2]), model=wrong)[0]


def test_mutation_positions_not_restarted_per_row_fail(packed_graphs: PackedGraphs) -> None:
    case = packed_graphs.get("bert", "embed", "mean")
    wrong = onnx.ModelProto.FromString(case.cpu_form.SerializeToString())
    next(n for n in wrong.graph.node if n.op_type == "EmbedLayerNormalization").input[8] = ""  # 0..T-1 over the pack
    assert not _check(case, "embed", [9, 4, 12, 7, 30], model=wrong)[0]


def test_mutation_attention_across_padding_slots_fails(packed_graphs: PackedGraphs) -> None:
    case = packed_graphs.get("bert-classify", "classify")
    wrong = onnx.ModelProto.FromString(case.cpu_form.SerializeToString())
    for node in wrong.graph.node:
        if node.op_type == "MultiHeadAttention":
            del node.input[4:]  # no key padding mask: a row attends to the zero rows of its padding slots
    assert not _check(case, "classify", list(LENGTHS[2]), model=wrong)[0]


def test_mutation_bad_row_boundaries_and_stale_indices_fail(packed_graphs: PackedGraphs) -> None:
    """What the runner's host checks and its index tensors are for: the graph checks neither. Row boundaries off
    by one run and answer wrong (contract/packing.py refuses cu_seqlens that do not fit the tokens, and a row's
    length is the caller's); index tensors of other rows (a stale feed) answer wrong or fail."""
    case = packed_graphs.get("bert", "embed", "mean")
    lengths = [5, 9, 3, 12]
    rows = pack_padded(*padded_rows(lengths, case.vocab, False, seed=len(lengths)))
    cu = np.array([0, 6, 14, 17, 29], np.int32)  # row 0 one token too long, row 1 one too short
    shifted = PackedRows(rows.input_ids, rows.token_type_ids, cu).feed()  # every index tensor from the wrong rows
    assert not _check(case, "embed", lengths, **shifted)[0]
    other = pack_padded(*padded_rows([9, 5, 12, 3], case.vocab, False)).feed()  # same tokens, rows reordered
    for name in (TOKEN_OFFSET, POSITION_IDS, TOKEN_ROWS):
        try:
            passed = _check(case, "embed", lengths, **{name: other[name]})[0]
        except Exception as exc:  # noqa: BLE001 - onnxruntime's own index check caught it this time
            assert "out of" in str(exc) or "index" in str(exc).lower(), exc
            continue
        assert not passed, name


def test_mutation_qkv_columns_in_the_wrong_order_fail(packed_graphs: PackedGraphs) -> None:
    """merge_qkv lays the merged weight out head by head (q, k, v of head 0, then head 1), as onnxruntime's packed
    QKV kernels read it; q, k, v blocks one after the other (the unmerged order) answer wrong."""
    case = packed_graphs.get("bert", "embed", "mean")
    wrong = onnx.ModelProto.FromString(case.gpu_form.SerializeToString())
    for init in wrong.graph.initializer:
        if init.name.startswith("qkv/weight"):
            merged = onnx.numpy_helper.to_array(init)  # [H, N * 3 * head], N = 2 heads of 16
            blocks = merged.reshape(32, 2, 3, 16).transpose(0, 2, 1, 3).reshape(32, -1)
            init.CopyFrom(onnx.numpy_helper.from_array(blocks, init.name))
    assert not _check(case, "embed", list(LENGTHS[2]), model=cpu_form(wrong))[0]


def test_rewrite_refuses_graphs_it_does_not_know(packed_graphs: PackedGraphs) -> None:
    case = packed_graphs.get("bert", "embed", "mean")
    with pytest.raises(PackingError, match="not a packing-mode graph"):
        truly_packed(case.gpu_form, task="embed", pooling="mean")
    with pytest.raises(PackingError, match="no fused MultiHeadAttention"):
        packed_model(case.gpu_form, task="embed", pooling="mean", num_heads=2, hidden_size=32)


def test_split_qkv_undoes_merge_qkv(packed_graphs: PackedGraphs) -> None:
    """loadtest/packed_step.py's 3-GEMM comparison graph answers exactly as the merged one."""
    from loadtest.packed_step import split_qkv

    case = packed_graphs.get("bert", "embed", "mean")
    split = split_qkv(onnx.ModelProto.FromString(case.gpu_form.SerializeToString()))
    assert sum(n.op_type == "MatMul" for n in split.graph.node) == sum(
        n.op_type == "MatMul" for n in case.gpu_form.graph.node) + 2 * 2  # two more per layer
    feed = pack_padded(*padded_rows(list(LENGTHS[2]), case.vocab, False)).feed()
    np.testing.assert_array_equal(case.run(feed, cpu_form(split)), case.run(feed))
