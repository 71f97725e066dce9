"""ModernBERT's model step: the builder's ONNX graph (attention fused into MultiHeadAttention) against the
plain export (attention unfused: the sliding window as a mask, n^2 per layer) and PyTorch SDPA, at 1x2048 and
8x8192 tokens.

A random ModernBERT of the base shape (22 layers, hidden 768, 12 heads, 128-token local window every layer
but each third, 8,192 positions: answerdotai/ModernBERT-base's config) is exported by the builder's own
code twice (builder/attention.py's fused export, and the eager one), both through onnxruntime's transformer
optimizer (fp16 on a GPU). The variants run in turns in a child process (loadtest.ort_probe on `--ort-python`,
e.g. with onnxruntime-gpu on PYTHONPATH), timed with IO binding on CUDA; a variant that fails at a shape (out of
memory) is recorded as failed.
PyTorch runs the same weights with SDPA (fp16 on a GPU). Outputs are compared with PyTorch fp32 SDPA
(mean-pooled, cosine). `--smoke` runs a tiny ModernBERT at tiny shapes on the CPU: the plumbing, not figures.

    python3 -m loadtest modernbert-attention --name h100 --out $OUT/results      # on the GPU host
    python -m loadtest modernbert-attention --smoke --out /tmp/mb                  # here
    python -m loadtest modernbert-attention --smoke --shapes 1x512,1x2048,2x8192 --repeats 5 --name local-2core-23 \
        --out loadtest/results                                                    # tiny model, CPU figures
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
from loadtest.report import RESULTS_DIR, save_step_record

SHAPES = ((1, 2048), (8, 8192))
SMOKE_SHAPES = ((1, 96), (2, 200))
BASE = {"hidden_size": 768, "intermediate_size": 1152, "num_hidden_layers": 22, "num_attention_heads": 12,
        "local_attention": 128, "global_attn_every_n_layers": 3}
TINY = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 3, "num_attention_heads": 2,
        "local_attention": 64, "global_attn_every_n_layers": 3}


def make_modernbert(directory: Path, shape: dict[str, int], vocab: int = 1000) -> Path:
    """A random ModernBERT with `shape` and 8,192 positions, saved like a hub checkpoint (no tokenizer needed)."""
    import torch
    from transformers import ModernBertConfig, ModernBertModel

    torch.manual_seed(0)
    config = ModernBertConfig(vocab_size=vocab, max_position_embeddings=8192, pad_token_id=0, cls_token_id=1,
                              sep_token_id=2, bos_token_id=1, eos_token_id=2, **shape)
    ModernBertModel(config).eval().save_pretrained(directory)
    return directory


def export_variants(model_dir: Path, work: Path, float16: bool) -> dict[str, dict[str, Any]]:
    """The builder's fused export and the plain one, each through the builder's optimizer step."""
    from builder.attention import ATTENTION
    from builder.export import export_onnx, load_repository_model
    from builder.optimize import optimize_for_onnxruntime
    from loadtest.model_step import export_settings

    settings = export_settings(model_dir, float16, max_seq_len=8192, max_batch_size=8, max_batch_tokens=65536,
                               merge_buckets=False)
    config = load_repository_model(model_dir, settings).model.config
    variants: dict[str, dict[str, Any]] = {}
    for name, attention in (("builder: fused MultiHeadAttention", ATTENTION), ("plain export: unfused", "eager")):
        model = load_repository_model(model_dir, settings, attn_implementation=attention)
        slug = "fused" if attention == ATTENTION else "plain"
        raw = work / slug / "raw" / "model.onnx"
        raw.parent.mkdir(parents=True, exist_ok=True)
        model.token_outputs = False  # the pooled output is what is timed
        export_onnx(model, [settings.output_name], raw, settings.opset)
        optimized = work / slug / "model.onnx"
        fused = optimize_for_onnxruntime(raw, optimized, config.num_attention_heads, config.hidden_size,
                                         float16=float16)
        variants[name] = {"path": str(optimized), "fused": fused}
    return variants


def _cases(shapes: tuple[tuple[int, int], ...], vocab: int) -> dict[str, dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    cases = {}
    for batch, seq in shapes:
        ids = rng.integers(5, vocab, size=(batch, seq), dtype=np.int32)
        ids[:, 0], ids[:, -1] = 1, 2
        cases[f"{batch}x{seq}"] = {"input_ids": ids, "attention_mask": np.ones((batch, seq), np.int32),
                                   "token_type_ids": np.zeros((batch, seq), np.int32)}
    return cases


def time_torch(model_dir: Path, cases: dict[str, dict[str, np.ndarray]], repeats: int
               ) -> tuple[dict[str, Any], dict[str, np.ndarray], str]:
    """PyTorch SDPA (fp16 on a GPU) median ms per shape and peak memory; fp32 SDPA reference outputs."""
    import torch
    from transformers import AutoModel

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float16 if device == "cuda" else torch.float32

    def pooled(model: Any, feed: dict[str, Any]) -> Any:
        hidden = model(input_ids=feed["input_ids"], attention_mask=feed["attention_mask"]).last_hidden_state.float()
        mask = feed["attention_mask"].unsqueeze(-1).float()
        return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)

    refs: dict[str, np.ndarray] = {}
    reference = AutoModel.from_pretrained(model_dir, attn_implementation="sdpa", dtype=torch.float32).to(device).eval()
    with torch.inference_mode():
        for key, case in cases.items():
            feed = {k: torch.from_numpy(v.astype(np.int64)).to(device) for k, v in case.items()}
            refs[key] = pooled(reference, feed).cpu().numpy()
    del reference
    model = AutoModel.from_pretrained(model_dir, attn_implementation="sdpa", dtype=dtype).to(device).eval()
    results: dict[str, Any] = {}
    with torch.inference_mode():
        for key, case in cases.items():
            feed = {k: torch.from_numpy(v.astype(np.int64)).to(device) for k, v in case.items()}
            if device == "cuda":
                torch.cuda.reset_peak_memory_stats()

            def run(feed: dict[str, Any] = feed) -> None:
                pooled(model, feed)
                if device == "cuda":
                    torch.cuda.synchronize()

            median_s = medians_in_turns([run], repeats, warmup=3)[0]
            peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
            results[key] = {"ms": median_s * 1e3, "peak_gib": peak}
    return results, refs, f"torch {torch.__version__} {device} {str(dtype).replace('torch.', '')} sdpa"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest modernbert-attention", description=__doc__.splitlines()[0])
    p.add_argument("--name", default="local")
    p.add_argument("--smoke", action="store_true", help="tiny ModernBERT, tiny shapes, CPU: check the plumbing")
    p.add_argument("--ort-python", default=sys.executable, help="python with onnxruntime(-gpu) importable")
    p.add_argument("--repeats", type=int, help="runs timed per shape (default 10; --smoke 2)")
    p.add_argument("--shapes", help="comma list of BATCHxSEQ (default 1x2048,8x8192; --smoke 1x96,2x200)")
    p.add_argument("--work", type=Path)
    p.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = p.parse_args(argv)
    import torch

    work = args.work or Path(tempfile.mkdtemp(prefix="modernbert-attention-"))
    shapes, shape = (SMOKE_SHAPES, TINY) if args.smoke else (SHAPES, BASE)
    if args.shapes:
        shapes = tuple(tuple(int(x) for x in item.split("x")) for item in args.shapes.split(","))  # type: ignore[misc]
    repeats = args.repeats or (2 if args.smoke else 10)
    gpu = torch.cuda.is_available() and not args.smoke
    model_dir = make_modernbert(work / "model", shape)
    variants = export_variants(model_dir, work / "onnx", float16=gpu)
    cases = _cases(shapes, 1000)
    torch_res, refs, torch_desc = time_torch(model_dir, cases, repeats)
    spec = {"variants": {n: v["path"] for n, v in variants.items()}, "repeats": repeats, "warmup": 1,
            "inputs": {key: {k: v.tolist() for k, v in case.items()} for key, case in cases.items()}}
    ort = in_child(time_variants, spec, python=args.ort_python)
    rows = []
    for name in variants:
        res = ort["variants"][name]
        for key in cases:
            got = res.get(key, {"error": res.get("error", "not run")})
            ms = got.get("iobinding_ms", got.get("run_ms"))  # on CUDA inputs and output stay on the GPU
            row = {"variant": name, "shape": key, "torch_sdpa_ms": torch_res[key]["ms"],
                   "torch_peak_gib": torch_res[key]["peak_gib"], "ort_ms": ms,
                   "ort_first_ms": got.get("first_ms"), "error": got.get("error")}
            if "output" in got:
                row["min_cosine_vs_fp32"] = min_cosine(np.asarray(got["output"], np.float32), refs[key])
                row["speedup_vs_torch"] = torch_res[key]["ms"] / ms
            rows.append(row)
    record = {"name": f"{args.name}-modernbert-attention", "machine": describe_machine().model_dump(),
              "torch": torch_desc, "onnxruntime": ort["onnxruntime"], "providers": ort["providers"],
              "model": {**shape, "max_position_embeddings": 8192}, "repeats": repeats, "smoke": args.smoke,
              "fused_ops": {n: v["fused"] for n, v in variants.items()}, "rows": rows}
    lines = [f"- {torch_desc}; onnxruntime {ort['onnxruntime']} {ort['providers']}",
             f"- ModernBERT {record['model']}, median of {repeats} runs{' (tiny model)' if args.smoke else ''}",
             "", "| variant | batch x seq | PyTorch SDPA ms | ORT ms | ORT first run ms | x PyTorch | min cosine vs fp32 |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        if r["error"]:
            lines.append(f"| {r['variant']} | {r['shape']} | {r['torch_sdpa_ms']:.2f} | failed: {r['error']} | | | |")
        else:
            lines.append(f"| {r['variant']} | {r['shape']} | {r['torch_sdpa_ms']:.2f} | {r['ort_ms']:.2f} | "
                         f"{r['ort_first_ms']:.1f} | {r['speedup_vs_torch']:.2f} | {r['min_cosine_vs_fp32']:.5f} |")
    lines += ["", "Fused operators per variant: " + "; ".join(f"{n}: {f}" for n, f in record["fused_ops"].items())]
    save_step_record(record, args.out, lines, description=__doc__.split("\n\n")[0].strip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
