"""`python -m loadtest COMMAND ...`: the one command line of the load generator and the benchmarks.

Sweeps at the gateway (HTTP) and Triton (gRPC) level and the corpus are defined here; every benchmark is a
module whose `main(argv)` takes the rest of the command line (`python -m loadtest COMMAND --help`).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from loadtest.corpus import CorpusSpec, make_corpus
from loadtest.machine import describe_machine
from loadtest.report import RunRecord, save, table
from loadtest.results_table import RUNS_DIR
from loadtest.stats import StepSettings
from loadtest.sweep import Series, points, run_sweep
from loadtest.targets import GatewaySpec, TritonSpec


@dataclass(frozen=True)
class Benchmark:
    """A command run by a module's `main(argv)`."""

    module: str
    summary: str


BENCHMARKS: dict[str, Benchmark] = {
    "bench7": Benchmark("loadtest.bench7", "benchmark 7: the stack (both gateway pipelines) against "
                        "sentence-transformers, HF SDPA and infinity-emb (GPU host)"),
    "model-step": Benchmark("loadtest.model_step", "the model step alone: onnxruntime fp16 graph variants against "
                            "PyTorch SDPA, with parity"),
    "packed-step": Benchmark("loadtest.packed_step", "the packed model step against the padded one on the same "
                             "corpus batches, PyTorch varlen as a reference"),
    "cold-shapes": Benchmark("loadtest.cold_shapes", "what a never-seen input shape costs the model step, per "
                             "onnxruntime setting"),
    "stack-check": Benchmark("loadtest.stack_check", "the stack's answers under load on both pipelines against "
                             "PyTorch fp32, and what each hop of a lone short text costs"),
    "storm": Benchmark("loadtest.storm", "overload storm: capacity, then far more clients, every answer checked, "
                       "recovery time"),
    "lanes": Benchmark("loadtest.lanes", "a bulk job (X-Priority: batch) beside interactive single texts: the "
                       "interactive p99 and the bulk goodput against each alone"),
    "encode": Benchmark("loadtest.outputs", "several outputs of one forward pass (/encode) against a request per "
                        "output, on a model with bge-m3's heads"),
    "long-docs": Benchmark("loadtest.long_documents", "documents of 20k tokens chunked (truncate: chunk, batch lane) "
                           "in a stream of single-text queries: the queries' p99 against theirs alone"),
    "ab-gateway": Benchmark("loadtest.ab_gateway", "two gateway revisions side by side on one tritonserver"),
    "result-cache": Benchmark("loadtest.result_cache", "the embedding result cache: hit rates per worker against "
                              "shared on a Zipf stream, and texts/s and p50 with it off and on"),
    "transports": Benchmark("loadtest.transports", "one call at a time: the gateway against direct tritonclient, "
                            "shared memory against plain gRPC"),
    "random-model": Benchmark("loadtest.models", "write a random-weight BERT checkpoint (+ tokenizer) the builder "
                              "takes as a local model"),
    "results": Benchmark("loadtest.results_report", "the docs' figures and plots from the results table; append rows "
                         "a GPU host brought back; compare two commits"),
}


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--concurrency", type=_ints, default=[1, 4, 16, 64], help="closed-loop points, e.g. 1,4,16")
    p.add_argument("--rate", type=_floats, default=[], help="open-loop arrival rates (req/s), e.g. 50,100")
    p.add_argument("--max-in-flight", type=int, default=256, help="open loop: most requests in flight")
    p.add_argument("--duration", type=float, default=10.0, help="measured seconds per point")
    p.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each point")
    p.add_argument("--batch", type=int, default=1, help="texts per request")
    p.add_argument("--procs", type=int, default=1, help="client processes (one Python client tops out per core)")
    p.add_argument("--corpus-size", type=int, default=2000)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--name", required=True, help="results go to <out>/<name>/")
    p.add_argument("--out", type=Path, default=RUNS_DIR)
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None)


def _run(args: argparse.Namespace, series: list[Series], description: str) -> int:
    texts = make_corpus(CorpusSpec(size=args.corpus_size, seed=args.seed))
    base = StepSettings(duration_s=args.duration, warmup_s=args.warmup, batch=args.batch, procs=args.procs,
                        seed=args.seed, concurrency=args.max_in_flight)
    steps = points(base, args.concurrency, args.rate)
    machine = describe_machine()
    results = run_sweep(series, steps, texts, args.progress)
    record = RunRecord(name=args.name, description=description, machine=machine,
                       settings={k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "func"},
                       steps=results)
    out = save(record, args.out)
    print(table(results))
    print(f"results: {out}")
    errors = sum(r.errors for r in results)
    return 1 if errors and not getattr(args, "allow_errors", False) else 0


