"""Benchmarks 5 and 6 of issue 5 (2026-11-22), for the 16-core GPU benchmark host (works on CPU too).

    python -m loadtest.experiments.bench5_6 --name h100 [--shape base] [--device gpu] [--workers 1,2,4,8]

5 gateway workers: single texts through the gateway with 1, 2, 4, ... uvicorn workers (and
  direct tritonclient gRPC as the ceiling of Triton itself), then a py-spy profile of a
  1-worker gateway under load, summarised as the functions with the most samples.
6 whole path vs model alone: onnxruntime on the built model.onnx (CUDA provider when
  onnxruntime-gpu is installed) at batch sizes 1..128 and sequence 128, against requests of
  the same number of ~128-token texts through tritonserver + python-backend runner +
  gateway + load generator on the same host.
Environment: TRITON_STUB_PYTHON names the python whose environment the python-backend stub uses
(numpy 1, onnxruntime-gpu); the gateway and the load generator run in this interpreter.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from devstack.gateway import GatewayProcess
from devstack.tritonserver import TritonServer
from loadtest.bench import build_repository, served
from loadtest.corpus import CorpusSpec, fixed_length_corpus, make_corpus
from loadtest.machine import Machine, describe_machine
from loadtest.ort_probe import in_child, step_python, time_shapes
from loadtest.pyspy import profile as pyspy_profile
from loadtest.report import RESULTS_DIR, RunRecord, save, summary_markdown
from loadtest.stats import Latency, StepResult, StepSettings
from loadtest.sweep import Series, run_sweep
from loadtest.targets import GatewaySpec, TritonSpec


def start_triton(repo: Path, log: Path) -> TritonServer:
    """A tritonserver for `repo`, not started yet (use it as a context manager). Its python-backend
    stub uses $TRITON_STUB_PYTHON's environment (numpy 1), see loadtest/device/README.md."""
    return TritonServer(repository=repo, log_path=log, startup_timeout_s=300)


def model_alone(repo: Path, batches: list[int], seq: int, seconds: float) -> dict[int, dict[str, float]]:
    """onnxruntime (CUDA first when present) on the step model: sequences/s and latency per batch size."""
    step_model = next(p for p in repo.glob("*_onnx/1/model.onnx"))
    data = in_child(time_shapes, {"model": str(step_model), "shapes": [[b, seq] for b in batches], "warmup": 5,
                                  "repeats": 5, "seconds": seconds}, python=step_python())
    print(f"model alone: providers {data['providers']} onnxruntime {data['onnxruntime']}", flush=True)
    runs = {run["rows"]: {**run, "seq_per_s": run["rows"] / run["median_ms"] * 1e3} for run in data["runs"]}
    return {"meta": {"providers": data["providers"], "ort": data["onnxruntime"]}, **runs}  # type: ignore[dict-item]


