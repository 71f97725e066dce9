"""ONNX (onnxruntime CPU) vs PyTorch CPU fp32 on a bert-base-shaped random model, side by side (2026-11-22).

The ONNX model is exported by the builder's own code path (int32 inputs, mean pooling in the
graph). Each repetition runs both engines on the same inputs, alternating which goes first,
so load from other processes hits both alike. Prints a table with medians and the ratio.

    .venv/bin/python -m loadtest.experiments.bench_onnx_cpu                # batch 1 and 8 at seq 128
    .venv/bin/python -m loadtest.experiments.bench_onnx_cpu --repetitions 50 --json results.json
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import orjson
import torch
from pydantic import BaseModel, Field
from transformers import BertConfig, BertModel

from builder.export import RepositoryModel, export_onnx
from builder.optimize import FUSED_OPS, onnx_op_counts
from loadtest.machine import Machine, describe_machine


class BenchSettings(BaseModel):
    """What to measure."""

    batches: list[int] = Field(default_factory=lambda: [1, 8])
    seq_len: int = 128
    repetitions: int = 30
    warmup: int = 3
    threads: int = Field(default_factory=lambda: torch.get_num_threads())
    optimized: bool = False  # also run onnxruntime's transformer optimizer output (fused ops)


class Row(BaseModel):
    """Latencies (ms) of one batch size."""

    batch: int
    seq_len: int
    torch_median_ms: float
    torch_p90_ms: float
    onnx_median_ms: float
    onnx_p90_ms: float
    ratio_onnx_over_torch: float
    optimized_median_ms: float | None = None
    max_abs_diff: float


class BenchResult(BaseModel):
    settings: BenchSettings
    machine: Machine
    onnx_ops: dict[str, int]
    optimized_ops: dict[str, int] | None
    rows: list[Row]


def bert_base() -> RepositoryModel:
    """bert-base shape (12 layers, hidden 768, 12 heads, vocab 30522), random weights, mean pooling."""
    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                        intermediate_size=3072)
    config._attn_implementation = "eager"  # the builder exports eager attention: the optimizer fuses it
    return RepositoryModel(BertModel(config, add_pooling_layer=False).eval(), "embed", "mean").eval()


def _inputs(batch: int, seq: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch)
    ids = rng.integers(1000, 30000, size=(batch, seq), dtype=np.int32)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


def _timed(fn: object) -> float:
    start = time.perf_counter()
    fn()  # type: ignore[operator]
    return (time.perf_counter() - start) * 1000


def _session(path: Path, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


def run(settings: BenchSettings) -> BenchResult:
    torch.set_num_threads(settings.threads)
    model = bert_base()
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = Path(tmp) / "model.onnx"
        export_onnx(model, ["embeddings"], onnx_path, opset=17)
        sessions = {"onnx": _session(onnx_path, settings.threads)}
        ops, optimized_ops = onnx_op_counts(onnx_path), None
        if settings.optimized:
            from builder.optimize import optimize_for_onnxruntime

            optimized_path = Path(tmp) / "optimized.onnx"
            optimize_for_onnxruntime(onnx_path, optimized_path, num_heads=12, hidden_size=768)
            sessions["optimized"] = _session(optimized_path, settings.threads)
            optimized_ops = onnx_op_counts(optimized_path)
        rows = []
        for batch in settings.batches:
            feed = _inputs(batch, settings.seq_len)
            tensors = [torch.from_numpy(feed[n]) for n in ("input_ids", "attention_mask", "token_type_ids")]
            runners = {"torch": lambda t=tensors: model(*t)} | {
                name: (lambda s=s, f=feed: s.run(None, f)) for name, s in sessions.items()}
            times: dict[str, list[float]] = {name: [] for name in runners}
            with torch.inference_mode():
                reference = model(*tensors).numpy()
                diff = float(np.abs(sessions["onnx"].run(None, feed)[0] - reference).max())
                for rep in range(settings.warmup + settings.repetitions):
                    order = list(runners) if rep % 2 == 0 else list(reversed(runners))
                    for name in order:
                        elapsed = _timed(runners[name])
                        if rep >= settings.warmup:
                            times[name].append(elapsed)
            p90 = {name: float(np.percentile(t, 90)) for name, t in times.items()}
            med = {name: statistics.median(t) for name, t in times.items()}
            rows.append(Row(batch=batch, seq_len=settings.seq_len, torch_median_ms=med["torch"], torch_p90_ms=p90["torch"],
                            onnx_median_ms=med["onnx"], onnx_p90_ms=p90["onnx"],
                            ratio_onnx_over_torch=med["onnx"] / med["torch"],
                            optimized_median_ms=med.get("optimized"), max_abs_diff=diff))
    return BenchResult(settings=settings, machine=describe_machine(), onnx_ops=ops, optimized_ops=optimized_ops, rows=rows)


def table(result: BenchResult) -> str:
    """Markdown table of the result."""
    optimized = result.settings.optimized
    head = "| batch x seq | PyTorch fp32 median (p90) | ORT CPU median (p90) | ORT / PyTorch |"
    sep = "| --- | --- | --- | --- |"
    if optimized:
        head += " ORT optimized median | optimized / PyTorch |"
        sep += " --- | --- |"
    lines = [head, sep]
    for r in result.rows:
        line = (f"| {r.batch} x {r.seq_len} | {r.torch_median_ms:.1f} ms ({r.torch_p90_ms:.1f}) | "
                f"{r.onnx_median_ms:.1f} ms ({r.onnx_p90_ms:.1f}) | {r.ratio_onnx_over_torch:.2f} |")
        if optimized and r.optimized_median_ms is not None:
            line += f" {r.optimized_median_ms:.1f} ms | {r.optimized_median_ms / r.torch_median_ms:.2f} |"
        lines.append(line)
    m = result.machine
    lines.append(f"\n{m.cpu} ({m.cpu_count} cores), {result.settings.threads} threads, "
                 f"torch {m.packages.get('torch')}, onnxruntime {m.packages.get('onnxruntime')}, "
                 f"{result.settings.repetitions} interleaved repetitions; max |onnx - torch| = "
                 f"{max(r.max_abs_diff for r in result.rows):.2e}")
    if result.optimized_ops is not None:
        fused = {k: v for k, v in result.optimized_ops.items() if k in FUSED_OPS}
        lines.append(f"fused ops after the optimizer: {fused}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.experiments.bench_onnx_cpu",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="1,8", help="comma list of batch sizes")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--repetitions", type=int, default=30)
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads for both (default: torch's)")
    parser.add_argument("--optimized", action="store_true", help="also time the transformer-optimizer output")
    parser.add_argument("--json", type=Path, help="write the full result here")
    args = parser.parse_args(argv)
    settings = BenchSettings(batches=[int(b) for b in args.batches.split(",")], seq_len=args.seq_len,
                             repetitions=args.repetitions, optimized=args.optimized,
                             **({"threads": args.threads} if args.threads else {}))
    result = run(settings)
    print(table(result))
    if args.json:
        args.json.write_bytes(orjson.dumps(result.model_dump(mode="json"), option=orjson.OPT_INDENT_2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
