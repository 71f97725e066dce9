"""What a new input shape costs the model step: onnxruntime CUDA on the builder's fp16 graph.

    python -m loadtest cold-shapes [--model PATH/model.onnx] [--only default] [--profile | --all-variants]

The gateway's batches and Triton's merged batches take many shapes (rows x padded width). This
times every call of two sweeps in a fresh session, once cold and once warm: batch size 1..48 at
width 128, and width 8..512 (step 8) at batch 8, under several session settings, each in its own
process (loadtest.ort_probe; some settings are environment variables read once). Prints, per setting, the median cold and warm
call per sweep; the difference is what each new shape costs.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

from loadtest.ort_probe import cold_sweeps, in_child, profile_runs, step_python

SWEEPS = {"batch 1..48 x 128": [[rows, 128] for rows in range(1, 49)],
          "8 x width 8..512": [[8, width] for width in range(8, 513, 8)]}
PROFILED = [[3, 40], [5, 72], [3, 40], [5, 72]]  # two new shapes, then the same two again

SETTINGS: dict[str, dict[str, object]] = {
    "default": {},
    "no memory pattern": {"session": {"enable_mem_pattern": False}},
    "arena kSameAsRequested": {"cuda": {"arena_extend_strategy": "kSameAsRequested"}},
    "no TRT fused attention": {"env": {"ORT_DISABLE_FUSED_ATTENTION": "1", "ORT_DISABLE_TRT_FLASH_ATTENTION": "1"}},
    "no fused / flash / efficient attention": {"env": {"ORT_DISABLE_FUSED_ATTENTION": "1",
                                                       "ORT_DISABLE_TRT_FLASH_ATTENTION": "1",
                                                       "ORT_DISABLE_FLASH_ATTENTION": "1",
                                                       "ORT_DISABLE_MEMORY_EFFICIENT_ATTENTION": "1"}},
    "cuBLAS: tunable op off, no tf32": {"cuda": {"tunable_op_enable": "0", "use_tf32": "0"}},
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest cold-shapes", description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, help="model.onnx (default: export --shape as the builder does, fp16)")
    p.add_argument("--shape", default="base")
    p.add_argument("--python", default=step_python(),
                   help="python with onnxruntime(-gpu) importable (default: $TRITON_STUB_PYTHON, else this one)")
    p.add_argument("--only", default="", help="comma list of setting names (default: all)")
    p.add_argument("--profile", action="store_true", help="onnxruntime's profiler on two cold shapes instead")
    p.add_argument("--all-variants", action="store_true",
                   help="every optimizer variant of loadtest.model_step, default settings, instead")
    args = p.parse_args(argv)
    chosen = [s for s in SETTINGS if not args.only or s in args.only.split(",")]
    if args.model is None:
        from loadtest.model_step import export_variants
        from loadtest.models import make_bert

        work = Path(tempfile.mkdtemp(prefix="cold-shapes-"))
        variants = export_variants(make_bert(work / "model", "embed", args.shape), work / "onnx", float16=True,
                                   builder_only=not args.all_variants)
        args.model = Path(next(iter(variants.values()))["path"])
        if args.all_variants:
            for name, variant in variants.items():
                print(f"{name:<40} {sweep(args.python, Path(variant['path']), {}, dict(os.environ))}", flush=True)
            return 0
    if args.profile:
        result = in_child(profile_runs, {"model": str(args.model), "shapes": PROFILED}, python=args.python)
        for run in result["runs"]:
            print(f"{run['shape']}: {run['wall_ms']:.1f} ms; model_run {run['model_run_ms']:.1f} ms, nodes "
                  f"{run['nodes_ms']:.1f} ms; top: {run['top']}")
        print("placement:", result["placement"])
        print("session events:", result["session_events"], flush=True)
        return 0
    for name in chosen:
        setting = SETTINGS[name]
        extra: dict[str, str] = setting.get("env", {})  # type: ignore[assignment]
        print(f"{name:<40} {sweep(args.python, args.model, setting, {**os.environ, **extra})}", flush=True)
    return 0


def sweep(python: str, model: Path, setting: dict[str, object], env: dict[str, str]) -> str:
    """Both sweeps, cold then warm, in a fresh session of its own process: a line of medians."""
    spec = {"model": str(model), "sweeps": SWEEPS, "session": setting.get("session", {}),
            "cuda": setting.get("cuda", {})}
    try:
        result = in_child(cold_sweeps, spec, python=python, env=env)
    except RuntimeError as exc:
        return f"failed: {str(exc)[-600:]}"
    return " | ".join(f"{name}: cold {v['cold']:.1f} ms (max {v['cold_max']:.0f}), warm {v['warm']:.1f} ms"
                      for name, v in result["sweeps"].items())


if __name__ == "__main__":
    sys.exit(main())
