"""The model step alone in onnxruntime, timed in a child process of the interpreter that has onnxruntime(-gpu).

Every benchmark that times an ONNX graph goes through here. The parent calls `in_child(function, spec, python)`:
`python -m loadtest.ort_probe` on `python` (the stub's $TRITON_STUB_PYTHON, or one with onnxruntime-gpu on
PYTHONPATH) gets `{"call": "module:function", "spec": spec}` on stdin, prints `function(spec)` as one JSON line,
and the parent returns it. The child imports the standard library, numpy, onnxruntime and contract/ only, so it
runs in the python-backend stub's environment too.

Jobs (a benchmark may also pass a function of its own, built on the helpers below):
- `time_shapes`: one graph at uniform rows x width batches (a packed step's graph gets the same rows packed);
- `time_variants`: several graphs on the same inputs, timed in turns with `run` (numpy in and out, as the
  python-backend runner calls it) and, on CUDA, with IO binding (inputs and output on the GPU: the graph's own
  time); each one's first output rows come back for parity;
- `cold_sweeps`: what never-seen shapes cost a fresh session, under session and CUDA provider settings;
- `profile_runs`: onnxruntime's profiler over a few runs: the node types that took longest, nodes per provider.
"""

from __future__ import annotations

import collections
import importlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from contract import ATTENTION_MASK, CU_SEQLENS, INPUT_IDS, TOKEN_TYPE_IDS
from contract.packing import PackedRows, from_rows

RESULT = "ORT-RESULT "
REPO_ROOT = Path(__file__).resolve().parents[1]
CUDA, CPU = "CUDAExecutionProvider", "CPUExecutionProvider"
Spec = dict[str, Any]


# ---- the parent's side -----------------------------------------------------------------------------------

def step_python() -> str:
    """The interpreter whose onnxruntime Triton's python-backend stub uses ($TRITON_STUB_PYTHON), else this one."""
    from devstack.tritonserver import STUB_PYTHON_ENV

    return os.environ.get(STUB_PYTHON_ENV) or sys.executable


def in_child(function: Callable[[Spec], dict[str, Any]], spec: Spec, python: str | None = None,
             env: dict[str, str] | None = None) -> dict[str, Any]:
    """`function(spec)` run in a child process of `python` (default: this interpreter) with `env` (default:
    this one's); its JSON result. The child's other output goes to stderr; a failure raises RuntimeError."""
    module = function.__module__
    if module == "__main__":  # a benchmark run as `python -m loadtest.NAME`: the child imports it by that name
        module = sys.modules["__main__"].__spec__.name  # type: ignore[union-attr]
    call = f"{module}:{function.__qualname__}"
    proc = subprocess.run([python or sys.executable, "-m", "loadtest.ort_probe"], input=json.dumps({"call": call,
                          "spec": spec}), capture_output=True, text=True, cwd=REPO_ROOT,
                          env=os.environ.copy() if env is None else env, check=False)
    lines = proc.stdout.splitlines()
    result = next((x for x in reversed(lines) if x.startswith(RESULT)), None)
    sys.stderr.write("".join(f"{x}\n" for x in lines if not x.startswith(RESULT))[-4000:])
    if proc.returncode != 0 or result is None:
        raise RuntimeError(f"onnxruntime child {call} on {python or sys.executable} failed ({proc.returncode}): "
                           f"{proc.stderr[-3000:]}")
    return dict(json.loads(result[len(RESULT):]))


def min_cosine(got: np.ndarray, want: np.ndarray) -> float:
    """The lowest cosine similarity of a row of `got` with the same row of `want` (float64)."""
    a, b = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(((a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)).min())


# ---- helpers (both sides) --------------------------------------------------------------------------------

