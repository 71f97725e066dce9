"""The gateway's tensor transports side by side: GATEWAY_SHM=cuda, system and none, in one run.

    python -m loadtest transport --name h100 [--shape base] [--device gpu] [--rounds 3]

One tritonserver (the PyPI-wheel binary) serves one embedder built by the builder (`--runtime python`:
the python-backend onnxruntime runner; on `--device gpu` a KIND_GPU instance on the CUDA provider).
Three gateways (one worker each, scheduler pipeline) differ only in GATEWAY_SHM. The run:
1. records Triton's extensions (`cuda_shared_memory` must be among them for `cuda`) and the runner's
   providers from Triton's log (the model step on the GPU);
2. checks that `/embed` answers agree: 1 text and 64 texts of the corpus through each transport,
   compared with `system` (max abs difference, and whether bit-identical), next to `system` asked
   again (the model's own run-to-run difference);
3. proves each gateway used its transport: Triton's CUDA / system region status lists its regions,
   and the gateway's `gateway_triton_request_duration_seconds` counts calls by transport;
4. measures, in `--rounds` interleaved rounds (the transport order rotates each round), 1-text and
   64-text `/embed` requests at c=1 (latency) and at higher concurrency (throughput), and 256-text
   requests (the most tensor bytes per call).
A transport this machine cannot use (`cuda` without a GPU) is left out with the reason in the notes.
Results: loadtest/results/<name>-12-transports/ (results.json, summary.md).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from devstack.gateway import GatewayProcess
from devstack.tritonserver import REPO_ROOT, TritonServer
from loadtest.corpus import CorpusSpec, make_corpus
from loadtest.machine import describe_machine
from loadtest.report import RESULTS_DIR, RunRecord, save, summary_markdown
from loadtest.runner import run_step
from loadtest.stats import StepResult, StepSettings
from loadtest.targets import GatewaySpec

TRANSPORTS = ("cuda", "system", "none")
STEPS = (  # (label, texts per request, concurrency)
    ("1 text c=1", 1, 1),
    ("64 texts c=1", 64, 1),
    ("1 text c=32", 1, 32),
    ("64 texts c=4", 64, 4),
    ("256 texts c=1", 256, 1),
)


def build(model_dir: Path, repo: Path, args: argparse.Namespace) -> None:
    cmd = [sys.executable, "-m", "builder", "build", "--model", str(model_dir), "--task", "embed", "--name", "bench",
           "--repository", str(repo), "--runtime", "python", "--formats", "onnx", "--device", args.device,
           "--max-batch-size", str(args.max_batch_size), "--instances", "1", "--tokenizer-instances", "1"]
    subprocess.run(cmd, check=True, cwd=REPO_ROOT)


def cuda_unavailable() -> str:
    """Why this machine cannot run GATEWAY_SHM=cuda, or "" when it can (the gateway's own check)."""
    code = "from gateway.triton.shm_pool import probe_cuda; print(probe_cuda(0))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT)
    return "" if out.returncode == 0 else (out.stderr.strip().splitlines() or ["probe failed"])[-1]


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as resp:
        return dict(json.loads(resp.read()))


def embed(url: str, texts: list[str]) -> np.ndarray:
    return np.array(post(f"{url}/embed", {"model": "bench", "inputs": texts})["embeddings"], dtype=np.float32)


def calls_by_transport(url: str) -> dict[str, float]:
    """The gateway's Triton calls so far, by transport label (`shm` = through its regions, `grpc` = in-band)."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    counts: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(r'gateway_triton_request_duration_seconds_count\{.*transport="(\w+)".*\} (\S+)', line)
        if match:
            counts[match[1]] = counts.get(match[1], 0.0) + float(match[2])
    return counts


def registered_regions(grpc_url: str) -> dict[str, list[str]]:
    """Region names Triton has registered, by kind."""
    import tritonclient.grpc as grpcclient

    client = grpcclient.InferenceServerClient(grpc_url)
    system = client.get_system_shared_memory_status(as_json=True).get("regions", {})
    try:
        cuda = client.get_cuda_shared_memory_status(as_json=True).get("regions", {})
    except Exception as exc:  # noqa: BLE001 - a Triton without the extension says so
        cuda = {f"(status failed: {exc})": {}}
    return {"system": sorted(system), "cuda": sorted(cuda)}


def server_extensions(grpc_url: str) -> list[str]:
    import tritonclient.grpc as grpcclient

    return list(grpcclient.InferenceServerClient(grpc_url).get_server_metadata(as_json=True).get("extensions", []))


def runner_lines(log: Path) -> list[str]:
    """The python runner's start-up lines (its onnxruntime providers) from Triton's log."""
    return [line.strip()[-200:] for line in log.read_text(errors="replace").splitlines() if "onnxruntime" in line
            and " on [" in line]


def agreement(answers: dict[str, dict[str, np.ndarray]]) -> dict[str, dict[str, float]]:
    """Per transport and request: max abs difference to `system`'s answer, and 1.0 when bit-identical."""
    base = answers["system"]
    out: dict[str, dict[str, float]] = {}
    for transport, got in answers.items():
        for key, vectors in got.items():
            out.setdefault(transport, {})[f"{key} max_abs_diff"] = float(np.max(np.abs(vectors - base[key])))
            out[transport][f"{key} identical"] = float(np.array_equal(vectors, base[key]))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest transport", description=__doc__.splitlines()[0])
    p.add_argument("--name", default="local")
    p.add_argument("--shape", default="base")
    p.add_argument("--device", default="gpu", choices=["gpu", "cpu"])
    p.add_argument("--transports", default=",".join(TRANSPORTS))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--duration", type=float, default=4.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--max-batch-size", type=int, default=256)
    p.add_argument("--corpus-size", type=int, default=2000)
    p.add_argument("--repository", type=Path, help="a built repository with model `bench` (default: build one)")
    p.add_argument("--work", type=Path)
    p.add_argument("--out", type=Path, default=RESULTS_DIR)
    args = p.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="transport-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    transports = [t for t in args.transports.split(",") if t]
    if "cuda" in transports and (why := cuda_unavailable()):
        transports.remove("cuda")
        notes.append(f"GATEWAY_SHM=cuda left out: this machine cannot use it ({why})")
    assert "system" in transports, "the answers are compared with the system transport's"
    repo = args.repository
    if repo is None:
        from loadtest.models import make_bert

        repo = work / "repository"
        build(make_bert(work / "model", "embed", args.shape), repo, args)
    corpus = make_corpus(CorpusSpec(size=args.corpus_size))
    samples = {"1 text": corpus[:1], "64 texts": corpus[1:65]}
    results: dict[tuple[str, str], list[StepResult]] = {}
    checks: dict[str, Any] = {}
    with TritonServer(repository=repo, log_path=work / "triton.log", startup_timeout_s=300) as triton:
        checks["triton extensions"] = server_extensions(triton.grpc_url)
        checks["model step runner"] = runner_lines(work / "triton.log")
        gateways = {t: GatewayProcess(triton.grpc_url, triton_http_url=triton.http_address, log_path=work / f"gateway-{t}.log", settings={
            "shm": t, "workers": "1", "pipeline": "scheduler", "repository": str(repo), "log_level": "warning",
            "shm_prefix": f"tb{t}"}) for t in transports}
        for gateway in gateways.values():
            gateway.start()
        try:
            answers = {t: {k: embed(g.url, texts) for k, texts in samples.items()} for t, g in gateways.items()}
            # the same transport asked again: how far apart two runs of the model itself are (GPU kernels
            # need not be bit-reproducible), the yardstick for the differences between transports
            answers["system, asked again"] = {k: embed(gateways["system"].url, texts) for k, texts in samples.items()}
            checks["agreement with system"] = agreement(answers)
            checks["regions registered in Triton"] = registered_regions(triton.grpc_url)
            checks["gateway calls by transport (after the agreement check)"] = {
                t: calls_by_transport(g.url) for t, g in gateways.items()}
            for round_ in range(args.rounds):
                order = transports[round_ % len(transports):] + transports[:round_ % len(transports)]
                for transport in order:
                    spec = GatewaySpec(url=gateways[transport].url, endpoint="embed", model="bench", timeout_s=60)
                    for label, batch, concurrency in STEPS:
                        settings = StepSettings(concurrency=concurrency, batch=batch, duration_s=args.duration,
                                                warmup_s=args.warmup, procs=1 if concurrency == 1 else 2)
                        result = run_step(f"{transport}: {label}", spec, settings, corpus)
                        results.setdefault((transport, label), []).append(result)
                        print(f"  round {round_ + 1} {result.label:<26} {result.items_per_s:9.0f} texts/s  "
                              f"p50 {result.latency_ms.p50:8.2f} ms  errors {result.errors}", file=sys.stderr,
                              flush=True)
        finally:
            for gateway in gateways.values():
                gateway.stop()
    steps, ratios = summarise(results, transports)
    machine = describe_machine()
    notes += [
        f"{args.rounds} interleaved rounds of {args.duration} s per step (+{args.warmup} s warm-up); each step shown "
        "is the round with the median texts/s; ratios compare medians over the rounds",
        f"repository: model `bench`, shape {args.shape}, builder --runtime python --device {args.device} "
        f"--max-batch-size {args.max_batch_size}; gateways: 1 worker each, scheduler pipeline; corpus "
        f"make_corpus(CorpusSpec(size={args.corpus_size}))",
    ]
    record = RunRecord(name=f"{args.name}-12-transports", description=__doc__.split("\n\n")[1], machine=machine,
                       settings={"shape": args.shape, "device": args.device, "rounds": args.rounds,
                                 "duration_s": args.duration, "transports": transports, "checks": checks},
                       steps=steps, ratios=ratios, notes=notes)
    save(record, args.out)
    print(summary_markdown(record), flush=True)
    return 0


def summarise(results: dict[tuple[str, str], list[StepResult]], transports: list[str]
              ) -> tuple[list[StepResult], dict[str, float]]:
    """The median round of each (transport, step), and each transport's p50 and texts/s over `system`'s."""
    steps: list[StepResult] = []
    medians: dict[tuple[str, str], tuple[float, float]] = {}
    for (transport, label), rounds in results.items():
        ordered = sorted(rounds, key=lambda r: r.items_per_s)
        steps.append(ordered[len(ordered) // 2])
        medians[transport, label] = (statistics.median(r.latency_ms.p50 for r in rounds),
                                     statistics.median(r.items_per_s for r in rounds))
    ratios: dict[str, float] = {}
    for transport in transports:
        if transport == "system":
            continue
        for label, _, _ in STEPS:
            (p50, rate), (base_p50, base_rate) = medians[transport, label], medians["system", label]
            ratios[f"{label}: p50 {transport} / system"] = p50 / base_p50
            ratios[f"{label}: texts/s {transport} / system"] = rate / base_rate
    return steps, ratios


if __name__ == "__main__":
    sys.exit(main())
