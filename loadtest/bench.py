"""Benchmarks 1-4 of issue 5, each a ratio measured side by side in one run (docs/benchmarks.md).

    PATH=$PWD/.venv/bin:$PATH .venv/bin/python -m loadtest bench --name local-2core

builds a small random BERT embedder (loadtest.models `small`) with the builder unless
`--repository` names a built one, then runs:
  1 gateway overhead   direct tritonclient gRPC vs the gateway, concurrency 1 and 32
  2 shm vs plain gRPC  direct (tritonclient shm vs plain) and gateway (GATEWAY_SHM system vs none),
                       single texts and 256-text requests
  3 bucketing          the repository vs a copy whose tokenizer pads every batch to max_seq_len
  4 dynamic batching   the repository vs a copy without dynamic_batching, concurrency 64
Each lands in loadtest/results/<name>-<benchmark>/ (results.json, summary.md, PNG).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from devstack.gateway import GatewayProcess
from devstack.tritonserver import REPO_ROOT, TritonServer
from loadtest.corpus import CorpusSpec, make_corpus
from loadtest.machine import Machine, describe_machine
from loadtest.report import RESULTS_DIR, RunRecord, save, summary_markdown
from loadtest.stats import StepResult, StepSettings
from loadtest.sweep import Series, run_sweep
from loadtest.targets import GatewaySpec, TritonSpec
from loadtest.variants import (
    ensembles,
    merged_buckets,
    pad_to_max_length,
    read_config,
    without_dynamic_batching,
)


class Bench(BaseModel):
    """What every benchmark of one run shares."""

    name: str
    repository: Path
    work: Path
    duration_s: float = 10.0
    warmup_s: float = 2.0
    corpus_size: int = 2000
    out: Path = RESULTS_DIR
    progress: bool | None = None

    def step(self, **kw: object) -> StepSettings:
        return StepSettings(duration_s=self.duration_s, warmup_s=self.warmup_s, **kw)  # type: ignore[arg-type]


def build_repository(model_dir: Path, repo: Path, name: str, task: str, extra: list[str]) -> Path:
    """`python -m builder build ... --runtime python --formats onnx --device cpu` into `repo`."""
    cmd = [sys.executable, "-m", "builder", "build", "--model", str(model_dir), "--task", task, "--name", name,
           "--repository", str(repo), "--runtime", "python", "--formats", "onnx", "--device", "cpu", *extra]
    subprocess.run(cmd, check=True, cwd=REPO_ROOT)
    return repo


def served(repo: Path) -> tuple[str, str, str, int]:
    """(ensemble model, NAME, task, max_batch_size) of the repository's first embed (else classify) ensemble."""
    found = sorted(ensembles(repo), key=lambda e: e[1].parameters["task"].string_value != "embed")
    if not found:
        raise ValueError(f"no served ensemble in {repo}")
    folder, config = found[0]
    return folder, config.parameters["model_name"].string_value, config.parameters["task"].string_value, config.max_batch_size


def ratio(a: float, b: float) -> float:
    """a / b, NaN when b is 0 (a step that completed nothing)."""
    return a / b if b else float("nan")


def find(steps: list[StepResult], label: str, **settings: object) -> StepResult:
    for s in steps:
        if s.label == label and all(getattr(s.settings, k) == v for k, v in settings.items()):
            return s
    raise KeyError(f"{label} {settings}")


def _record(bench: Bench, suffix: str, description: str, machine: Machine, steps: list[StepResult],
            ratios: dict[str, float], notes: list[str], settings: dict[str, object]) -> RunRecord:
    record = RunRecord(name=f"{bench.name}-{suffix}", description=description, machine=machine,
                       settings={"repository": str(bench.repository), "duration_s": bench.duration_s,
                                 "warmup_s": bench.warmup_s, **settings},
                       steps=steps, ratios=ratios, notes=notes)
    out = save(record, bench.out)
    print(summary_markdown(record))
    print(f"results: {out}\n", flush=True)
    return record


