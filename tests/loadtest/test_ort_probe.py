"""loadtest.ort_probe's jobs on two hand-made graphs (a padded step's inputs and a packed step's), in this process
on the CPU provider: the feeds each graph takes, the timings' shape, parity outputs, and a variant that fails
recorded next to one that runs. (The child-process round trip runs in every benchmark test.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, save_model

from loadtest.ort_probe import cold_sweeps, profile_runs, time_shapes, time_variants, uniform_feed

INT = TensorProto.INT32


def padded_graph(path: Path) -> Path:
    """embeddings [rows, 1] float = the sum of each row's (input_ids * attention_mask + token_type_ids)."""
    nodes = [helper.make_node("Mul", ["input_ids", "attention_mask"], ["masked"]),
             helper.make_node("Add", ["masked", "token_type_ids"], ["typed"]),
             helper.make_node("ReduceSum", ["typed", "axes"], ["summed"], keepdims=1),
             helper.make_node("Cast", ["summed"], ["embeddings"], to=TensorProto.FLOAT)]
    inputs = [helper.make_tensor_value_info(n, INT, ["rows", "width"])
              for n in ("input_ids", "attention_mask", "token_type_ids")]
    graph = helper.make_graph(nodes, "padded", inputs,
                              [helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, ["rows", 1])],
                              [helper.make_tensor("axes", TensorProto.INT64, [1], [1])])
    save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def packed_graph(path: Path) -> Path:
    """embeddings [rows, 1] float = each row's length (cu_seqlens[1:] - cu_seqlens[:-1]) + S - T (S: token_offset's
    width, the longest row)."""
    nodes = [helper.make_node("Slice", ["cu_seqlens", "one", "end"], ["ends"]),
             helper.make_node("Slice", ["cu_seqlens", "zero", "minus_one"], ["starts"]),
             helper.make_node("Sub", ["ends", "starts"], ["lengths"]),
             helper.make_node("Add", ["input_ids", "token_type_ids"], ["tokens"]),
             helper.make_node("Shape", ["tokens"], ["total64"]),
             helper.make_node("Cast", ["total64"], ["total"], to=INT),
             helper.make_node("Shape", ["token_offset"], ["slots64"]),
             helper.make_node("Slice", ["slots64", "one", "two"], ["width64"]),
             helper.make_node("Cast", ["width64"], ["width"], to=INT),
             helper.make_node("Sub", ["width", "total"], ["offset"]),
             helper.make_node("Add", ["lengths", "offset"], ["shifted"]),
             helper.make_node("Unsqueeze", ["shifted", "one"], ["column"]),
             helper.make_node("Cast", ["column"], ["embeddings"], to=TensorProto.FLOAT)]
    inputs = [helper.make_tensor_value_info("input_ids", INT, ["T"]),
              helper.make_tensor_value_info("token_type_ids", INT, ["T"]),
              helper.make_tensor_value_info("cu_seqlens", INT, ["rows_plus_1"]),
              helper.make_tensor_value_info("token_offset", INT, ["rows", "S"])]
    consts = [helper.make_tensor(n, TensorProto.INT64, [1], [v])
              for n, v in (("zero", 0), ("one", 1), ("two", 2), ("minus_one", -1), ("end", 2**62))]
    graph = helper.make_graph(nodes, "packed", inputs,
                              [helper.make_tensor_value_info("embeddings", TensorProto.FLOAT, ["rows", 1])], consts)
    save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_uniform_feeds_follow_the_graph_inputs() -> None:
    padded = uniform_feed({"input_ids", "attention_mask", "token_type_ids"}, 3, 5)
    assert {k: v.shape for k, v in padded.items()} == {"input_ids": (3, 5), "attention_mask": (3, 5),
                                                       "token_type_ids": (3, 5)}
    assert padded["attention_mask"].all() and ((padded["input_ids"] >= 5) & (padded["input_ids"] < 300)).all()
    packed = uniform_feed({"input_ids", "token_type_ids", "cu_seqlens", "token_offset"}, 3, 5)
    assert packed["cu_seqlens"].tolist() == [0, 5, 10, 15] and packed["token_offset"].shape == (3, 5)
    assert packed["input_ids"].tolist() == padded["input_ids"].ravel().tolist()  # the same rows, back to back
    assert all(v.dtype == np.int32 for v in (*padded.values(), *packed.values()))


@pytest.mark.parametrize("make", [padded_graph, packed_graph])
def test_time_shapes_times_each_shape(make: object, tmp_path: Path) -> None:
    model = make(tmp_path / "model.onnx")  # type: ignore[operator]
    result = time_shapes({"model": str(model), "shapes": [[1, 8], [4, 16]], "warmup": 1, "repeats": 3})
    assert result["providers"] == ["CPUExecutionProvider"]
    assert [(r["rows"], r["width"]) for r in result["runs"]] == [(1, 8), (4, 16)]
    assert all(r["calls"] >= 3 and 0 < r["median_ms"] <= r["p99_ms"] for r in result["runs"])


def test_time_variants_returns_outputs_and_records_a_failing_variant(tmp_path: Path) -> None:
    ids = np.arange(6, dtype=np.int32).reshape(2, 3)
    case = {"input_ids": ids.tolist(), "attention_mask": [[1, 1, 0], [1, 1, 1]], "token_type_ids": [[0] * 3] * 2}
    spec = {"variants": {"ok": str(padded_graph(tmp_path / "model.onnx")), "missing": str(tmp_path / "no.onnx")},
            "inputs": {"2x3": case}, "repeats": 2, "warmup": 1}
    result = time_variants(spec)
    ok = result["variants"]["ok"]["2x3"]
    assert ok["output"] == [[1.0], [12.0]] and ok["run_ms"] > 0 and ok["first_ms"] > 0
    assert "iobinding_ms" not in ok  # CUDA only
    assert "NoSuchFile" in result["variants"]["missing"]["error"] or "no.onnx" in result["variants"]["missing"]["error"]


def test_cold_sweeps_and_profile(tmp_path: Path) -> None:
    model = str(padded_graph(tmp_path / "model.onnx"))
    sweeps = cold_sweeps({"model": model, "sweeps": {"rows": [[1, 8], [2, 8]], "widths": [[2, 8], [2, 16]]},
                          "session": {"enable_mem_pattern": False}})
    assert set(sweeps["sweeps"]) == {"rows", "widths"}
    assert all(0 < v["cold"] <= v["cold_max"] and v["warm"] > 0 for v in sweeps["sweeps"].values())
    profile = profile_runs({"model": model, "shapes": [[3, 40], [5, 72]]})
    assert [r["shape"] for r in profile["runs"]] == ["3x40", "5x72"]
    assert profile["placement"]["nodes_per_provider"]["CPUExecutionProvider"] > 0
    assert all(r["top"] and r["model_run_ms"] > 0 for r in profile["runs"])
