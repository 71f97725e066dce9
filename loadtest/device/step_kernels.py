"""The model step's GPU kernels on one packed run, for `ncu` (loadtest/device/profile.sh kernels): runs a built
packed model step on the first ROWS corpus texts WARM times, then timed; and, given ncu's CSV, what that last run
spent per kind of kernel and how its kernel time compares with its wall time outside the profiler.

    python3 loadtest/device/step_kernels.py run MODEL.onnx TOKENIZER.json ROWS WARM
    python3 loadtest/device/step_kernels.py report NCU.csv KERNELS_PER_RUN WALL_MS
"""

from __future__ import annotations

import csv
import sys
import time
from collections import defaultdict

KINDS = (("attention", ("flash", "attention", "fmha")), ("gemm", ("gemm", "xmma", "cutlass", "sm90", "sm80")),
         ("layer norm", ("layernorm", "layer_norm", "skiplayernorm")), ("gelu", ("gelu",)),
         ("copy or cast", ("cast", "copy", "transpose", "concat", "gather", "slice")))


def run(model: str, tokenizer: str, rows: int, warm: int) -> None:
    import numpy as np
    import onnxruntime as ort
    from tokenizers import Tokenizer

    from contract.packing import PackedRows, cu_seqlens_of
    from loadtest.corpus import CorpusSpec, make_corpus

    encodings = Tokenizer.from_file(tokenizer).encode_batch(make_corpus(CorpusSpec(size=4000))[:rows])
    ids = [np.asarray(e.ids[:512], np.int32) for e in encodings]
    packed = np.concatenate(ids)
    batch = PackedRows(packed, np.zeros_like(packed), cu_seqlens_of([len(i) for i in ids]))
    options = ort.SessionOptions()
    options.enable_mem_pattern = False  # as the packed runner makes its session
    session = ort.InferenceSession(model, options, providers=[("CUDAExecutionProvider", {"use_tf32": "0"})])
    feed = batch.feed({i.name for i in session.get_inputs()})
    for _ in range(warm):
        session.run(None, feed)
    walls = []
    for _ in range(10 if warm > 4 else 1):  # under ncu (warm <= 4) one run: its wall time means nothing
        start = time.perf_counter()
        session.run(None, feed)
        walls.append(1000 * (time.perf_counter() - start))
    print(f"{batch.rows} rows, {batch.tokens} tokens: last run {sorted(walls)[len(walls) // 2]:.2f} ms wall (median)")


def report(path: str, per_run: int, wall_ms: float) -> None:
    durations: list[tuple[str, float]] = []
    with open(path) as f:
        lines = [line for line in f if line.startswith('"')]
    for row in csv.DictReader(lines):
        if row.get("Metric Name") == "gpu__time_duration.sum":
            scale = {"nsecond": 1e-6, "usecond": 1e-3, "msecond": 1.0}.get(row.get("Metric Unit", ""), 1e-6)
            durations.append((row["Kernel Name"], float(row["Metric Value"].replace(",", "")) * scale))
    last = durations[-per_run:]  # the last run's
    total = sum(ms for _, ms in last)
    by_kind: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for name, ms in last:
        kind = next((k for k, keys in KINDS if any(key in name.lower() for key in keys)), "other")
        by_kind[kind][0] += 1
        by_kind[kind][1] += ms
    print(f"{len(last)} kernels, {total:.2f} ms of kernel time against {wall_ms:.2f} ms wall "
          f"({100 * total / wall_ms:.0f}% busy)")
    for kind, (count, ms) in sorted(by_kind.items(), key=lambda kv: -kv[1][1]):
        print(f"  {kind:<13} {int(count):4d} kernels {ms:7.3f} ms  {100 * ms / total:5.1f}%")
    slowest = sorted(last, key=lambda kv: -kv[1])[:12]
    for name, ms in slowest:
        print(f"  {ms:7.3f} ms  {name[:110]}")


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
    else:
        report(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]))
