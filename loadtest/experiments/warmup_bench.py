"""First-request latency with and without the builder's warm-up (issue 11), on the CPU tritonserver.

Builds loadtest/models.py's `small` BERT classifier twice (--runtime python --device cpu, defaults
otherwise: max_seq_len 512, max batch 64), once with warm-up and once with --no-warmup, then starts a
fresh tritonserver on each repository in turn (alternating, `--rounds` times each) and times, over gRPC
to the ensemble: the server's start (process start to ready), the first request, and the median of the
next `--steady` requests (same text); the client's gRPC channel is opened (a model-ready call) before the
first request is timed. The first request's text is ~40 tokens (length bucket 64): a
width the warm-up samples (16 and 512 tokens) did not run, so the effect measured is the model's
first-run cost, not a cached shape.

    python -m loadtest.experiments.warmup_bench --out loadtest/results/local-2core-11-warmup
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient

from devstack.tritonserver import TritonServer
from loadtest.models import make_bert
from tests.fixtures.repository import PYTHON_CPU, build_repository

TEXT = ("the movie was good and the actors were great but the story was long and the ending was not what "
        "we wanted to see after two hours in the cinema with friends")
MODEL = "small"


def _infer_ms(client: grpcclient.InferenceServerClient, model: str) -> float:
    tensor = grpcclient.InferInput("text", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[TEXT.encode()]], dtype=object))
    start = time.perf_counter()
    client.infer(model, [tensor])
    return (time.perf_counter() - start) * 1000


def one_run(repository: Path, log: Path, steady: int) -> dict[str, float]:
    started = time.perf_counter()
    with TritonServer(repository=repository, log_path=log) as server:
        ready_s = time.perf_counter() - started
        client = grpcclient.InferenceServerClient(server.grpc_url)
        try:
            client.is_model_ready(f"{MODEL}_onnx_ensemble")  # the gRPC channel is up before the clock starts
            first = _infer_ms(client, f"{MODEL}_onnx_ensemble")
            rest = [_infer_ms(client, f"{MODEL}_onnx_ensemble") for _ in range(steady)]
        finally:
            client.close()
    median = statistics.median(rest)
    return {"ready_s": ready_s, "first_ms": first, "second_ms": rest[0], "steady_median_ms": median,
            "first_over_steady": first / median}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtest.experiments.warmup_bench",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steady", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="warmup_bench_") as tmp:
        root = Path(tmp)
        checkpoint = make_bert(root / "checkpoint", "classify", MODEL)
        repositories = {}
        for variant, warmup in (("warmup", True), ("no-warmup", False)):
            repositories[variant] = root / variant / "model_repository"
            repositories[variant].parent.mkdir()
            build_repository(repositories[variant], [{"model": str(checkpoint), "task": "classify", "name": MODEL}],
                             warmup=warmup, **PYTHON_CPU)
        runs: dict[str, list[dict[str, float]]] = {v: [] for v in repositories}
        for round_ in range(args.rounds):
            for variant, repository in repositories.items():
                result = one_run(repository, root / f"{variant}-{round_}.log", args.steady)
                runs[variant].append(result)
                print(variant, round_, json.dumps({k: round(v, 2) for k, v in result.items()}), flush=True)
    print("\n| variant | server start s | first ms | second ms | steady median ms | first / steady |")
    print("| --- | --- | --- | --- | --- | --- |")
    medians = {}
    for variant, results in runs.items():
        medians[variant] = {k: statistics.median(r[k] for r in results) for k in results[0]}
        m = medians[variant]
        print(f"| {variant} | {m['ready_s']:.2f} | {m['first_ms']:.1f} | {m['second_ms']:.1f} | "
              f"{m['steady_median_ms']:.2f} | {m['first_over_steady']:.2f} |")
    print(f"\nfirst request, no-warmup / warmup: "
          f"{medians['no-warmup']['first_ms'] / medians['warmup']['first_ms']:.2f}x; "
          f"server start, warmup - no-warmup: {medians['warmup']['ready_s'] - medians['no-warmup']['ready_s']:+.2f} s")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps({"rounds": runs, "medians": medians}, indent=1))


if __name__ == "__main__":
    main()