def providers(cuda: bool | None = None) -> list[str]:
    """CUDA first when onnxruntime has it, then the CPU; `cuda=True` demands CUDA, `cuda=False` refuses it."""
    import onnxruntime as ort

    available = CUDA in ort.get_available_providers()
    if cuda and not available:
        raise RuntimeError(f"onnxruntime {ort.__version__} has no CUDA provider here (put onnxruntime-gpu on "
                           "PYTHONPATH, e.g. $ORT_GPU_PATH, or pass --ort-python)")
    return [CUDA, CPU] if (available if cuda is None else cuda) else [CPU]


def open_session(path: str | Path, provider_names: Sequence[str] | None = None, options: dict[str, Any] | None = None,
                 cuda_options: dict[str, Any] | None = None, profile_prefix: str | None = None) -> Any:
    """An InferenceSession: `options` are SessionOptions attributes, `cuda_options` the CUDA provider's options,
    `profile_prefix` turns onnxruntime's profiler on."""
    import onnxruntime as ort

    session_options = ort.SessionOptions()
    for key, value in (options or {}).items():
        setattr(session_options, key, value)
    if profile_prefix:
        session_options.enable_profiling = True
        session_options.profile_file_prefix = profile_prefix
    names = list(provider_names or providers())
    chosen = [(name, dict(cuda_options)) if name == CUDA and cuda_options else name for name in names]
    return ort.InferenceSession(str(path), sess_options=session_options, providers=chosen)


def packed_feed(rows: PackedRows, declared: Collection[str]) -> dict[str, np.ndarray]:
    """A packed graph's inputs it declares; a packed graph of a builder before 2026-11-24 also reads `max_seqlen`
    [1] (the longest row)."""
    feed = rows.feed(declared)
    if "max_seqlen" in declared:
        feed["max_seqlen"] = np.array([rows.lengths.max()], np.int32)
    return feed


def uniform_feed(input_names: set[str], rows: int, width: int, seed: int = 0, vocab: int = 300) -> dict[str, np.ndarray]:
    """`rows` rows of `width` tokens (ids 5..vocab-1, no padding) as the graph takes them: [rows, width] tensors,
    or the same rows back to back for a packed step's graph (contract/packing.py, `packed_feed`)."""
    ids = np.random.default_rng(seed).integers(5, vocab, size=(rows, width), dtype=np.int32)
    if CU_SEQLENS in input_names:
        feed = packed_feed(from_rows(list(ids)), input_names)
    else:
        feed = {INPUT_IDS: ids, ATTENTION_MASK: np.ones_like(ids), TOKEN_TYPE_IDS: np.zeros_like(ids)}
    return {name: value for name, value in feed.items() if name in input_names}


def seconds(run: Callable[[], object]) -> float:
    """Wall seconds of one call."""
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def medians_in_turns(runs: Sequence[Callable[[], object]], repeats: int, warmup: int = 1) -> list[float]:
    """Median seconds of each run over `repeats` calls taken in turns, after `warmup` calls of each: a shared
    machine's load weighs on every run alike."""
    for run in runs:
        for _ in range(warmup):
            run()
    samples: list[list[float]] = [[] for _ in runs]
    for _ in range(repeats):
        for run, times in zip(runs, samples):
            times.append(seconds(run))
    return [float(np.median(times)) for times in samples]


def bound_run(session: Any, feed: dict[str, np.ndarray]) -> Callable[[], None]:
    """A call of `session` with its inputs and first output on the GPU (IO binding), synchronized."""
    import onnxruntime as ort

    binding = session.io_binding()
    values = {name: ort.OrtValue.ortvalue_from_numpy(value, "cuda", 0) for name, value in feed.items()}
    for name, value in values.items():
        binding.bind_ortvalue_input(name, value)
    binding.bind_output(session.get_outputs()[0].name, "cuda")

    def run(_inputs: dict[str, Any] = values) -> None:  # the bound inputs live as long as the call
        session.run_with_iobinding(binding)
        binding.synchronize_outputs()

    return run


