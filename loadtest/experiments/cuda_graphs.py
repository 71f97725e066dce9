"""What onnxruntime's CUDA graphs would save the packed model step, measured before the runner uses them (issue 20).

    python -m loadtest.experiments.cuda_graphs --repository DIR --out DIR
        [--layouts 4x1,1x4] [--cycles mix,1] [--seconds 8]

Under load a python-backend step's execution is bound by the host: launching ~130 kernels and onnxruntime's
per-node work, in four stub processes beside the gateway (h100-20g-stub-profile, h100-20h-fill). A CUDA graph
replays a captured run with one launch. This times the step's own graph (the repository's packed model.onnx, in
the stub's python) on runs shaped like the stack's, filled as the runner fills them: a lone short text, 16 corpus
texts (an execution at single texts c=256) and 40 (at 32-text requests). Per run:
1. median ms of `run` (session.run, numpy in and out: the runner today), `bound` (IO binding: inputs and output
   in device buffers updated in place each call, no graph) and `graph` (the same buffers, a session with
   `enable_cuda_graph` and one `gpu_graph_id` per shape: captured on its first runs, then replayed);
2. the graph's answers on fresh inputs of the same shape against `run` (min cosine): a replay must read the new
   inputs;
3. `--layouts` of processes x threads at once, each thread cycling through the runs (or one of them: `--cycles`)
   for `--seconds`: runs/s of `run` in all, and of `graph` (one thread per process: onnxruntime keeps a graph in
   the thread that captured it). 4x1 is the step today (4 instances: 4 stub processes, 4 CUDA contexts that the
   GPU time-slices); 1xN is N threads calling one session in one process (one context; onnxruntime gives
   concurrent runs their own CUDA streams), which a step could do by answering through response senders from
   worker threads. Every thread's first answer to each run is checked against the sequential one (min cosine).
A session that cannot capture (a node off the CUDA provider, a kernel that reads back to the host) is recorded
with its error. Where onnxruntime has no CUDA provider only `run` and `bound` on the CPU run (`--smoke`: the
plumbing, tests/loadtest).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from contract.packing import PackedRows, filled_tokens, from_rows
from loadtest.ort_probe import CUDA, Spec, in_child, min_cosine, open_session, providers, step_python

MEAN_TOKENS = 60.8  # the loadtest corpus's mean tokens per text (bert-base WordPiece; h100-20h-fill)
RUNS = {"lone short text": 1, "16 texts (single texts c=256)": 16, "40 texts (32-text requests c=16)": 40}
SHORT_TOKENS = 11  # bench7's SHORT_TEXT
SESSION_OPTIONS = {"enable_mem_pattern": False}  # the runner's, for a packed step
CUDA_OPTIONS = {"use_tf32": "0"}  # contract.CUDA_PROVIDER_OPTIONS


def step_vocab(model: Path) -> int | None:
    """The embedding table's size a packed step's config records (parameter vocab_size; the runner refuses ids at
    or above it), from the config.pbtxt two folders above its model.onnx; None when absent. Random ids must stay
    below it: an id past the table is an out-of-bounds read on the GPU (garbage, or an illegal memory access)."""
    config = model.parent.parent / "config.pbtxt"
    if not config.is_file():
        return None
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as mc

    parsed = text_format.Parse(config.read_text(), mc.ModelConfig())
    value = parsed.parameters["vocab_size"].string_value if "vocab_size" in parsed.parameters else ""
    return int(value) if value else None


def add_model_arguments(parser: argparse.ArgumentParser, model_help: str = "a packed model.onnx instead of --repository"
                        ) -> None:
    """--repository, --model and --vocab: the packed step an experiment times (read back with model_and_vocab)."""
    parser.add_argument("--repository", type=Path, help="a built repository: its packed *_onnx step")
    parser.add_argument("--model", type=Path, help=model_help)
    parser.add_argument("--vocab", type=int, help="ids stay below it (default: the step config's vocab_size)")


def add_run_arguments(parser: argparse.ArgumentParser, cpu: bool = True) -> None:
    """--python, --cpu (with `cpu`), --name and --out: where a step experiment runs and where its results go."""
    parser.add_argument("--python", default=None, help="the interpreter with onnxruntime(-gpu) (default: the stub's)")
    if cpu:
        parser.add_argument("--cpu", action="store_true",
                            help="the CPU provider even where CUDA exists (the smoke run)")
    parser.add_argument("--name", default="local")
    parser.add_argument("--out", type=Path, required=True)


def model_and_vocab(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[Path, int]:
    """The packed model.onnx (--model, or the repository's *_onnx step) and the ids' bound (--vocab, or the step
    config's vocab_size); a parser error when neither gives one."""
    model = args.model or next(args.repository.glob("*_onnx/1/model.onnx"))
    vocab = args.vocab or step_vocab(model)
    if not vocab:
        parser.error("no vocab_size in the step's config: pass --vocab")
    return model, vocab


def run_lengths(texts: int, seed: int) -> list[int]:
    """Token counts of `texts` corpus-like texts (a lognormal around the corpus mean, 4..512); a lone text is
    the short one."""
    if texts == 1:
        return [SHORT_TOKENS]
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(MEAN_TOKENS) - 0.28, 0.75, texts), 4, 512).astype(int).tolist()