def gateway_and_shm(bench: Bench, texts: list[str], machine: Machine) -> list[RunRecord]:
    """Benchmarks 1 and 2: one Triton, two gateways (shm system / none), direct clients beside them."""
    ensemble, name, task, max_batch = served(bench.repository)
    endpoint = "embed" if task == "embed" else "classify"
    logs = bench.work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with TritonServer(repository=bench.repository, log_path=logs / "triton-12.log") as triton, \
            GatewayProcess(triton.grpc_url, triton_http_url=triton.http_address, settings={"shm": "system", "workers": "1"},
                           log_path=logs / "gateway-shm.log") as gw_shm, \
            GatewayProcess(triton.grpc_url, triton_http_url=triton.http_address, settings={"shm": "none", "workers": "1"},
                           log_path=logs / "gateway-none.log") as gw_none:
        direct = Series(label="direct grpc", spec=TritonSpec(url=triton.grpc_url, model=ensemble))
        direct_shm = Series(label="direct shm", spec=TritonSpec(url=triton.grpc_url, model=ensemble, shm=True))
        gateway = Series(label="gateway shm", spec=GatewaySpec(url=gw_shm.url, endpoint=endpoint, model=name))
        gateway_none = Series(label="gateway grpc", spec=GatewaySpec(url=gw_none.url, endpoint=endpoint, model=name))

        steps1 = run_sweep([direct, gateway], [bench.step(concurrency=c) for c in (1, 32)], texts, bench.progress)
        d1, g1 = find(steps1, "direct grpc", concurrency=1), find(steps1, "gateway shm", concurrency=1)
        d32, g32 = find(steps1, "direct grpc", concurrency=32), find(steps1, "gateway shm", concurrency=32)
        ratios1 = {
            "p50 added at c=1 (ms)": g1.latency_ms.p50 - d1.latency_ms.p50,
            "p99 added at c=1 (ms)": g1.latency_ms.p99 - d1.latency_ms.p99,
            "p50 added at c=32 (ms)": g32.latency_ms.p50 - d32.latency_ms.p50,
            "p99 added at c=32 (ms)": g32.latency_ms.p99 - d32.latency_ms.p99,
            "throughput gateway/direct at c=1": ratio(g1.throughput_rps, d1.throughput_rps),
            "throughput gateway/direct at c=32": ratio(g32.throughput_rps, d32.throughput_rps),
        }
        notes1 = [(f"targets: p50 added <= 1 ms at c=1 ({ratios1['p50 added at c=1 (ms)']:.2f}), "
                   f"throughput >= 0.80 of direct at c=32 ({ratios1['throughput gateway/direct at c=32']:.2f})"),
                  "load generator, gateway and tritonserver share the same cores"]
        rec1 = _record(bench, "1-gateway-overhead", "Gateway (1 worker, shm) vs direct tritonclient gRPC on the "
                       f"same ensemble `{ensemble}`, single texts from the length-mix corpus.", machine, steps1,
                       ratios1, notes1, {"ensemble": ensemble, "endpoint": endpoint})

        big = min(256, max_batch) if max_batch > 0 else 256
        plan2 = [bench.step(concurrency=1, batch=1), bench.step(concurrency=1, batch=256)]
        steps2 = run_sweep([gateway, gateway_none], plan2, texts, bench.progress)
        direct_plan = [bench.step(concurrency=1, batch=1), bench.step(concurrency=1, batch=big)]
        steps2 += run_sweep([direct_shm, direct], direct_plan, texts, bench.progress)
        ratios2 = {}
        for batch, tag in ((1, "1 text"), (256, "256 texts")):
            s, n = find(steps2, "gateway shm", batch=batch), find(steps2, "gateway grpc", batch=batch)
            ratios2[f"gateway {tag}: p50 shm/grpc"] = ratio(s.latency_ms.p50, n.latency_ms.p50)
            ratios2[f"gateway {tag}: throughput shm/grpc"] = ratio(s.throughput_rps, n.throughput_rps)
        for batch in (1, big):
            s, n = find(steps2, "direct shm", batch=batch), find(steps2, "direct grpc", batch=batch)
            ratios2[f"direct {batch} text(s): p50 shm/grpc"] = ratio(s.latency_ms.p50, n.latency_ms.p50)
            ratios2[f"direct {batch} text(s): throughput shm/grpc"] = ratio(s.throughput_rps, n.throughput_rps)
        notes2 = [(f"direct requests are capped at the ensemble's max_batch_size ({max_batch}); the gateway "
                   "splits 256-text requests itself")] if big < 256 else []
        rec2 = _record(bench, "2-shm-vs-grpc", "System shared memory vs tensors in the gRPC message, "
                       "at concurrency 1: gateway with GATEWAY_SHM=system vs none, and tritonclient directly.",
                       machine, steps2, ratios2, notes2, {"ensemble": ensemble, "direct_big_batch": big})
    return [rec1, rec2]


def _direct_pair(bench: Bench, texts: list[str], repos: dict[str, Path], plan: list[StepSettings]) -> list[StepResult]:
    """The same direct-gRPC steps on each repository in turn (one tritonserver at a time)."""
    steps: list[StepResult] = []
    logs = bench.work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    for label, repo in repos.items():
        ensemble = served(repo)[0]
        with TritonServer(repository=repo, log_path=logs / f"triton-{label.replace(' ', '_')}.log") as triton:
            steps += run_sweep([Series(label=label, spec=TritonSpec(url=triton.grpc_url, model=ensemble))],
                               plan, texts, bench.progress)
    return steps


