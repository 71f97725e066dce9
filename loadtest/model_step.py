"""The model step alone: onnxruntime (CUDA, fp16) on the builder's export against PyTorch fp16 SDPA.

    python -m loadtest model-step --name h100 [--shape base] [--ort-python PY]

Builds a random BERT embedder of `--shape` (loadtest.models), exports it as the builder does
(builder.export, TorchScript exporter, pooling in the graph) and runs onnxruntime's transformer
optimizer in several variants: the builder's published form (BERT fusions + float16, pooling in
float32), the same with the raw 2-D attention mask, with the end+start mask index, or with
MultiHeadAttention instead of the 1-D mask-index Attention (each selects other CUDA attention
kernels), float16 without the Attention fusion, and the optimized float32 graph (what the builder published before
float16). Each variant is timed with onnxruntime's CUDA provider at the issue's shapes, twice:
`run` with numpy inputs (what the python-backend runner does: host copies included) and with IO
binding (inputs and output on the GPU: the graph's own time). PyTorch runs the same weights with
`attn_implementation="sdpa"` in fp16 on the GPU, inputs on the GPU, mean pooling.
Latency: median of CUDA-synchronized wall times after warm-up. Every variant's output is
compared with PyTorch fp32 (cosine). onnxruntime runs the variants in turns in a child process
(loadtest.ort_probe) of `--ort-python` (with onnxruntime-gpu importable; PYTHONPATH passes through),
PyTorch in this one.
Results: loadtest/results/runs/<name>-model-step/ (results.json, summary.md), and rows of the results table.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.machine import describe_machine
from loadtest.ort_probe import in_child, medians_in_turns, min_cosine, time_variants
from loadtest.report import save_step_record
from loadtest.results_table import RUNS_DIR, RunContext, add_table_argument, record_rows

SHAPES = ((1, 16), (32, 128), (128, 128), (64, 512))  # (batch, seq): batch-1 short text, then the three


PADDED = "8x64 right-padded"  # a correctness case: rows of different lengths in one batch


def _inputs(batch: int, seq: int, vocab: int, seed: int = 0, padded: bool = False) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed + batch * 1000 + seq)
    ids = rng.integers(5, vocab, size=(batch, seq), dtype=np.int32)
    mask = np.ones((batch, seq), np.int32)
    lengths = np.linspace(3, seq, batch).astype(int) if padded else np.full(batch, seq)
    for row, length in enumerate(lengths):
        ids[row, 0], ids[row, length - 1] = 2, 3  # [CLS] ... [SEP]
        ids[row, length:], mask[row, length:] = 0, 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros((batch, seq), np.int32)}


def _cases(shapes: tuple[tuple[int, int], ...], vocab: int) -> dict[str, dict[str, np.ndarray]]:
    cases = {f"{b}x{s}": _inputs(b, s, vocab) for b, s in shapes}
    cases[PADDED] = _inputs(8, 64, vocab, padded=True)
    return cases


def export_settings(model_dir: Path, float16: bool, max_seq_len: int = 512, max_batch_size: int = 128,
                    max_batch_tokens: int = 16384, merge_buckets: bool = True) -> Any:
    """The builder's resolved settings for exporting `model_dir` as an embed step, fp16 on a GPU (its parity
    skipped: the benchmark compares with PyTorch itself)."""
    from builder.settings import ResolvedSettings

    return ResolvedSettings(
        model=str(model_dir), revision=None, task="embed", name="step", formats=["onnx"], max_seq_len=max_seq_len,
        max_batch_size=max_batch_size, device="gpu" if float16 else "cpu", runtime="python", pooling="mean",
        labels=None, length_buckets=[max_seq_len], dynamic_batching=True, tokenizer_queue_delay_us=100,
        preferred_batch_sizes=[max_batch_size], instances=1, tokenizer_instances=1, onnx_threads=0, opset=17,
        onnx_optimize=True, onnx_precision="fp16" if float16 else "fp32", max_batch_tokens=max_batch_tokens,
        batch_widths=[], batch_rows=[], merge_buckets=merge_buckets, trt_opt_batch_size=8, trt_workspace_mib=1024,
        skip_parity=True,
    )


def export_variants(model_dir: Path, work: Path, float16: bool, builder_only: bool = False) -> dict[str, dict[str, Any]]:
    """The raw export and its optimizer variants (or the builder's form alone): name -> {path, fused}."""
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST
    from onnxruntime.transformers.fusion_options import AttentionMaskFormat, FusionOptions
    from onnxruntime.transformers.optimizer import optimize_model

    from builder.export import export_onnx, load_repository_model
    from builder.optimize import (
        FP32_POOLING_OPS,
        FUSED_OPS,
        onnx_op_counts,
        optimize_for_onnxruntime,
        repair_float16_graph,
    )

    settings = export_settings(model_dir, float16)
    model = load_repository_model(model_dir, settings, attn_implementation="eager")
    raw = work / "raw" / "model.onnx"
    raw.parent.mkdir(parents=True, exist_ok=True)
    export_onnx(model, settings.output_names, raw, settings.opset)
    heads, hidden = model.model.config.num_attention_heads, model.model.config.hidden_size
    variants: dict[str, dict[str, Any]] = {}

    def add(name: str, path: Path) -> None:
        counts = onnx_op_counts(path)
        variants[name] = {"path": str(path), "fused": {op: counts[op] for op in FUSED_OPS if op in counts}}

    published = work / "builder" / "model.onnx"
    published.parent.mkdir()
    optimize_for_onnxruntime(raw, published, heads, hidden, float16=float16)
    add("builder (fused, fp16)" if float16 else "builder (fused, fp32)", published)
    if not float16 or builder_only:
        return variants
    for name, configure in (
        ("fp16, raw 2-D mask", lambda o: o.use_raw_attention_mask(True)),
        ("fp16, mask index end+start", lambda o: setattr(o, "attention_mask_format", AttentionMaskFormat.MaskIndexEndAndStart)),
        ("fp16, MultiHeadAttention", lambda o: setattr(o, "use_multi_head_attention", True)),
        ("fp16, no Attention fusion", lambda o: setattr(o, "enable_attention", False)),
    ):
        options = FusionOptions("bert")
        configure(options)
        optimized = optimize_model(str(raw), model_type="bert", num_heads=heads, hidden_size=hidden, opt_level=0,
                                   use_gpu=True, optimization_options=options)
        optimized.convert_float_to_float16(keep_io_types=True, op_block_list=[*DEFAULT_OP_BLOCK_LIST, *FP32_POOLING_OPS])
        repair_float16_graph(optimized.model)
        path = work / "".join(c if c.isalnum() else "_" for c in name) / "model.onnx"
        path.parent.mkdir()
        optimized.save_model_to_file(str(path))
        add(name, path)
    fp32 = work / "fp32" / "model.onnx"
    fp32.parent.mkdir()
    optimize_for_onnxruntime(raw, fp32, heads, hidden, float16=False)
    add("fused fp32 (before)", fp32)
    return variants


def time_torch(model_dir: Path, cases: dict[str, dict[str, np.ndarray]], repeats: int
               ) -> tuple[dict[str, float], dict[str, np.ndarray], str]:
    """PyTorch SDPA fp16 (GPU) or fp32 (CPU) median ms per shape, and fp32 reference outputs."""
    import torch
    from transformers import AutoModel

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float16 if device == "cuda" else torch.float32
    model = AutoModel.from_pretrained(model_dir, attn_implementation="sdpa", dtype=dtype).to(device).eval()
    ref_model = AutoModel.from_pretrained(model_dir, attn_implementation="eager", dtype=torch.float32).to(device).eval()

    def pooled(m: Any, feed: dict[str, Any]) -> Any:
        hidden = m(input_ids=feed["input_ids"], attention_mask=feed["attention_mask"],
                   token_type_ids=feed["token_type_ids"]).last_hidden_state.float()
        mask = feed["attention_mask"].unsqueeze(-1).float()
        return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)

    times: dict[str, float] = {}
    refs: dict[str, np.ndarray] = {}
    with torch.inference_mode():
        for key, case in cases.items():
            feed = {k: torch.from_numpy(v.astype(np.int64)).to(device) for k, v in case.items()}
            refs[key] = pooled(ref_model, feed).cpu().numpy()

            def run(feed: dict[str, Any] = feed) -> None:
                pooled(model, feed)
                if device == "cuda":
                    torch.cuda.synchronize()

            times[key] = medians_in_turns([run], repeats, warmup=5)[0] * 1e3
    return times, refs, f"torch {torch.__version__} {device} {str(dtype).replace('torch.', '')} sdpa"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest model-step", description=__doc__.splitlines()[0])
    p.add_argument("--name", default="local")
    p.add_argument("--shape", default="base")
    p.add_argument("--ort-python", default=sys.executable, help="python with onnxruntime(-gpu) importable")
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--shapes", default=",".join(f"{b}x{s}" for b, s in SHAPES))
    p.add_argument("--float16", choices=["auto", "yes", "no"], default="auto",
                   help="optimizer variants in float16 (auto: when a GPU is present)")
    p.add_argument("--work", type=Path)
    p.add_argument("--out", type=Path, default=RUNS_DIR)
    add_table_argument(p)
    args = p.parse_args(argv)
    shapes = tuple(tuple(int(x) for x in s.split("x")) for s in args.shapes.split(","))
    work = args.work or Path(tempfile.mkdtemp(prefix="model-step-"))
    import torch

    from loadtest.models import make_bert, vocabulary

    gpu = torch.cuda.is_available()
    model_dir = make_bert(work / "model", "embed", args.shape)
    vocab = len(vocabulary())
    float16 = gpu if args.float16 == "auto" else args.float16 == "yes"
    variants = export_variants(model_dir, work / "onnx", float16=float16)
    cases = _cases(shapes, vocab)  # type: ignore[arg-type]
    torch_ms, refs, torch_desc = time_torch(model_dir, cases, args.repeats)
    spec = {"variants": {n: v["path"] for n, v in variants.items()}, "repeats": args.repeats, "warmup": 5,
            "inputs": {key: {k: v.tolist() for k, v in case.items()} for key, case in cases.items()}}
    ort = in_child(time_variants, spec, python=args.ort_python)
    rows, ratios = [], {}
    builder_variant = next(iter(variants))
    for name in variants:
        for key in torch_ms:
            res = ort["variants"][name].get(key) or {"error": ort["variants"][name].get("error", "not run")}
            if "error" in res:
                rows.append({"variant": name, "shape": key, "torch_ms": torch_ms[key], "error": res["error"]})
                continue
            rows.append({"variant": name, "shape": key, "torch_ms": torch_ms[key], "ort_run_ms": res["run_ms"],
                         "ort_iobinding_ms": res.get("iobinding_ms"),
                         "min_cosine_vs_fp32": min_cosine(np.asarray(res["output"], np.float32), refs[key][:8])})
            if name == builder_variant and key != PADDED:
                best = min(v for v in (res["run_ms"], res.get("iobinding_ms")) if v is not None)
                ratios[f"{key}: PyTorch SDPA ms / onnxruntime ms (builder's model, IO binding)"] = torch_ms[key] / best
                ratios[f"{key}: PyTorch SDPA ms / onnxruntime ms (builder's model, run)"] = \
                    torch_ms[key] / res["run_ms"]
    machine = describe_machine()
    record = {
        "name": f"{args.name}-model-step", "machine": machine.model_dump(), "torch": torch_desc,
        "onnxruntime": ort["onnxruntime"], "providers": ort["providers"], "shape": args.shape,
        "repeats": args.repeats, "fused_ops": {n: v["fused"] for n, v in variants.items()}, "rows": rows,
        "ratios": ratios,
    }
    lines = [f"- {torch_desc}; onnxruntime {ort['onnxruntime']} {ort['providers']}",
             f"- bert shape `{args.shape}`, median of {args.repeats} runs", "",
             "| variant | batch x seq | PyTorch SDPA ms | ORT run ms | ORT IO-binding ms | min cosine vs fp32 |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['variant']} | {r['shape']} | {r['torch_ms']:.2f} | failed: {r['error']} | | |" if "error" in r else
              f"| {r['variant']} | {r['shape']} | {r['torch_ms']:.2f} | {r['ort_run_ms']:.2f} | "
              f"{r['ort_iobinding_ms'] if r['ort_iobinding_ms'] is None else round(r['ort_iobinding_ms'], 2)} | "
              f"{r['min_cosine_vs_fp32']:.5f} |" for r in rows]
    lines += ["", "| ratio (>= 1: onnxruntime at least as fast) | value |", "| --- | ---: |"]
    lines += [f"| {k} | {v:.2f} |" for k, v in ratios.items()]
    lines += ["", "Fused operators per variant: " + "; ".join(f"{n}: {f}" for n, f in record["fused_ops"].items())]
    out = save_step_record(record, args.out, lines, description=__doc__.split("\n\n")[1].strip())
    context = RunContext.of(machine, args.name, out)
    record_rows([row for r in rows if r["variant"] == builder_variant and "error" not in r for row in (
        context.row("model-step", r["variant"], r["shape"], "onnxruntime, IO binding where the GPU has it",
                    r["ort_iobinding_ms"] or r["ort_run_ms"], "ms", {"torch-sdpa": r["torch_ms"]}),
        context.row("model-step", r["variant"], r["shape"], "min cosine vs fp32", r["min_cosine_vs_fp32"], "cosine"))],
        args.table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