def profile_events(path: str) -> list[dict[str, Any]]:
    """The events of an onnxruntime profile (`session.end_profiling()`)."""
    return list(json.loads(Path(path).read_text()))


def placement(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Nodes per execution provider, Memcpy nodes and the op types run on the CPU, from a profile's events."""
    per_provider: collections.Counter[str] = collections.Counter()
    memcpy: collections.Counter[str] = collections.Counter()
    cpu_ops: set[str] = set()
    for event in events:
        args = event.get("args", {})
        if event.get("cat") != "Node" or "provider" not in args or not event["name"].endswith("_kernel_time"):
            continue
        per_provider[args["provider"]] += 1
        op = args.get("op_name", "")
        if op.startswith("Memcpy"):
            memcpy[op] += 1
        if args["provider"] == CPU and op:
            cpu_ops.add(op)
    return {"nodes_per_provider": dict(per_provider), "memcpy": dict(memcpy), "cpu_ops": sorted(cpu_ops)}


def _error(exc: BaseException) -> str:
    text = str(exc).splitlines()[0][:300] if str(exc) else ""
    return f"{type(exc).__name__}: {text}"


# ---- jobs (the child's side) -----------------------------------------------------------------------------

def time_shapes(spec: Spec) -> dict[str, Any]:
    """spec: model (path), shapes [[rows, width], ...], warmup (calls, default 5), repeats (calls, default 5),
    seconds (time per shape, default 0) and vocab (ids below it, default 300): median and p99 ms per shape."""
    import onnxruntime as ort

    session = open_session(spec["model"])
    names = {i.name for i in session.get_inputs()}
    runs = []
    for rows, width in spec["shapes"]:
        feed = uniform_feed(names, rows, width, vocab=spec.get("vocab", 300))
        for _ in range(spec.get("warmup", 5)):
            session.run(None, feed)
        times: list[float] = []
        end = time.perf_counter() + spec.get("seconds", 0.0)
        while len(times) < spec.get("repeats", 5) or time.perf_counter() < end:
            times.append(seconds(lambda f=feed: session.run(None, f)))
        runs.append({"rows": rows, "width": width, "median_ms": float(np.median(times) * 1e3),
                     "p99_ms": float(np.percentile(times, 99) * 1e3), "calls": len(times)})
    return {"onnxruntime": ort.__version__, "providers": session.get_providers(), "runs": runs}


def time_variants(spec: Spec) -> dict[str, Any]:
    """spec: variants {name: path}, inputs {case: {input: nested int list}}, repeats, warmup (default 3),
    output_rows (default 8). Per variant and case: first_ms (the shape's first run in the session), run_ms,
    iobinding_ms (CUDA only) and output (its first rows), or error (a session or shape that failed, e.g. out of
    memory: recorded, not fatal)."""
    import onnxruntime as ort

    names = providers()
    out: dict[str, Any] = {"onnxruntime": ort.__version__, "providers": names,
                           "variants": {name: {} for name in spec["variants"]}}
    sessions = {}
    for name, path in spec["variants"].items():
        try:
            sessions[name] = open_session(path, names)
        except Exception as exc:  # noqa: BLE001 - reported per variant
            out["variants"][name]["error"] = _error(exc)
    for case, tensors in spec["inputs"].items():
        feed = {k: np.asarray(v, dtype=np.int32) for k, v in tensors.items()}
        timed: dict[str, dict[str, Callable[[], object]]] = {"run_ms": {}, "iobinding_ms": {}}
        for name, session in sessions.items():
            try:
                start = time.perf_counter()
                output = session.run(None, feed)[0]
                first_ms = (time.perf_counter() - start) * 1e3
                run = lambda s=session, f=feed: s.run(None, f)  # noqa: E731
                bound = bound_run(session, feed) if names[0] == CUDA else None
                if bound:
                    bound()  # fails here, not in the timed turns, when the shape does not fit
            except Exception as exc:  # noqa: BLE001 - reported per variant and shape
                out["variants"][name][case] = {"error": _error(exc)}
                continue
            out["variants"][name][case] = {"first_ms": first_ms, "output": output[:spec.get("output_rows", 8)].tolist()}
            timed["run_ms"][name] = run
            if bound:
                timed["iobinding_ms"][name] = bound
        for key, runs in timed.items():
            medians = medians_in_turns(list(runs.values()), spec["repeats"], spec.get("warmup", 3)) if runs else []
            for name, median in zip(runs, medians):
                out["variants"][name][case][key] = median * 1e3
    return out


def cold_sweeps(spec: Spec) -> dict[str, Any]:
    """spec: model, sweeps {name: [[rows, width], ...]}, session (SessionOptions attributes), cuda (CUDA provider
    options). A fresh session runs one small batch first (a session's own set-up is no shape's cost), then every
    sweep's shapes twice: cold (each shape's first run) and warm. Per sweep: median and max ms of each pass."""
    session = open_session(spec["model"], options=spec.get("session"), cuda_options=spec.get("cuda"))
    names = {i.name for i in session.get_inputs()}
    session.run(None, uniform_feed(names, 2, 24))
    out: dict[str, Any] = {"providers": session.get_providers(), "sweeps": {}}
    for sweep, shapes in spec["sweeps"].items():
        feeds = [uniform_feed(names, rows, width) for rows, width in shapes]
        result = {}
        for label in ("cold", "warm"):
            times = [seconds(lambda f=f: session.run(None, f)) * 1e3 for f in feeds]
            result[label], result[f"{label}_max"] = float(np.median(times)), float(np.max(times))
        out["sweeps"][sweep] = result
    return out


def profile_runs(spec: Spec) -> dict[str, Any]:
    """spec: model, shapes [[rows, width], ...], top (default 8). onnxruntime's profiler on one small batch, then
    each shape in turn: per run its wall ms, model_run ms and the (op, phase) pairs that took longest; the
    session's nodes per provider and its most frequent session events."""
    with tempfile.TemporaryDirectory(prefix="ort-profile-") as tmp:
        session = open_session(spec["model"], profile_prefix=str(Path(tmp) / "profile"))
        names = {i.name for i in session.get_inputs()}
        session.run(None, uniform_feed(names, 2, 24))
        walls = [seconds(lambda f=uniform_feed(names, r, w): session.run(None, f)) * 1e3 for r, w in spec["shapes"]]
        events = profile_events(session.end_profiling())
    model_runs = [e for e in events if e.get("name") == "model_run"][1:]  # the small batch's run first
    runs = []
    for (rows, width), wall, run in zip(spec["shapes"], walls, model_runs):
        inside = [e for e in events if e.get("cat") == "Node" and run["ts"] <= e["ts"] <= run["ts"] + run["dur"]]
        by: collections.Counter[tuple[str, str]] = collections.Counter()
        for e in inside:
            by[(e["args"].get("op_name", "?"), e["name"].rsplit("_", 1)[-1])] += e["dur"]
        top = [[op, phase, round(us / 1e3, 2)] for (op, phase), us in by.most_common(spec.get("top", 8))]
        runs.append({"shape": f"{rows}x{width}", "wall_ms": round(wall, 2), "model_run_ms": run["dur"] / 1e3,
                     "nodes_ms": sum(by.values()) / 1e3, "top": top})
    session_events = collections.Counter(e["name"] for e in events if e.get("cat") == "Session")
    return {"providers": session.get_providers(), "runs": runs, "placement": placement(events),
            "session_events": session_events.most_common(10)}


def main() -> int:
    """The child: `{"call": "module:function", "spec": {...}}` on stdin, the function's JSON result on stdout."""
    request = json.loads(sys.stdin.read())
    module, _, name = request["call"].partition(":")
    function = getattr(importlib.import_module(module), name)
    print(RESULT + json.dumps(function(request["spec"])), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