def packed_run(lengths: list[int], vocab: int, max_tokens: int, max_row: int, seed: int) -> PackedRows:
    """Random ids in rows of `lengths`, filled as the GPU runner fills a run."""
    rng = np.random.default_rng(seed)
    rows = from_rows([rng.integers(5, vocab, n, dtype=np.int32) for n in lengths])
    return rows.filled(filled_tokens(rows.tokens, max_tokens), max_row)


class BoundRun:
    """One shape's call through IO binding: inputs and the first output in device buffers, updated in place each
    call; with `graph_id`, that run option (a session with enable_cuda_graph captures, then replays)."""

    def __init__(self, session: Any, feed: dict[str, np.ndarray], output: np.ndarray, device: str,
                 graph_id: int | None = None) -> None:
        import onnxruntime as ort

        self.session = session
        self.values = {name: ort.OrtValue.ortvalue_from_numpy(value, device, 0) for name, value in feed.items()}
        self.output = ort.OrtValue.ortvalue_from_shape_and_type(list(output.shape), output.dtype, device, 0)
        self.binding = session.io_binding()
        for name, value in self.values.items():
            self.binding.bind_ortvalue_input(name, value)
        self.binding.bind_ortvalue_output(session.get_outputs()[0].name, self.output)
        self.options = ort.RunOptions()
        if graph_id is not None:
            self.options.add_run_config_entry("gpu_graph_id", str(graph_id))

    def __call__(self, feed: dict[str, np.ndarray]) -> np.ndarray:
        for name, value in feed.items():
            self.values[name].update_inplace(value)
        self.session.run_with_iobinding(self.binding, self.options)
        return np.asarray(self.output.numpy())


def _cases(spec: Spec, names: set[str]) -> list[tuple[str, dict[str, np.ndarray], dict[str, np.ndarray]]]:
    """(label, feed, a fresh feed of the same shape) per run."""
    out = []
    for k, (label, texts) in enumerate(spec["runs"].items()):
        lengths = run_lengths(texts, seed=k)
        first, fresh = (packed_run(lengths, spec["vocab"], spec["max_tokens"], spec["max_row"], seed=100 * k + s)
                        for s in (1, 2))
        out.append((label, first.feed(names), fresh.feed(names)))
    return out


def _start(spec: Spec) -> None:
    """The child's watchdog: a child stuck past spec["timeout_s"] prints its Python stacks and exits (a hung
    capture must not hang the device call)."""
    faulthandler.dump_traceback_later(spec.get("timeout_s", 240), exit=True)