def bucketing(bench: Bench, texts: list[str], machine: Machine) -> RunRecord:
    """Benchmark 3: bucketed padding vs padding every batch to max_seq_len, on the length mix."""
    padded = pad_to_max_length(bench.repository, bench.work / "repo-padded")
    plan = [bench.step(concurrency=c) for c in (1, 16)]
    steps = _direct_pair(bench, texts, {"buckets": bench.repository, "max-length": padded}, plan)
    ratios = {f"throughput buckets/max-length at c={c}":
              ratio(find(steps, "buckets", concurrency=c).throughput_rps,
                    find(steps, "max-length", concurrency=c).throughput_rps)
              for c in (1, 16)}
    tok = [n for n, c in ((p.parent.name, read_config(p.parent)) for p in bench.repository.glob("*/config.pbtxt"))
           if "length_buckets" in c.parameters]
    buckets = read_config(bench.repository / tok[0]).parameters["length_buckets"].string_value if tok else "?"
    return _record(bench, "3-bucketing", f"Tokenizer length buckets ({buckets}) vs one bucket = max_seq_len, "
                   "direct gRPC single texts from the length-mix corpus.", machine, steps, ratios,
                   ["target: >= 2x throughput with buckets"], {"length_buckets": buckets})


def dynamic_batching(bench: Bench, texts: list[str], machine: Machine) -> RunRecord:
    """Benchmark 4: Triton dynamic batching on vs off at concurrency 64."""
    off = without_dynamic_batching(bench.repository, bench.work / "repo-nobatch")
    plan = [bench.step(concurrency=c) for c in (1, 64)]
    steps = _direct_pair(bench, texts, {"dynamic batching": bench.repository, "no batching": off}, plan)
    on_off = ratio(find(steps, "dynamic batching", concurrency=64).throughput_rps,
                   find(steps, "no batching", concurrency=64).throughput_rps)
    return _record(bench, "4-dynamic-batching", "Dynamic batching on (as built) vs removed from every "
                   "non-ensemble model, direct gRPC single texts.", machine, steps,
                   {"throughput on/off at c=64": on_off}, ["target: >= 3x at concurrency 64"], {})


def bucket_merging(bench: Bench, texts: list[str], machine: Machine) -> RunRecord:
    """Benchmark 3m: per-request buckets vs buckets merged by the dynamic batcher (ragged batch,
    padded to the widest request by the runner) vs padding everything to max_seq_len."""
    merged = merged_buckets(bench.repository, bench.work / "repo-merged")
    padded = pad_to_max_length(bench.repository, bench.work / "repo-padded")
    levels = (16, 64)
    plan = [bench.step(concurrency=c) for c in levels]
    steps = _direct_pair(bench, texts, {"buckets": bench.repository, "merged buckets": merged,
                                        "max-length": padded}, plan)
    ratios = {}
    for c in levels:
        merged_rps = find(steps, "merged buckets", concurrency=c).throughput_rps
        ratios[f"throughput merged/buckets at c={c}"] = ratio(merged_rps, find(steps, "buckets", concurrency=c).throughput_rps)
        ratios[f"throughput merged/max-length at c={c}"] = ratio(merged_rps, find(steps, "max-length", concurrency=c).throughput_rps)
    return _record(bench, "3m-bucket-merging", "Per-request length buckets vs buckets merged by the dynamic "
                   "batcher (--merge-buckets) vs one bucket = max_seq_len, direct gRPC single texts from the "
                   "length-mix corpus.", machine, steps, ratios, [], {})


BENCHMARKS: dict[str, Callable[[Bench, list[str], Machine], object]] = {
    "12": gateway_and_shm, "3": bucketing, "3m": bucket_merging, "4": dynamic_batching,
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest bench", description=__doc__.splitlines()[0])
    p.add_argument("--name", default="local")
    p.add_argument("--repository", type=Path, help="a built repository (default: build the small model)")
    p.add_argument("--shape", default="small", help="model shape when building (loadtest.models.SHAPES)")
    p.add_argument("--builder-arg", action="append", default=[], help="extra builder argument (repeatable)")
    p.add_argument("--only", default="12,3,4", help="comma list of 12 (benchmarks 1+2), 3, 3m (bucket merging), 4")
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--work", type=Path, default=None)
    p.add_argument("--out", type=Path, default=RESULTS_DIR)
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)
    args = p.parse_args(argv)
    work = args.work or Path(tempfile.mkdtemp(prefix="loadtest-"))
    repo = args.repository
    if repo is None:
        from loadtest.models import make_bert

        model_dir = make_bert(work / "model", "embed", args.shape)
        repo = build_repository(model_dir, work / "repository", "bench", "embed",
                                [a for arg in args.builder_arg for a in arg.split()])
    bench = Bench(name=args.name, repository=repo.resolve(), work=work, duration_s=args.duration,
                  warmup_s=args.warmup, out=args.out, progress=args.progress)
    texts = make_corpus(CorpusSpec(size=bench.corpus_size))
    machine = describe_machine()
    for key in args.only.split(","):
        BENCHMARKS[key.strip()](bench, texts, machine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