def whole_path(args: argparse.Namespace, repo: Path, work: Path, machine: Machine) -> RunRecord:
    """Benchmark 6."""
    ensemble, name, _task, max_batch = served(repo)
    alone = model_alone(repo, args.batches, 128, args.model_seconds)
    meta = alone.pop("meta")  # type: ignore[call-overload]
    texts = fixed_length_corpus(words=112, size=512)
    steps: list[StepResult] = []
    with start_triton(repo, work / "triton-6.log") as triton, \
            GatewayProcess(triton.grpc_url, triton_http_url=triton.http_address, settings={"workers": str(args.path_workers), "shm": "system", **args.gateway_settings},
                           log_path=work / "gateway-6.log") as gw:
        gateway = Series(label="gateway /embed", spec=GatewaySpec(url=gw.url, endpoint="embed", model=name))
        direct = Series(label="triton direct grpc", spec=TritonSpec(url=triton.grpc_url, model=ensemble))
        for b in args.batches:
            conc = max(4, min(64, 512 // b))
            plan = [StepSettings(concurrency=conc, batch=b, duration_s=args.duration, warmup_s=args.warmup,
                                 procs=min(args.procs, conc))]
            steps += run_sweep([direct, gateway], plan, texts, args.progress)
    for b in args.batches:
        run = alone[b]
        steps.append(StepResult(label="model alone (onnxruntime)", settings=StepSettings(concurrency=1, batch=b),
                                requests=run["calls"], errors=0, items=run["calls"] * b, window_s=args.model_seconds,
                                throughput_rps=run["seq_per_s"] / b, items_per_s=run["seq_per_s"],
                                latency_ms=Latency(mean=run["median_ms"], p50=run["median_ms"], p90=run["median_ms"],
                                                   p95=run["median_ms"], p99=run["p99_ms"], max=run["p99_ms"]),
                                client_cpu_us_per_request=0.0))
    ratios = {}
    for b in args.batches:
        model_rate = alone[b]["seq_per_s"]
        for label in ("gateway /embed", "triton direct grpc"):
            s = next(x for x in steps if x.label == label and x.settings.batch == b)
            ratios[f"b={b} {label} / model alone"] = s.items_per_s / model_rate
    notes = [f"model alone: onnxruntime {meta['ort']} providers {meta['providers']}, seq 128, inputs from host memory",
             ("whole path: texts of ~120 tokens (bucket 128); concurrency max(4, min(64, 512/batch)); dynamic "
              "batching may merge requests into larger model batches than the request's own"),
             f"gateway workers {args.path_workers}, client processes up to {args.procs}, all on one host"]
    return _save(args, "6-whole-path-vs-model", "Texts/s reaching HTTP clients vs the model's own sequences/s at the "
                 f"same batch sizes, shape {args.shape}.", machine, steps, ratios, notes,
                 {"ensemble": ensemble, "max_batch_size": max_batch, "shape": args.shape})


def gateway_workers(args: argparse.Namespace, repo: Path, work: Path, machine: Machine) -> RunRecord:
    """Benchmark 5 (with the profile)."""
    ensemble, name, task, _ = served(repo)
    texts = fixed_length_corpus(args.single_words, size=2000) if args.single_words else make_corpus(CorpusSpec(size=2000))
    endpoint = "embed" if task == "embed" else "classify"
    steps: list[StepResult] = []
    notes: list[str] = []
    plan = [StepSettings(concurrency=args.single_concurrency, batch=1, duration_s=args.duration,
                         warmup_s=args.warmup, procs=args.procs)]
    with start_triton(repo, work / "triton-5.log") as triton:
        steps += run_sweep([Series(label="triton direct grpc", spec=TritonSpec(url=triton.grpc_url, model=ensemble))],
                           plan, texts, args.progress)
        for w in args.workers:
            with GatewayProcess(triton.grpc_url, triton_http_url=triton.http_address, settings={"workers": str(w), "shm": "system", **args.gateway_settings},
                                log_path=work / f"gateway-5-w{w}.log") as gw:
                time.sleep(1.0 + 0.2 * w)  # every worker up
                steps += run_sweep([Series(label=f"gateway {w} workers",
                                           spec=GatewaySpec(url=gw.url, endpoint=endpoint, model=name))],
                                   plan, texts, args.progress)
        if shutil.which("py-spy"):
            notes += profile_gateway(args, triton.grpc_url, endpoint, name, texts, work)
        else:
            notes.append("py-spy not found: no profile")
    by_w = {w: next(s for s in steps if s.label == f"gateway {w} workers") for w in args.workers}
    base = by_w[args.workers[0]].throughput_rps
    ratios = {f"{w} workers / {args.workers[0]} worker": s.throughput_rps / base for w, s in by_w.items()}
    direct = next(s for s in steps if s.label == "triton direct grpc")
    ratios["best gateway / triton direct"] = max(s.throughput_rps for s in by_w.values()) / direct.throughput_rps
    ratios["client µs per request (gateway, max)"] = max(s.client_cpu_us_per_request for s in by_w.values())
    corpus = f"{args.single_words}-word texts" if args.single_words else "length mix"
    notes.append(f"gateway settings: shm system, {args.gateway_settings or 'defaults (shm_pool_size 4)'}")
    return _save(args, "5-gateway-workers" + (f"-{args.single_words}w" if args.single_words else ""), f"Single texts ({corpus}) at concurrency {args.single_concurrency} "
                 f"through the gateway with 1..N uvicorn workers, {args.procs} client processes.", machine, steps,
                 ratios, notes, {"workers": args.workers, "procs": args.procs})


def profile_gateway(args: argparse.Namespace, triton_url: str, endpoint: str, name: str, texts: list[str],
                    work: Path) -> list[str]:
    """Load a 1-worker gateway and sample it with py-spy; write profile-gateway.txt."""
    import threading

    from loadtest.runner import run_step

    with GatewayProcess(triton_url, settings={"workers": "1", "shm": "system", **args.gateway_settings},
                        log_path=work / "gateway-5-profile.log") as gw:
        assert gw.process
        raw = work / "pyspy.raw"
        spec = GatewaySpec(url=gw.url, endpoint=endpoint, model=name)
        settings = StepSettings(concurrency=64, duration_s=args.profile_seconds + 4, warmup_s=1, procs=args.procs)
        result: dict[str, StepResult] = {}
        load = threading.Thread(target=lambda: result.update(r=run_step("profile", spec, settings, texts)))
        load.start()
        time.sleep(2)
        lines = pyspy_profile(gw.process.pid, args.profile_seconds, raw)
        load.join()
    text = "\n".join(lines)
    (work / "profile-gateway.txt").write_text(text + "\n")
    args.profile_text = text
    r = result.get("r")
    return [f"profile: py-spy --rate 200 for {args.profile_seconds}s on a 1-worker gateway at concurrency 64 "
            f"({r.throughput_rps:.0f} req/s while sampled)" if r else "profile run failed",
            "profile summary in profile-gateway.txt (raw stacks pyspy.raw)"]


def _save(args: argparse.Namespace, suffix: str, description: str, machine: Machine, steps: list[StepResult],
          ratios: dict[str, float], notes: list[str], settings: dict[str, object]) -> RunRecord:
    record = RunRecord(name=f"{args.name}-{suffix}", description=description, machine=machine, steps=steps,
                       ratios=ratios, notes=notes, settings={"duration_s": args.duration, **settings})
    out = save(record, args.out)
    for extra in ("profile-gateway.txt",):
        if suffix.startswith("5") and (args.work / extra).exists():
            shutil.copy(args.work / extra, out / extra)
    print(summary_markdown(record), flush=True)
    return record


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.experiments.bench5_6", description=__doc__.splitlines()[0])
    p.add_argument("--name", default="gpu")
    p.add_argument("--shape", default="base")
    p.add_argument("--device", default="gpu", choices=["gpu", "cpu"])
    p.add_argument("--repository", type=Path, help="a built repository (default: build --shape with the builder)")
    p.add_argument("--builder-arg", action="append", default=[])
    p.add_argument("--only", default="6,5")
    p.add_argument("--workers", default="1,2,4,8")
    p.add_argument("--batches", default="1,8,32,64,128")
    p.add_argument("--path-workers", type=int, default=4)
    p.add_argument("--procs", type=int, default=4)
    p.add_argument("--single-concurrency", type=int, default=128)
    p.add_argument("--gateway-setting", action="append", default=[],
                   help="extra GATEWAY_* setting for every gateway, e.g. shm_pool_size=64 (repeatable)")
    p.add_argument("--single-words", type=int, default=0, help="benchmark 5: texts of N words (0: the length mix)")
    p.add_argument("--duration", type=float, default=6.0)
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--model-seconds", type=float, default=2.0)
    p.add_argument("--profile-seconds", type=float, default=8.0)
    p.add_argument("--work", type=Path)
    p.add_argument("--out", type=Path, default=RESULTS_DIR)
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=False)
    args = p.parse_args(argv)
    args.workers = [int(x) for x in args.workers.split(",")]
    args.gateway_settings = dict(kv.split("=", 1) for kv in args.gateway_setting)
    if args.repository is not None:
        args.shape = f"as built in {args.repository}"
    args.batches = [int(x) for x in args.batches.split(",")]
    args.work = args.work or Path(tempfile.mkdtemp(prefix="loadtest-gpu-"))
    args.work.mkdir(parents=True, exist_ok=True)
    machine = describe_machine()
    repo = args.repository
    if repo is None:
        from loadtest.models import make_bert

        t0 = time.time()
        model_dir = make_bert(args.work / "model", "embed", args.shape)
        extra = [a for arg in args.builder_arg for a in arg.split()]
        repo = build_repository(model_dir, args.work / "repository", "bench", "embed",
                                ["--device", args.device, *extra])
        print(f"built {args.shape} in {time.time() - t0:.0f}s", flush=True)
    for key in args.only.split(","):
        try:
            (whole_path if key == "6" else gateway_workers)(args, repo, args.work, machine)
        except Exception as exc:  # noqa: BLE001 - one benchmark failing must not lose the other
            print(f"benchmark {key} failed: {type(exc).__name__}: {exc}", flush=True)
            import traceback

            traceback.print_exc()
    return 0


if __name__ == "__main__":
    sys.exit(main())
