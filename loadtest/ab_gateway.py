"""Two gateway revisions side by side on one tritonserver: is a change to the request path free?

    PATH=$PWD/.venv/bin:$PATH .venv/bin/python -m loadtest ab-gateway --before REV [--rounds 8] [--out DIR]
        [--before-setting KEY=VALUE ...] [--after-setting KEY=VALUE ...] [--path /tei/bert/embed]
        [--clients 16] [--shape small] [--echo-step]

A setting (a gateway setting's name, as GATEWAY_KEY) compares one revision against itself: `--before HEAD
--after-setting loop=uvloop`.

Builds loadtest/models.py's `small` BERT embedder (or `--shape`) (--runtime python, CPU), starts one tritonserver
on it and two gateways (one worker each, scheduler pipeline, system shm): `before` runs a git
worktree of REV, `after` this checkout. Each round times, for both gateways in turn (order
alternating): 200 sequential `/embed` calls of 1 text, 50 of 8 texts (latency), 2000 calls of
1 text from 16 (`--clients`) concurrent keep-alive connections (throughput and p99, the gateway's own CPU time per
request: user + system of its processes, and where a request's time goes inside it, from its /metrics as
bench7 reads them), and 150 calls of 32 texts from 4 connections (CPU per request), on the realistic corpus
(loadtest/corpus.py). `--echo-step` serves a model step that computes nothing (loadtest/echo_step), so that
the gateway, not the CPU model, is what the concurrent phase loads: what the GPU host's fast step leaves it.
`--path` times another route that takes `{"inputs": [...]}` (TEI's `/tei/bert/embed`).
Prints medians over rounds and the after/before ratios; `--out` writes results.json + summary.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import orjson

from devstack.gateway import GatewayProcess
from devstack.tritonserver import REPO_ROOT, TritonServer
from loadtest.corpus import CorpusSpec, make_corpus
from loadtest.machine import describe_machine
from loadtest.models import SHAPES, make_bert
from loadtest.results_table import ResultRow, RunContext, add_table_argument, record_rows
from loadtest.stack_check import ECHO_MODEL_PY
from tests.fixtures.repository import build_repository

LABELS = ("before", "after")
CONCURRENT_CALLS = 2000
BATCH_CALLS = 150  # of 32 texts, from 4 clients


async def sequential(client: httpx.AsyncClient, texts: list[str], batch: int, calls: int, path: str = "/embed"
                     ) -> float:
    """Median seconds of one `path` call of `batch` texts, calls one after the other."""
    times = []
    for i in range(calls):
        chunk = [texts[(i * batch + k) % len(texts)] for k in range(batch)]
        start = time.perf_counter()
        response = await client.post(path, json={"inputs": chunk})
        times.append(time.perf_counter() - start)
        response.raise_for_status()
    return statistics.median(times)


async def concurrent(url: str, texts: list[str], clients: int, calls: int, batch: int = 1, path: str = "/embed"
                     ) -> tuple[float, float]:
    """Requests per second and the p99 latency (s) of `calls` `path` calls of `batch` texts from `clients`
    concurrent keep-alive connections (loadtest/http_client.py's lean client: the load generator's own cost stays
    small)."""
    from loadtest.http_client import Connection

    queue = iter(range(calls))
    latencies: list[float] = []
    connections = [Connection(url) for _ in range(clients)]
    await asyncio.gather(*(c.connect() for c in connections))

    async def worker(connection: Connection) -> None:
        for i in queue:
            chunk = [texts[(i * batch + k) % len(texts)] for k in range(batch)]
            sent = time.perf_counter()
            status, _, body = await connection.post(path, orjson.dumps({"inputs": chunk}))
            latencies.append(time.perf_counter() - sent)
            if status != 200:
                raise RuntimeError(f"HTTP {status}: {body[:200]!r}")

    start = time.perf_counter()
    try:
        await asyncio.gather(*(worker(c) for c in connections))
    finally:
        await asyncio.gather(*(c.close() for c in connections))
    return calls / (time.perf_counter() - start), statistics.quantiles(latencies, n=100)[98]


def echo_steps(repository: Path) -> list[str]:
    """Each model step of `repository` (`*_onnx`) made to compute nothing: loadtest/echo_step's model.py."""
    steps = sorted(p for p in repository.iterdir() if p.name.endswith("_onnx") and (p / "1" / "model.py").exists())
    for step in steps:
        shutil.copy(ECHO_MODEL_PY, step / "1" / "model.py")
    return [step.name for step in steps]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process and its children (a gateway's uvicorn workers)."""
    import psutil

    process = psutil.Process(pid)
    total = 0.0
    for p in (process, *process.children(recursive=True)):
        times = p.cpu_times()
        total += times.user + times.system
    return total


STAGES = {"tokenizing ms": "tokenize_ms", "oldest text in the batch queue ms": "oldest_queue_wait_ms",
          "round trip to Triton ms": "gateway_to_triton_ms", "gateway time per request ms": "gateway_request_ms",
          "texts per batch": "mean_batch_texts"}  # of the concurrent phase, from the gateway's /metrics (bench7's)


async def measure(urls: dict[str, str], pids: dict[str, int], texts: list[str], rounds: int, path: str = "/embed",
                  concurrency: int = 16, calls: int = CONCURRENT_CALLS, batch_calls: int = BATCH_CALLS
                  ) -> dict[str, dict[str, list[float]]]:
    from loadtest.stack_metrics import batching_stats, scheduler_counters

    rate, p99 = f"{concurrency} clients req/s", f"{concurrency} clients p99 ms"
    results: dict[str, dict[str, list[float]]] = {
        label: {"1 text ms": [], "8 texts ms": [], rate: [], p99: [], "gateway CPU us per 1-text request": [],
                "gateway CPU us per 32-text request": [], **{stage: [] for stage in STAGES}}
        for label in LABELS}
    limits = httpx.Limits(max_connections=32)
    async with httpx.AsyncClient(base_url=urls["before"], limits=limits, timeout=60) as before, \
            httpx.AsyncClient(base_url=urls["after"], limits=limits, timeout=60) as after:
        clients = {"before": before, "after": after}
        for label in LABELS:  # warm-up: connections, tokenizer, shapes
            await concurrent(urls[label], texts, 16, 200, path=path)
        for r in range(rounds):
            for label in (LABELS if r % 2 == 0 else LABELS[::-1]):
                client, out = clients[label], results[label]
                out["1 text ms"].append(await sequential(client, texts, 1, 200, path) * 1e3)
                out["8 texts ms"].append(await sequential(client, texts, 8, 50, path) * 1e3)
                cpu, counters = cpu_seconds(pids[label]), scheduler_counters(urls[label])
                per_s, tail_s = await concurrent(urls[label], texts, concurrency, calls, path=path)
                out[rate].append(per_s)
                out[p99].append(tail_s * 1e3)
                out["gateway CPU us per 1-text request"].append(
                    (cpu_seconds(pids[label]) - cpu) / calls * 1e6)
                after_counters = scheduler_counters(urls[label])
                stages = batching_stats({k: after_counters[k] - counters[k] for k in after_counters})
                for stage, key in STAGES.items():
                    out[stage].append(stages[key])
                cpu = cpu_seconds(pids[label])
                await concurrent(urls[label], texts, 4, batch_calls, batch=32, path=path)
                out["gateway CPU us per 32-text request"].append((cpu_seconds(pids[label]) - cpu) / batch_calls * 1e6)
    return results


def table_rows(context: RunContext, label: str, settings: dict[str, str], load: str,
               results: dict[str, list[float]], rounds: int) -> list[ResultRow]:
    """One side's medians of the latency, throughput, CPU and stage measures."""
    series = " ".join([label, *(f"{k}={v}" for k, v in settings.items())])
    rows = []
    for name, values in results.items():
        if any(math.isnan(v) for v in values):  # a stage the pipeline has not (the ensemble's gateway queue)
            continue
        unit = ("ms" if name.endswith(" ms") else "req/s" if name.endswith(" req/s") else
                "texts" if name == "texts per batch" else "µs")
        metric = name.removesuffix(" ms").removesuffix(" req/s").replace(" us ", " ")
        rows.append(context.row("ab-gateway", series, load, f"{metric} (median of {rounds} rounds)",
                                statistics.median(values), unit))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest ab-gateway", description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="git revision of the `before` gateway")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--out", type=Path, help="directory for results.json and summary.md")
    parser.add_argument("--path", default="/embed", help="the route timed: /embed, or TEI's /tei/bert/embed")
    parser.add_argument("--clients", type=int, default=16, help="concurrent connections of the single-text phase")
    parser.add_argument("--calls", type=int, default=CONCURRENT_CALLS, help="calls of the single-text phase")
    parser.add_argument("--batch-calls", type=int, default=BATCH_CALLS, help="calls of the 32-text phase")
    parser.add_argument("--shape", default="small", choices=list(SHAPES), help="loadtest.models shape of the BERT")
    parser.add_argument("--echo-step", action="store_true",
                        help="the model step computes nothing (loadtest/echo_step): the gateway is what is loaded")
    parser.add_argument("--name", default="ab-gateway", help="the run's name in the results table")
    for label in LABELS:
        parser.add_argument(f"--{label}-setting", action="append", default=[], metavar="KEY=VALUE",
                            help=f"a gateway setting of `{label}` (repeatable)")
    add_table_argument(parser)
    args = parser.parse_args(argv)
    extra = {label: dict(item.split("=", 1) for item in getattr(args, f"{label}_setting")) for label in LABELS}
    texts = make_corpus(CorpusSpec(size=1024))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        worktree = root / "before"
        subprocess.run(["git", "worktree", "add", "--detach", str(worktree), args.before], cwd=REPO_ROOT, check=True,
                       capture_output=True)
        try:
            model = make_bert(root / "bert", "embed", args.shape)
            repository = root / "repository"
            build_repository(repository, [{"model": str(model), "task": "embed", "name": "bert"}],
                             runtime="python", formats="onnx", device="cpu", max_seq_len=128, max_batch_size=64)
            if args.echo_step:
                echo_steps(repository)
            settings = {"repository": str(repository), "pipeline": "scheduler"}
            with TritonServer(repository=repository, log_path=root / "triton.log") as server, \
                    GatewayProcess(server.grpc_url, triton_http_url=server.http_address, settings={**settings, **extra["before"], "shm_prefix": "abbefore"},
                                   code_root=worktree, log_path=root / "before.log") as before, \
                    GatewayProcess(server.grpc_url, triton_http_url=server.http_address, settings={**settings, **extra["after"], "shm_prefix": "abafter"},
                                   log_path=root / "after.log") as after:
                assert before.process is not None and after.process is not None
                results = asyncio.run(measure({"before": before.url, "after": after.url},
                                              {"before": before.process.pid, "after": after.process.pid},
                                              texts, args.rounds, args.path, args.clients, args.calls,
                                              args.batch_calls))
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(worktree)], cwd=REPO_ROOT, check=False)
    rows = ["| measure | before | after | after/before |", "| --- | --- | --- | --- |"]
    for measure_name in results["before"]:
        b, a = (statistics.median(results[label][measure_name]) for label in LABELS)
        rows.append(f"| {measure_name} | {b:.2f} | {a:.2f} | {a / b:.2f} |")
    table = "\n".join(rows)
    step = "its step computing nothing (--echo-step)" if args.echo_step else "CPU"
    head = (f"before = {args.before} {extra['before'] or ''}, after = working tree {extra['after'] or ''}; "
            f"POST {args.path}; "
            f"{args.shape} BERT embedder (--runtime python, {step}, "
            f"max_seq_len 128); one worker each, scheduler pipeline, system shm; medians of {args.rounds} "
            f"alternating rounds; CPU: the gateway process's own user+system time over the {args.clients}-client "
            "phase (1 text) and the 4-client phase (32 texts); stage times: its /metrics over the first of them")
    print(head + "\n\n" + table)
    machine = describe_machine()
    before_commit = subprocess.run(["git", "rev-parse", "--short", args.before], cwd=REPO_ROOT, capture_output=True,
                                   text=True, check=False).stdout.strip() or args.before
    load = f"{args.path}, {args.clients} clients" + (", echo step" if args.echo_step else "")
    record_rows([row for label, commit in (("before", before_commit), ("after", None)) for row in table_rows(
        RunContext.of(machine, args.name, args.out or "", commit), label, extra[label], load, results[label],
        args.rounds)], args.table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(
            {"before": args.before, "settings": extra, "rounds": args.rounds, "path": args.path,
             "clients": args.clients, "echo_step": args.echo_step,
             "machine": machine.model_dump(mode="json"), "results": results}, indent=2))
        (args.out / "summary.md").write_text(f"# Gateway A/B\n\n{head}\n\n{table}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