def _log(message: str) -> None:
    print(f"[cuda_graphs {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _sessions(spec: Spec) -> tuple[Any, Any, str]:
    """(the runner's session, a CUDA-graph session or the error that stopped it, device)."""
    cuda = CUDA in providers() and not spec.get("cpu")
    session = open_session(spec["model"], providers(cuda), SESSION_OPTIONS, CUDA_OPTIONS if cuda else None)
    if not cuda:
        return session, "no CUDA provider here", "cpu"
    try:
        graphed = open_session(spec["model"], providers(True), SESSION_OPTIONS,
                               {**CUDA_OPTIONS, "enable_cuda_graph": "1"})
    except Exception as exc:  # noqa: BLE001 - recorded: the answer to "can this graph be captured"
        graphed = f"{type(exc).__name__}: {str(exc)[:400]}"
    return session, graphed, "cuda"


def probe(spec: Spec) -> dict[str, Any]:
    """The child's job: per run, median ms of run / bound / graph and the graph's min cosine against run."""
    import onnxruntime as ort

    _start(spec)
    session, graphed, device = _sessions(spec)
    _log(f"sessions open; graph session: {graphed if isinstance(graphed, str) else 'yes'}")
    names = {i.name for i in session.get_inputs()}
    out_name = session.get_outputs()[0].name
    result: dict[str, Any] = {"onnxruntime": ort.__version__, "providers": session.get_providers(), "runs": {}}
    if isinstance(graphed, str):
        result["graph_error"] = graphed
    for k, (label, feed, fresh) in enumerate(_cases(spec, names)):
        want = session.run([out_name], fresh)[0]
        calls = {"run": lambda f=feed: session.run([out_name], f)[0],
                 "bound": (lambda b=BoundRun(session, feed, want, device), f=feed: b(f))}
        row: dict[str, Any] = {"tokens": int(feed["input_ids"].size), "rows": int(feed["cu_seqlens"].size - 1)}
        if not isinstance(graphed, str):
            try:
                _log(f"{label}: capturing")
                replay = BoundRun(graphed, feed, want, device, graph_id=k + 1)
                for _ in range(3):  # onnxruntime runs a shape before it captures it
                    replay(feed)
                _log(f"{label}: captured")
                row["graph_min_cosine"] = min_cosine(replay(fresh), want)
                calls["graph"] = lambda b=replay, f=feed: b(f)
            except Exception as exc:  # noqa: BLE001 - recorded per run
                row["graph_error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
        row["bound_min_cosine"] = min_cosine(calls["bound"](), session.run([out_name], feed)[0])
        for call in calls.values():
            for _ in range(spec["warmup"]):
                call()
        samples: dict[str, list[float]] = {mode: [] for mode in calls}
        for _ in range(spec["repeats"]):  # in turns: the host's load weighs on every mode alike
            for mode, call in calls.items():
                start = time.perf_counter()
                call()
                samples[mode].append(time.perf_counter() - start)
        row["median_ms"] = {mode: float(np.median(t) * 1e3) for mode, t in samples.items()}
        result["runs"][label] = row
        _log(f"{label}: {row['median_ms']}")
    return result


def spin(spec: Spec) -> dict[str, Any]:
    """The child's job beside `procs - 1` others: set up `mode` (run or graph) on every run, wait until all are
    ready (files in spec["barrier"]), then cycle `threads` threads through the runs (spec["only"]: one run's index,
    None: all) for spec["seconds"]; calls made, and the lowest cosine of a thread's answer to the sequential one."""
    import threading

    _start(spec)
    session, graphed, device = _sessions(spec)
    names = {i.name for i in session.get_inputs()}
    out_name = session.get_outputs()[0].name
    cases = [case for k, case in enumerate(_cases(spec, names)) if spec.get("only") in (None, k)]
    wants = [session.run([out_name], feed)[0] for _, feed, _ in cases]
    if spec["mode"] == "graph" and isinstance(graphed, str):
        return {"error": graphed}

    def calls_of() -> list[Any]:  # a thread's calls: a graph's buffers and capture belong to one thread
        if spec["mode"] != "graph":
            return [lambda f=feed: session.run([out_name], f)[0] for _, feed, _ in cases]
        return [lambda b=BoundRun(graphed, feed, want, device, graph_id=k + 1), f=feed: b(f)
                for k, ((_, feed, _), want) in enumerate(zip(cases, wants))]

    threads = int(spec.get("threads", 1))
    made, cosines, errors = [0] * threads, [1.0] * threads, []
    ready, go = threading.Barrier(threads + 1), threading.Event()

    def work(index: int) -> None:
        try:
            calls = calls_of()
            for call, want in zip(calls, wants):
                for _ in range(spec["warmup"]):
                    call()
                cosines[index] = min(cosines[index], min_cosine(call(), want))
        except Exception as exc:  # noqa: BLE001 - recorded: the layout's answer
            errors.append(f"{type(exc).__name__}: {str(exc)[:400]}")
        ready.wait()
        go.wait()
        start = time.perf_counter()
        while not errors and time.perf_counter() - start < spec["seconds"]:
            calls[(made[index] + index) % len(calls)]()
            made[index] += 1

    workers = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(threads)]
    for worker in workers:
        worker.start()
    ready.wait()
    if errors:
        go.set()
        return {"error": errors[0]}
    barrier = Path(spec["barrier"])
    (barrier / f"ready-{spec['index']}").touch()
    deadline = time.monotonic() + 120
    while len(list(barrier.glob("ready-*"))) < spec["procs"]:
        if time.monotonic() > deadline:
            go.set()
            return {"error": "the other processes never got ready"}
        time.sleep(0.001)  # a start line for processes, not a test's synchronisation
    start = time.perf_counter()
    go.set()
    for worker in workers:
        worker.join()
    return {"calls": sum(made), "per_thread": made, "seconds": time.perf_counter() - start,
            "min_cosine": min(cosines), **({"error": errors[0]} if errors else {})}


def together(spec: Spec, mode: str, procs: int, python: str, threads: int = 1, only: int | None = None
             ) -> dict[str, Any]:
    """`procs` children of `threads` threads each spinning `mode` at once: runs/s in all, and each process's."""
    with tempfile.TemporaryDirectory() as barrier, ThreadPoolExecutor(procs) as pool:
        jobs = [pool.submit(in_child, spin, {**spec, "mode": mode, "procs": procs, "index": i, "barrier": barrier,
                                             "threads": threads, "only": only}, python) for i in range(procs)]
        each = []
        for job in jobs:
            try:
                each.append(job.result())
            except RuntimeError as exc:  # a child that failed or hit its watchdog
                each.append({"error": str(exc)[-1500:]})
    errors = [e["error"] for e in each if "error" in e]
    if errors:
        return {"error": errors[0]}
    return {"runs_per_s": sum(e["calls"] / e["seconds"] for e in each),
            "per_process": [round(e["calls"] / e["seconds"], 1) for e in each],
            "min_cosine": min(e["min_cosine"] for e in each)}


def parse_layouts(text: str) -> list[tuple[int, int]]:
    """"4x1,1x4" -> [(4, 1), (1, 4)]: processes x threads."""
    layouts = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        procs, _, threads = part.partition("x")
        layouts.append((int(procs), int(threads or 1)))
    return layouts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.experiments.cuda_graphs", description=__doc__.splitlines()[0])
    add_model_arguments(p)
    p.add_argument("--max-tokens", type=int, default=16384, help="the step's max_batch_tokens")
    p.add_argument("--max-row", type=int, default=512, help="the step's max_seq_len (filler rows' length)")
    p.add_argument("--repeats", type=int, default=200)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--layouts", default="4x1,1x4,1x8", help="processes x threads at once, comma-separated; "
                   "empty: none")
    p.add_argument("--cycles", default="mix", help=f"what each thread cycles through: mix (every run) and/or run "
                   f"indices 0-{len(RUNS) - 1}, comma-separated")
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--child-timeout", type=float, default=150, help="seconds a child may take before its watchdog "
                   "prints its stacks and ends it")
    add_run_arguments(p)
    args = p.parse_args(argv)
    model, vocab = model_and_vocab(p, args)
    python = args.python or step_python()
    spec = {"model": str(model), "runs": RUNS, "vocab": vocab, "max_tokens": args.max_tokens,
            "max_row": args.max_row, "repeats": args.repeats, "warmup": args.warmup, "seconds": args.seconds,
            "cpu": args.cpu, "timeout_s": args.child_timeout}
    from loadtest.machine import describe_machine

    try:
        single = in_child(probe, spec, python)
    except RuntimeError as exc:  # its watchdog's stacks say where it stuck
        print(str(exc)[-4000:], file=sys.stderr, flush=True)
        return 1
    modes = ["run", "graph"] if "graph_error" not in single and not args.cpu else ["run"]
    layouts = parse_layouts(args.layouts)
    cycles = [None if c == "mix" else int(c) for c in args.cycles.split(",") if c]
    concurrent = {}
    for only in cycles:
        for procs, threads in layouts:
            for mode in modes:
                if mode == "graph" and threads > 1:
                    continue
                key = f"{mode} {procs}x{threads} {'mix' if only is None else list(RUNS)[only]}"
                concurrent[key] = together(spec, mode, procs, python, threads, only)
                _log(f"{key}: {concurrent[key]}")
    record = {"machine": describe_machine().model_dump(mode="json"), "settings": vars(args) | {
        "model": str(model), "out": str(args.out), "repository": str(args.repository)}, "single": single,
        "concurrent": concurrent}
    lines = [f"# {args.name}-cuda-graphs", "", f"onnxruntime {single['onnxruntime']} on {single['providers'][0]}; "
             f"{model}", ""]
    if "graph_error" in single:
        lines += [f"CUDA graph session: {single['graph_error']}", ""]
    lines += ["| run | tokens (filled) | rows | run ms | bound ms | graph ms | graph vs run | graph min cosine |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for label, row in single["runs"].items():
        ms = row["median_ms"]
        graph = f"{ms['graph']:.3f}" if "graph" in ms else row.get("graph_error", "-")
        ratio = f"{ms['run'] / ms['graph']:.2f}x" if "graph" in ms else "-"
        lines.append(f"| {label} | {row['tokens']} | {row['rows']} | {ms['run']:.3f} | {ms['bound']:.3f} | {graph} | "
                     f"{ratio} | {row.get('graph_min_cosine', float('nan')):.7f} |")
    if concurrent:
        lines += ["", f"Processes x threads at once, each thread cycling through the runs (mix) or one run for "
                  f"{args.seconds:.0f} s:", "", "| mode, layout, cycle | runs/s in all | per process | min cosine |",
                  "| --- | ---: | --- | ---: |"]
        for key, c in concurrent.items():
            lines.append(f"| {key} | {c.get('runs_per_s', float('nan')):.1f} | {c.get('per_process', c.get('error'))} "
                         f"| {c.get('min_cosine', float('nan')):.7f} |")
    out = args.out / f"{args.name}-cuda-graphs"
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(record, indent=1, default=str))
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
