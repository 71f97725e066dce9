"""What the Rust tokenizer's thread pool gives and costs per call, by request size (issue 20, 32-text requests).

    .venv/bin/python -m loadtest.experiments.tokenizer_pool [--threads 2 4] [--rounds 15] [--out DIR]

For each pool size (one child process each: the pool is sized once, from RAYON_NUM_THREADS, at its first use),
times `TextEncoder.encode` on requests of 1, 8 and 32 corpus texts with the pool on and off. tokenizers reads
TOKENIZERS_PARALLELISM at every batch call, so the two alternate call by call in one process, on one warm pool,
and machine noise hits both alike. Reports the median wall time and the process's CPU time per call (every
thread's, so a pool's spinning threads count), and checks that both give the same ids.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIZES = (1, 8, 32)
PARALLELISM = "TOKENIZERS_PARALLELISM"


def measure(threads: int, rounds: int) -> list[dict[str, float]]:
    """In a child whose RAYON_NUM_THREADS is `threads`: one row per request size, pool on against off."""
    import numpy as np

    from contract.tokenization import TextEncoder
    from loadtest.corpus import CorpusSpec, make_corpus
    from loadtest.models import make_bert

    texts = make_corpus(CorpusSpec(size=2048))
    with tempfile.TemporaryDirectory() as tmp:
        encoder = TextEncoder.from_file(str(make_bert(Path(tmp) / "bert", "embed", "small") / "tokenizer.json"), 512)
    rows = []
    for size in SIZES:
        calls = [texts[i : i + size] for i in range(0, 64 * size, size)]
        wall: dict[bool, list[float]] = {True: [], False: []}
        cpu: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(rounds):
            for pool in (True, False):
                os.environ[PARALLELISM] = "true" if pool else "false"
                start_wall, start_cpu = time.perf_counter(), time.process_time()
                for call in calls:
                    encoder.encode(call)
                wall[pool].append((time.perf_counter() - start_wall) / len(calls))
                cpu[pool].append((time.process_time() - start_cpu) / len(calls))
        os.environ[PARALLELISM] = "true"
        pooled = encoder.encode(texts[: 64 * size])
        os.environ[PARALLELISM] = "false"
        serial = encoder.encode(texts[: 64 * size])
        assert all(np.array_equal(a, b) for a, b in zip(pooled.ids, serial.ids)), "pool and serial ids differ"
        on, off = statistics.median(wall[True]) * 1e3, statistics.median(wall[False]) * 1e3
        cpu_on, cpu_off = statistics.median(cpu[True]) * 1e3, statistics.median(cpu[False]) * 1e3
        rows.append({"threads": threads, "texts": size, "wall_ms_pool": on, "wall_ms_serial": off,
                     "cpu_ms_pool": cpu_on, "cpu_ms_serial": cpu_off})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.experiments.tokenizer_pool",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--out", type=Path, help="directory for results.json")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)  # one pool size, in its own process
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.child, args.rounds)))
        return 0
    rows = []
    for threads in args.threads:
        env = {**os.environ, "RAYON_NUM_THREADS": str(threads), PARALLELISM: "true"}
        child = subprocess.run([sys.executable, "-m", "loadtest.experiments.tokenizer_pool", "--child", str(threads),
                                "--rounds", str(args.rounds)], env=env, check=True, capture_output=True, text=True)
        rows += json.loads(child.stdout.strip().splitlines()[-1])
    print(f"CPUs {os.cpu_count()}; medians of {args.rounds} rounds, pool and serial alternating; ms per call\n")
    print("| pool threads | texts/call | wall, pool | wall, serial | pool/serial | CPU, pool | CPU, serial | pool/serial |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['threads']} | {r['texts']} | {r['wall_ms_pool']:.3f} | {r['wall_ms_serial']:.3f} | "
              f"{r['wall_ms_pool'] / r['wall_ms_serial']:.2f} | {r['cpu_ms_pool']:.3f} | {r['cpu_ms_serial']:.3f} | "
              f"{r['cpu_ms_pool'] / r['cpu_ms_serial']:.2f} |")
    if args.out:
        from loadtest.machine import describe_machine

        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(
            {"rounds": args.rounds, "machine": describe_machine().model_dump(mode="json"), "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
