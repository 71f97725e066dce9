"""Benchmark 7: this stack against in-process peers and another embedding server, in one run.

    python -m loadtest bench7 --name h100 [--shape base] [--parts peers,scheduler,ensemble,infinity]

On the GPU host (loadtest/device/README.md), same model shape, same corpus
(`make_corpus(CorpusSpec(size=4000))`), same run:
- peers, in-process (loadtest.peers, a child process): sentence-transformers fp16 `encode` at
  batch 256, Hugging Face SDPA fp16 on length-sorted batches of 256;
- `infinity-emb` (when $INFINITY_PYTHON names a python with it): single-text `/embeddings`;
- this stack through HTTP, the gateway with GATEWAY_PIPELINE=scheduler and, beside it, =ensemble:
  single-text `/embed` at c=64 and c=256, 32-text requests at c=16, requests of 32-256 texts at 8-64 clients,
  a single short text at c=1, from the load generator's lean client (`--client raw`: the client shares the host
  it measures). Each step also reports the cores each process group used and the GPU's busy share
  (loadtest/host_usage.py; with $LOADTEST_PYSPY=DIR, py-spy profiles of the gateway and the stubs).
The repository is built with the builder (`--runtime python --device gpu`: the python-backend
onnxruntime runner, fp16 graph, CUDA provider), served by the PyPI-wheel tritonserver.
Every step reports texts/s, tokens/s (texts/s x the corpus' mean tokens per text), p50/p99 and
errors; the scheduler steps also the padding ratio (gateway_scheduled_tokens_total computed/real
over the step) and the mean batch size. The model step's own batch-1 time for the short text is
measured alone (onnxruntime on the same model.onnx, same provider) for the c=1 target: first, and again after the
stack's steps (where the c=1 steps ran: after the loaded steps, beside an idle Triton), each with its ratio row.
Results: loadtest/results/runs/<name>-7-peers/ (results.json, summary.md, peers.png); the headline figures are
appended to the results table (loadtest/results_table.py).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from contract.batching import Shapes, default_widths
from devstack.gateway import GatewayProcess
from devstack.tritonserver import REPO_ROOT, TritonServer, free_port
from loadtest.corpus import CorpusSpec, make_corpus
from loadtest.host_usage import HostUsage
from loadtest.machine import describe_machine
from loadtest.ort_probe import in_child, step_python, time_shapes
from loadtest.report import RunRecord, save, summary_markdown
from loadtest.results_report import LARGE_LOADS, LOADS, LONE
from loadtest.results_table import RUNS_DIR, ResultRow, RunContext, add_table_argument, record_rows
from loadtest.runner import run_step
from loadtest.stack_metrics import (
    batching_stats,
    save_diagnostics,
    scheduler_counters,
    step_stats,
    triton_times,
    wait_until_served,
    worker_count,
)
from loadtest.stats import Latency, StepResult, StepSettings
from loadtest.targets import GatewaySpec

SHORT_TEXT = "how fast is the model server?"
COLD = "cold start: single text c=256"  # first, on a gateway just started, no warm-up: what a fresh stack refuses
# requests of many texts ("N texts c=C"), where the stack's throughput plateaus
LARGE_STEPS = tuple((load, int(load.rsplit("=", 1)[1]), int(load.split()[0]), False) for load in LARGE_LOADS)
STEPS = (  # (label, concurrency, texts per request, short text)
    (COLD, 256, 1, False),
    ("single text c=64", 64, 1, False),
    ("single text c=256", 256, 1, False),
    ("32 texts c=16", 16, 32, False),
    *LARGE_STEPS,
    ("short text c=1", 1, 1, True),
)
EXTRA_STEPS = (("32 texts c=32", 32, 32, False),)  # run when named in --steps (a two-GPU host's 32-text load)
TABLE_LOADS = (*LOADS, LONE)  # the loads the results table keeps
PEERS = {"sentence-transformers encode": "sentence-transformers", "HF SDPA careful": "hf-sdpa",
         "HF SDPA sorted batches": "hf-sdpa", "infinity-emb": "infinity"}  # step label -> the table's peer name


def token_lengths(model_dir: Path, texts: list[str]) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return [len(ids) for ids in tokenizer(texts, truncation=True, max_length=512)["input_ids"]]


def build(model_dir: Path, repo: Path, args: argparse.Namespace) -> Path:
    """The builder with its defaults (what compose ships), but for what the benchmark host can run: the
    python runtime and ONNX only. --max-batch-size, --instances, --tokenizer-instances override."""
    overrides = [(flag, value) for flag, value in (("--max-batch-size", args.max_batch_size),
                                                   ("--instances", args.instances),
                                                   ("--tokenizer-instances", args.tokenizer_instances)) if value]
    cmd = [sys.executable, "-m", "builder", "build", "--model", str(model_dir), "--task", "embed", "--name", "bench",
           "--repository", str(repo), "--runtime", "python", "--formats", "onnx", "--device", args.device,
           *(x for pair in overrides for x in (pair[0], str(pair[1]))), *args.builder_arg]
    subprocess.run(cmd, check=True, cwd=REPO_ROOT)
    return repo


def outside_mps() -> dict[str, str]:
    """This environment without a CUDA MPS daemon's client variables: the peers and the step alone run as a user's own
    process would, whether or not Triton runs as an MPS client (loadtest/device/gateway_ab.sh's MPS=1)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("CUDA_MPS_")}


def step_alone_ms(repo: Path, width: int, repeats: int = 200, vocab: int = 300) -> dict[str, object]:
    """The model step alone at batch 1 x `width` (token ids below `vocab`): onnxruntime in the stub's environment,
    same provider as Triton."""
    model = next(repo.glob("*_onnx/1/model.onnx"))
    result = in_child(time_shapes, {"model": str(model), "shapes": [[1, width]], "warmup": 20, "repeats": repeats,
                                    "vocab": vocab}, python=step_python(), env=outside_mps())
    return {"median_ms": result["runs"][0]["median_ms"], "providers": result["providers"]}


def peer_steps(model_dir: Path, args: argparse.Namespace, corpus_size: int) -> tuple[list[StepResult], dict[str, float]]:
    out = subprocess.run([sys.executable, "-m", "loadtest.peers", "--model", str(model_dir), "--corpus-size",
                          str(corpus_size), "--repeats", str(args.peer_repeats)], capture_output=True, text=True,
                         check=True, cwd=REPO_ROOT, env=outside_mps())
    line = next(x for x in out.stdout.splitlines() if x.startswith("PEERS "))
    peers = json.loads(line[len("PEERS "):])
    steps, rates = [], {}
    for name, r in peers.items():
        ms = r["seconds"] * 1000
        steps.append(StepResult(
            label=f"peer: {name}", settings=StepSettings(concurrency=1, batch=r["batch_size"], duration_s=r["seconds"],
                                                        warmup_s=0),
            requests=1, errors=0, items=corpus_size, window_s=r["seconds"], throughput_rps=1 / r["seconds"],
            items_per_s=r["texts_per_s"], latency_ms=Latency(mean=ms, p50=ms, p90=ms, p95=ms, p99=ms, max=ms),
            client_cpu_us_per_request=0.0))
        rates[name] = r["texts_per_s"]
    return steps, rates


def http_steps(label: str, url: str, model: str, endpoint: str, corpus: list[str], args: argparse.Namespace,
               scheduler: bool, only: tuple[str, ...] = ()) -> tuple[list[StepResult], dict[str, dict[str, float]]]:
    """The stack's (or another server's) HTTP steps; with `scheduler`, batching counters per step."""
    spec = GatewaySpec(url=url, endpoint=endpoint, model=model, timeout_s=60, client=args.client)  # type: ignore[arg-type]
    steps: list[StepResult] = []
    batching: dict[str, dict[str, float]] = {}
    wanted = set(only or args.steps or [n for n, *_ in STEPS])
    for name, concurrency, batch, short in STEPS + EXTRA_STEPS:
        if name not in wanted:
            continue
        texts = [SHORT_TEXT] if short else corpus
        cold = name == COLD
        settings = StepSettings(concurrency=concurrency, batch=batch, duration_s=args.duration / 2 if cold else args.duration,
                                warmup_s=0.0 if cold else args.warmup,
                                procs=1 if concurrency == 1 else min(args.procs, concurrency))
        before = scheduler_counters(url) if scheduler else {}
        triton_before = step_stats(args.triton_grpc, "bench_onnx") if scheduler and args.triton_grpc else {}
        with HostUsage(f"{label}: {name}") as usage:
            result = run_step(f"{label}: {name}", spec, settings, texts)
        batching.setdefault(result.label, {}).update(usage.summary())
        if scheduler:
            after = scheduler_counters(url)
            delta = {k: after[k] - before[k] for k in after}
            batching[result.label].update(batching_stats(delta))
            if triton_before:
                after_t = step_stats(args.triton_grpc, "bench_onnx")
                batching[result.label].update(triton_times({k: after_t[k] - triton_before[k] for k in after_t}))
        print(f"  {result.label:<42} {result.items_per_s:9.0f} texts/s  p50 {result.latency_ms.p50:8.2f} ms  "
              f"p99 {result.latency_ms.p99:8.2f} ms  errors {result.errors} (warm-up {result.warmup_errors}) "
              f"{result.error_samples[:2]} {batching.get(result.label, '')}",
              file=sys.stderr, flush=True)
        steps.append(result)
    return steps, batching


def run_infinity(model_dir: Path, corpus: list[str], args: argparse.Namespace, log: Path
                 ) -> tuple[list[StepResult], list[str]]:
    python = os.environ.get("INFINITY_PYTHON")
    if not python:
        return [], ["infinity-emb: not run ($INFINITY_PYTHON not set)"]
    port = free_port()
    cmd = [python, "-m", "infinity_emb.cli", "v2", "--model-id", str(model_dir), "--served-model-name", "bench",
           "--engine", "torch", "--device", args.infinity_device, "--dtype", "float16" if args.infinity_device == "cuda" else "float32", "--batch-size", str(args.infinity_batch_size),
           "--port", str(port), "--url-prefix", "/v1", "--no-bettertransformer", "--log-level", "warning"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # its own environment, not the gateway's wheels
    env.update({"INFINITY_ANONYMOUS_USAGE_STATS": "0", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1"})
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return [], [f"infinity-emb exited with {proc.returncode} (log tail: {log.read_text()[-800:]!r})"]
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=1):
                    break
            except OSError:
                time.sleep(0.5)
        else:
            return [], ["infinity-emb did not answer /health within 180 s"]
        steps, _ = http_steps("infinity-emb", url, "bench", "openai", corpus, args, scheduler=False,
                              only=("single text c=64", "single text c=256", "32 texts c=16",
                                    *(n for n, *_ in LARGE_STEPS)))
        version = subprocess.run([python, "-c", "import infinity_emb; print(infinity_emb.__version__)"],
                                 capture_output=True, text=True, check=False, env=env).stdout.strip()
        return steps, [f"infinity-emb {version}: engine torch on {args.infinity_device}, batch size "
                       f"{args.infinity_batch_size}, single-text OpenAI /v1/embeddings requests"]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 15)
            proc.wait(timeout=30)


def plot(record: RunRecord, out: Path, reference: float | None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = record.steps
    fig, ax = plt.subplots(figsize=(10, 0.38 * len(steps) + 1.5))
    ax.barh([s.label for s in steps][::-1], [s.items_per_s for s in steps][::-1], color="#4878a8")
    if reference:
        ax.axvline(reference, color="#c44", linestyle="--", label="sentence-transformers encode")
        ax.legend(fontsize=8)
    ax.set_xlabel("texts / s")
    ax.tick_params(axis="y", labelsize=7)
    ax.grid(True, axis="x", alpha=0.3)
    ax.set_title(f"{record.name}: {record.machine.gpu.split(',')[0] if record.machine.gpu else 'CPU'}")
    fig.tight_layout()
    fig.savefig(out / "peers.png", dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest bench7", description=__doc__.splitlines()[0])
    p.add_argument("--name", default="local")
    p.add_argument("--shape", default="base")
    p.add_argument("--device", default="gpu", choices=["gpu", "cpu"])
    p.add_argument("--parts", default="peers,scheduler,ensemble,infinity")
    p.add_argument("--steps", default="", help="comma list of step names (default: all but the extra ones): "
                   + ", ".join(n for n, *_ in STEPS + EXTRA_STEPS))
    p.add_argument("--repository", type=Path, help="a built repository (default: build --shape with the builder)")
    p.add_argument("--builder-arg", action="append", default=[])
    p.add_argument("--max-batch-size", type=int, default=0, help="builder override (default: the builder's)")
    p.add_argument("--instances", type=int, default=0, help="builder override (default: the builder's)")
    p.add_argument("--tokenizer-instances", type=int, default=0, help="builder override (default: the builder's)")
    p.add_argument("--workers", default="", help="gateway workers (default: the gateway's, auto)")
    p.add_argument("--gateway-setting", action="append", default=[], help="extra GATEWAY_* setting, k=v")
    p.add_argument("--tuned", default="", help="k=v,... GATEWAY_* settings of one more scheduler series, "
                   "'tuned', beside the shipped defaults (e.g. workers=6,max_batches_in_flight=1)")
    p.add_argument("--procs", type=int, default=5, help="client processes")
    p.add_argument("--endpoint", default="embed", choices=["embed", "tei"],
                   help="the stack's route: /embed, or the model's TEI route /tei/bench/embed")
    p.add_argument("--client", default="raw", choices=["raw", "aiohttp"],
                   help="the load generator's HTTP client: raw (loadtest/http_client.py, a fraction of aiohttp's CPU "
                        "per request on the host it measures) or aiohttp")
    p.add_argument("--corpus-size", type=int, default=4000)
    p.add_argument("--duration", type=float, default=8.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--peer-repeats", type=int, default=3)
    p.add_argument("--infinity-batch-size", type=int, default=128)
    p.add_argument("--infinity-device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--work", type=Path)
    p.add_argument("--out", type=Path, default=RUNS_DIR, help="the run's folder goes to OUT/NAME-7-peers/")
    add_table_argument(p)
    args = p.parse_args(argv)
    args.steps = [x.strip() for x in args.steps.split(",") if x.strip()]
    parts = set(args.parts.split(","))
    work = args.work or Path(tempfile.mkdtemp(prefix="bench7-"))
    work.mkdir(parents=True, exist_ok=True)
    from loadtest.models import make_bert

    model_dir = make_bert(work / "model", "embed", args.shape)
    corpus = make_corpus(CorpusSpec(size=args.corpus_size))
    lengths = token_lengths(model_dir, [*corpus, SHORT_TEXT])
    tokens_per_text, short_width = sum(lengths[:-1]) / len(corpus), Shapes(512, default_widths(512)).width(lengths[-1])
    machine = describe_machine()
    steps: list[StepResult] = []
    notes: list[str] = []
    peers: dict[str, float] = {}
    if "peers" in parts:
        peer, peers = peer_steps(model_dir, args, len(corpus))
        steps += peer
    batching: dict[str, dict[str, float]] = {}
    alone: dict[str, object] = {"median_ms": float("nan"), "providers": []}
    alone_after: dict[str, object] | None = None
    gateway_settings = dict(kv.split("=", 1) for kv in args.gateway_setting)
    args.triton_grpc = ""
    if parts & {"scheduler", "ensemble"}:
        repo = args.repository or build(model_dir, work / "repository", args)
        alone = step_alone_ms(repo, width=short_width)
        with TritonServer(repository=repo, log_path=work / "triton.log", startup_timeout_s=300) as triton:
            args.triton_grpc = triton.grpc_url
            series: list[tuple[str, str, dict[str, str]]] = [
                (pipeline, pipeline, {}) for pipeline in ("scheduler", "ensemble") if pipeline in parts]
            if args.tuned and "scheduler" in parts:
                series.append(("scheduler tuned", "scheduler", dict(kv.split("=", 1) for kv in args.tuned.split(","))))
            for label, pipeline, extra in series:
                # the shipped log level (info: one access-log line per request), as a user runs it
                settings = {"pipeline": pipeline, "repository": str(repo),
                            **({"workers": args.workers} if args.workers else {}), **gateway_settings, **extra}
                with GatewayProcess(triton.grpc_url, triton_http_url=triton.http_address, settings=settings,
                                    log_path=work / f"gateway-{label.replace(' ', '-')}.log") as gw:
                    wait_until_served(gw.url)
                    assert gw.process is not None
                    result, counters = http_steps(f"stack {label}", gw.url, "bench", args.endpoint, corpus, args,
                                                  scheduler=pipeline == "scheduler")
                    steps += result
                    batching.update(counters)
                    save_diagnostics(work, label.replace(" ", "-"), gw.url, triton)
                    notes.append(f"stack {label}: gateway settings {settings}, {worker_count(gw.process.pid)} workers")
            if any("short text c=1" in s.label for s in steps):
                # the same step timed again where the c=1 steps ran: after the loaded steps, beside an idle Triton
                alone_after = step_alone_ms(repo, width=short_width)
    if "infinity" in parts:
        inf, inf_notes = run_infinity(model_dir, corpus, args, work / "infinity.log")
        steps += inf
        notes += inf_notes
    reference = peers.get("sentence-transformers encode")
    ratios: dict[str, float] = {}
    for s in steps:
        if s.label.startswith("peer"):
            continue
        if reference:
            ratios[f"{s.label}: texts/s / sentence-transformers encode"] = s.items_per_s / reference
        usage = batching.get(s.label, {})
        if "gpu_sm_pct" in usage:
            ratios[f"{s.label}: GPU busy (nvidia-smi SM %)"] = usage["gpu_sm_pct"]
        if "padding_ratio" in usage:
            ratios[f"{s.label}: padding ratio (computed / real tokens)"] = batching[s.label]["padding_ratio"]
            ratios[f"{s.label}: mean texts per batch"] = batching[s.label]["mean_batch_texts"]
        if "short text c=1" in s.label:
            ratios[f"{s.label}: p50 - model step alone at batch 1 (ms)"] = s.latency_ms.p50 - float(alone["median_ms"])  # type: ignore[arg-type]
            if alone_after is not None:
                ratios[f"{s.label}: p50 - model step alone, timed after the steps (ms)"] = (
                    s.latency_ms.p50 - float(alone_after["median_ms"]))  # type: ignore[arg-type]
    notes += [
        f"corpus: make_corpus(CorpusSpec(size={len(corpus)})): {tokens_per_text:.1f} tokens per text on average "
        f"(truncated at 512); tokens/s = texts/s x {tokens_per_text:.1f}",
        f"model step alone, batch 1 x {short_width} tokens ('{SHORT_TEXT}', {lengths[-1]} tokens, as the gateway "
        f"pads it on a GPU): {alone['median_ms']:.2f} ms "
        f"({alone['providers']})" + (f"; timed again after the stack's steps: {alone_after['median_ms']:.2f} ms"
                                     if alone_after is not None else ""),
        "peers (texts/s): " + ", ".join(f"{k} {v:.0f}" for k, v in peers.items()),
        f"gateway: workers {args.workers or 'default (auto)'}, settings {gateway_settings or 'defaults'}; "
        f"{args.procs} client processes ({args.client} client, {args.endpoint} route); repository: the builder's defaults for --runtime python --formats onnx "
        f"--device {args.device}, overrides: --max-batch-size {args.max_batch_size or '-'} --instances "
        f"{args.instances or '-'} --tokenizer-instances {args.tokenizer_instances or '-'} {' '.join(args.builder_arg)}",
        "cores per process group per step: " + "; ".join(
            f"{label}: " + ", ".join(f"{k[6:]} {v:.1f}" for k, v in figures.items() if k.startswith("cores "))
            for label, figures in batching.items()),
        "tokens/s per step: " + ", ".join(f"{s.label} {s.items_per_s * tokens_per_text:.0f}" for s in steps),
        "errors per step (window + warm-up): " + ", ".join(f"{s.label} {s.errors}+{s.warmup_errors}" for s in steps),
    ]
    record = RunRecord(name=f"{args.name}-7-peers", description=__doc__.split("\n\n")[1], machine=machine,
                       settings={"shape": args.shape, "duration_s": args.duration, "warmup_s": args.warmup,
                                 "tokens_per_text": tokens_per_text, "batching": batching, "step_alone": alone,
                                 "step_alone_after": alone_after,
                                 "peers": peers},
                       steps=steps, ratios=ratios, notes=notes)
    out = save(record, args.out)
    plot(record, out, reference)
    print(summary_markdown(record), flush=True)
    record_rows(table_rows(record, RunContext.of(machine, args.name, out)), args.table)
    return 0


def table_rows(record: RunRecord, context: RunContext) -> list[ResultRow]:
    """The results table's rows of a run (this one's, or an older tree's results.json): each stack series' texts/s
    with the peers of the same run, a lone text's p50 with the model step alone, the padding ratio and the errors."""
    peers = {PEERS.get(k, k): v for k, v in (record.settings.get("peers") or {}).items()}
    alone = {"model-step": (record.settings.get("step_alone") or {}).get("median_ms"),
             "model-step-after": (record.settings.get("step_alone_after") or {}).get("median_ms")}
    by_label = {s.label: s for s in record.steps}
    rows, errors = [], 0
    for step in record.steps:
        if not step.label.startswith("stack "):
            continue
        series, load = step.label.split(": ", 1)
        errors += step.errors + step.warmup_errors
        if load not in TABLE_LOADS:
            continue
        if load == "short text c=1":
            rows.append(context.row("bench7", series, load, "p50", step.latency_ms.p50, "ms", alone))
            continue
        infinity = by_label.get(f"infinity-emb: {load}")
        rows.append(context.row("bench7", series, load, "throughput", step.items_per_s, "texts/s",
                                peers | ({"infinity": infinity.items_per_s} if infinity else {})))
        busy = (record.settings.get("batching") or {}).get(step.label, {}).get("gpu_sm_pct")
        if busy is not None:
            rows.append(context.row("bench7", series, load, "gpu busy", busy, "SM %"))
    padding = [b["padding_ratio"] for b in (record.settings.get("batching") or {}).values() if b.get("padding_ratio")]
    if padding:
        rows.append(context.row("bench7", "stack scheduler", "every load", "padding ratio", max(padding),
                                "computed/real tokens"))
    if rows:
        rows.append(context.row("bench7", "stack", "every load", "errors", errors, "count"))
    return rows


if __name__ == "__main__":
    sys.exit(main())
