"""Load time and peak memory of 8k-context models in tritonserver, before and after issue 23's changes.

Builds tests/fixtures/tiny_models.py's 8,192-token models (a ModernBERT with a 64-token local window, an
XLM-R in bge-m3's shape) with the builder (--runtime python --device cpu, max batch 64, defaults
otherwise), each in its variants, then starts a fresh tritonserver on each repository in turn and
measures: the time from process start to ready (Triton runs the `model_warmup` samples before that), and
the peak resident memory of Triton's process group (tritonserver and its python-backend stubs, polled from
/proc every 50 ms).

Variants (the same builder, the older behaviour switched back on for the "before" ones):
- `before`: the `max_length` warm-up sample has max-batch-size rows of max-seq-len tokens (64 x 8,192),
  which the python runner cuts into calls of its 16,384-token budget (32 calls of 2 x 8,192),
  ModernBERT's attention is the plain export's (unfused, its window applied as a mask), and GPU builds
  declare widths up to 512, then 8,192;
- `warm-up bounded`: the warm-up sample holds what one call's token budget holds (2 x 8,192), attention as
  before (ModernBERT only);
- `after`: both changes (warm-up bounded by the budget; ModernBERT's attention fused into MultiHeadAttention).

    python -m loadtest long-context --out loadtest/results/local-2core-23-long-context
    python3 -m loadtest long-context --device gpu --shape base --models modernbert-8k --variants before,after \
        --rounds 1 --out $OUT/results/h100-23-long-context-modernbert        # on the GPU host (device README)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from devstack.tritonserver import TritonServer, group_members
from loadtest.machine import describe_machine
from tests.fixtures.repository import PYTHON_CPU, build_repository
from tests.fixtures.tiny_models import write_tiny_modernbert, write_tiny_xlmr

MODELS: dict[str, Callable[..., Path]] = {
    "modernbert-8k": write_tiny_modernbert,
    "xlmr-8k (bge-m3 shape)": lambda d, **sizes: write_tiny_xlmr(d, "bge-m3", **sizes),
}
# --shape base: the sizes of the models teams deploy (random weights): ModernBERT-base (ruri-v3-310m,
# gte-modernbert-base) and XLM-R large (bge-m3)
BASE_SIZES: dict[str, dict[str, int]] = {
    "modernbert-8k": {"hidden_size": 768, "intermediate_size": 1152, "num_hidden_layers": 22,
                      "num_attention_heads": 12, "local_attention": 128},
    "xlmr-8k (bge-m3 shape)": {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
                               "num_attention_heads": 16},
}
VARIANTS = {"modernbert-8k": ("before", "warm-up bounded", "after"), "xlmr-8k (bge-m3 shape)": ("before", "after")}


@contextmanager
def _variant(name: str) -> Iterator[None]:
    """The builder with the behaviour before issue 23 switched back on, as `name` says."""
    import builder.exporting
    import builder.plan
    import builder.configs

    from contract.batching import GPU_WIDTHS

    rows, fused, widths = builder.configs.warmup_max_length_rows, builder.exporting.FUSED_EXPORT_TYPES, builder.plan.default_widths
    if name == "before":
        builder.configs.warmup_max_length_rows = lambda s: s.max_batch_size  # type: ignore[assignment]
        # GPU builds: widths up to 512, then max_seq_len itself
        builder.plan.default_widths = lambda m: tuple(sorted({w for w in GPU_WIDTHS if w < m} | {m}))  # type: ignore
    if name in ("before", "warm-up bounded"):
        builder.exporting.FUSED_EXPORT_TYPES = frozenset()  # type: ignore[misc]
    try:
        yield
    finally:
        builder.configs.warmup_max_length_rows = rows  # type: ignore[assignment]
        builder.exporting.FUSED_EXPORT_TYPES = fused  # type: ignore[misc]
        builder.plan.default_widths = widths  # type: ignore[assignment]


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def start_and_measure(repository: Path, log: Path, timeout_s: float) -> dict[str, float]:
    """Seconds from tritonserver's start to ready, and the peak RSS (GiB) of its process group meanwhile."""
    server = TritonServer(repository=repository, log_path=log, startup_timeout_s=timeout_s)
    peak, stop = [0], threading.Event()

    def poll() -> None:
        while not stop.is_set():
            if server.process is not None:
                peak[0] = max(peak[0], sum(_rss_kib(p) for p in group_members(server.process.pid)))
            stop.wait(0.05)

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    started = time.monotonic()
    try:
        server.start()
        seconds = time.monotonic() - started
    finally:
        stop.set()
        watcher.join()
        server.stop()
    return {"load_s": seconds, "peak_rss_gib": peak[0] / 2**20}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest long-context", description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--models", default=",".join(MODELS), help="comma list of " + ", ".join(MODELS))
    p.add_argument("--timeout", type=float, default=900.0, help="seconds a load may take")
    p.add_argument("--device", choices=["cpu", "gpu"], default="cpu",
                   help="gpu: KIND_GPU model steps (fp16, declared shapes warmed at load; onnxruntime-gpu in the stub)")
    p.add_argument("--shape", choices=["tiny", "base"], default="tiny", help="base: real model sizes (random weights)")
    p.add_argument("--variants", default="before,warm-up bounded,after",
                   help="comma list of the variants to build and load (those a model has)")
    p.add_argument("--onnx-precision", choices=["fp16", "fp32"],
                   help="the builder's --onnx-precision (default: its own, fp16 on the GPU; fp32: random deep models "
                        "fail fp16 parity, results/h100-23-deep-parity)")
    p.add_argument("--skip-parity", action="store_true",
                   help="publish without the parity gate: load time and memory only (random deep models fail fp16 "
                        "parity on the GPU, results/h100-23-deep-parity; their load does not depend on it)")
    p.add_argument("--work", type=Path)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="long-context-load-"))
    settings: dict[str, Any] = {**PYTHON_CPU, "device": args.device, "max_batch_size": 64}
    if args.onnx_precision:
        settings["onnx_precision"] = args.onnx_precision
    if args.skip_parity:
        settings["skip_parity"] = True
    repos: dict[tuple[str, str], Path] = {}
    for model in args.models.split(","):
        sizes = BASE_SIZES[model] if args.shape == "base" else {}
        source = MODELS[model](work / "models" / model.split()[0], **sizes)
        for variant in [v for v in VARIANTS[model] if v in args.variants.split(",")]:
            repo = work / "repos" / f"{model.split()[0]}-{variant.replace(' ', '-')}"
            repo.parent.mkdir(parents=True, exist_ok=True)
            with _variant(variant):
                started = time.monotonic()
                build_repository(repo, [{"model": str(source), "task": "embed", "name": "m"}], **settings)
            print(f"{model} {variant}: built in {time.monotonic() - started:.1f}s", flush=True)
            repos[(model, variant)] = repo
    samples: dict[tuple[str, str], list[dict[str, float]]] = {key: [] for key in repos}
    for round_ in range(args.rounds):  # alternating, so that the machine's load affects every variant alike
        for (model, variant), repo in repos.items():
            result = start_and_measure(repo, work / f"triton-{round_}.log", args.timeout)
            samples[(model, variant)].append(result)
            print(f"round {round_}: {model} {variant}: ready in {result['load_s']:.1f}s, "
                  f"peak RSS {result['peak_rss_gib']:.2f} GiB", flush=True)
    rows = [{"model": m, "variant": v, "load_s": statistics.median(x["load_s"] for x in s),
             "peak_rss_gib": statistics.median(x["peak_rss_gib"] for x in s), "rounds": s}
            for (m, v), s in samples.items()]
    import onnxruntime
    import torch
    import transformers

    record = {"name": "long-context-load", "machine": describe_machine().model_dump(),
              "versions": {"onnxruntime": onnxruntime.__version__, "torch": torch.__version__,
                           "transformers": transformers.__version__, "tritonserver": "2.51 (nvidia-pytriton 0.7.0)"},
              "settings": {**settings, "shape": args.shape, "max_seq_len": 8192, "max_batch_tokens": 16384,
                           "rounds": args.rounds,
                           "cpu_count": os.cpu_count()}, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(record, indent=2))
    lines = ["| model | variant | load s (start to ready) | peak RSS GiB (Triton + stubs) |", "| --- | --- | ---: | ---: |"]
    lines += [f"| {r['model']} | {r['variant']} | {r['load_s']:.1f} | {r['peak_rss_gib']:.2f} |" for r in rows]
    print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