def cmd_gateway(args: argparse.Namespace) -> int:
    series = [Series(label=f"gateway {e}", spec=GatewaySpec(url=args.url, endpoint=e, model=args.model,
                                                            api_key=args.api_key)) for e in args.endpoint]
    return _run(args, series, f"Gateway {args.url}, endpoints {', '.join(args.endpoint)}")


def cmd_triton(args: argparse.Namespace) -> int:
    series = [Series(label=f"triton {m}{' shm' if args.shm else ''}",
                     spec=TritonSpec(url=args.url, model=m, shm=args.shm)) for m in args.model]
    return _run(args, series, f"Triton gRPC {args.url}, models {', '.join(args.model)}")


def cmd_corpus(args: argparse.Namespace) -> int:
    texts = make_corpus(CorpusSpec(size=args.size, seed=args.seed))
    if args.tokenizer:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(args.tokenizer))
        lengths = sorted(len(e.ids) for e in tok.encode_batch(texts))
        q = {p: lengths[int(p / 100 * (len(lengths) - 1))] for p in (10, 50, 90, 99)}
        print(f"tokens per text: min {lengths[0]} p10 {q[10]} p50 {q[50]} p90 {q[90]} p99 {q[99]} max {lengths[-1]}; "
              f"over 512: {sum(x > 512 for x in lengths) / len(lengths):.1%}", file=sys.stderr)
    if args.perf_analyzer:
        # perf_analyzer --input-data: one entry per text, a BYTES tensor [1] named "text" (perf_analyzer's
        # -b N makes requests of N entries).
        data = [{"text": {"content": [t], "shape": [1]}} for t in texts]
        out = json.dumps({"data": data}, ensure_ascii=False)
    else:
        out = "\n".join(json.dumps(t, ensure_ascii=False) for t in texts)
    if args.output:
        Path(args.output).write_text(out + "\n", encoding="utf-8")
    else:
        print(out)
    return 0


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loadtest", description=__doc__.splitlines()[0],
                                epilog="What each command measures, and which to rerun when: loadtest/README.md.")
    sub = p.add_subparsers(required=True, metavar="COMMAND")
    g = sub.add_parser("gateway", help="sweep the gateway's HTTP API (closed loop and/or open loop)")
    g.add_argument("--url", default="http://127.0.0.1:8080")
    g.add_argument("--endpoint", action="append", choices=["classify", "embed", "openai"],
                   help="repeat for several; default embed")
    g.add_argument("--model", default=None)
    g.add_argument("--api-key", default=None)
    _common(g)
    g.set_defaults(func=cmd_gateway)
    t = sub.add_parser("triton", help="sweep a Triton model (ensemble) with tritonclient asyncio gRPC")
    t.add_argument("--url", default="127.0.0.1:8001", help="Triton gRPC host:port")
    t.add_argument("--model", action="append", required=True, help="e.g. NAME_onnx_ensemble; repeat for several")
    t.add_argument("--shm", action="store_true", help="tensors through system shared memory")
    _common(t)
    t.set_defaults(func=cmd_triton)
    c = sub.add_parser("corpus", help="write the corpus (JSON lines) or perf_analyzer --input-data JSON")
    c.add_argument("--size", type=int, default=2000)
    c.add_argument("--seed", type=int, default=1234)
    c.add_argument("--perf-analyzer", action="store_true", help="write perf_analyzer --input-data JSON")
    c.add_argument("--tokenizer", type=Path, help="tokenizer.json: print the token-length distribution")
    c.add_argument("--output", "-o", type=Path)
    c.set_defaults(func=cmd_corpus)
    for name, benchmark in BENCHMARKS.items():  # listed here, run by main() before this parser sees them
        sub.add_parser(name, help=benchmark.summary, add_help=False)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in BENCHMARKS:
        return int(importlib.import_module(BENCHMARKS[argv[0]].module).main(argv[1:]) or 0)
    args = parser().parse_args(argv)
    if getattr(args, "endpoint", "absent") is None:
        args.endpoint = ["embed"]
    return int(args.func(args))
