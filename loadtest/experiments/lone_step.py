"""Where a lone short text's time goes inside the packed step's stub, with the runner's own code (issue 20).

    python -m loadtest.experiments.lone_step --repository DIR --out DIR [--repeats 400] [--gap-ms 2]

Loads the repository's packed step as its stub does (the step folder's packed_runner.py and packing.py; onnxruntime
from the stub's interpreter, $TRITON_STUB_PYTHON) and times one lone text (11 tokens, fresh ids each call) per call,
the calls of every mode in turns:
- `session.run`: the step alone, as bench7 times it (numpy in and out, no CUDA graph);
- `graph, every input copied`: the one-row CUDA graph fed as the runner fed it before 2026-11-28: each of the
  run's inputs (ids, types and the index tensors) copied to its device buffer, then the replay and the output's
  copy back;
- `graph, as the runner feeds it`: `OneRowGraphs` as shipped: only the inputs that changed are copied;
- `replay alone`: the captured graph's replay, nothing copied in or out.
Each mode back to back and again with an idle gap of --gap-ms before every call (a lone client's pace: the host and
the GPU idle between texts, which back-to-back loops never meet). The graph's answers are checked against
`session.run` on the same texts (min cosine). Without a CUDA provider (`--cpu`, the smoke run) the same modes run on
the CPU provider, without capture.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from loadtest.experiments.cuda_graphs import (
    CUDA_OPTIONS,
    SESSION_OPTIONS,
    SHORT_TOKENS,
    add_model_arguments,
    add_run_arguments,
    model_and_vocab,
)
from loadtest.ort_probe import (
    CUDA,
    Spec,
    in_child,
    min_cosine,
    open_session,
    providers,
    step_python,
)

MODES = ("session.run", "graph, every input copied", "graph, as the runner feeds it", "replay alone")
TEXTS = 64  # distinct texts of SHORT_TOKENS tokens, cycled


def runner_module(step_folder: Path) -> ModuleType:
    """The step folder's packed_runner.py, imported as the stub imports it (beside its packing.py). Outside a stub
    triton_python_backend_utils is only a name to import: the timed code never touches it."""
    sys.path.insert(0, str(step_folder))
    sys.modules.setdefault("triton_python_backend_utils", ModuleType("triton_python_backend_utils"))
    spec = importlib.util.spec_from_file_location("packed_runner", step_folder / "packed_runner.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def probe(spec: Spec) -> dict[str, Any]:
    """The child's job: median and p90 ms per mode, back to back and with the gap; the graph's min cosine."""
    import onnxruntime as ort

    runner = runner_module(Path(spec["model"]).parent)
    cuda = CUDA in providers() and not spec["cpu"]
    device = "cuda" if cuda else "cpu"
    session = open_session(spec["model"], providers(cuda), SESSION_OPTIONS, CUDA_OPTIONS if cuda else None)
    graphed = open_session(spec["model"], providers(cuda), SESSION_OPTIONS,
                           {**CUDA_OPTIONS, "enable_cuda_graph": "1"} if cuda else None)
    inputs = frozenset(i.name for i in session.get_inputs())
    output = session.get_outputs()[0].name
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(TEXTS):
        ids = np.concatenate([[2], rng.integers(5, spec["vocab"], SHORT_TOKENS - 2), [3]]).astype(np.int32)
        rows.append(runner.PackedRows(ids, np.zeros_like(ids), runner.cu_seqlens_of([SHORT_TOKENS])))
    graphs = runner.OneRowGraphs(graphed, output, SHORT_TOKENS, device_type=device)
    sample = session.run([output], rows[0].feed(inputs))[0]
    graphs.capture(rows[0].feed(inputs), SHORT_TOKENS, sample)
    values, held, out_value, binding, options = graphs.bound[SHORT_TOKENS]

    def every_input_copied(row: Any) -> np.ndarray:
        for name, value in row.feed(inputs).items():
            values[name].update_inplace(value)
            held[name] = value.tobytes()
        graphed.run_with_iobinding(binding, options)
        return np.asarray(out_value.numpy())

    calls = {
        MODES[0]: lambda row: session.run([output], row.feed(inputs))[0],
        MODES[1]: every_input_copied,
        MODES[2]: lambda row: graphs(graphs.feed(row.input_ids, row.token_type_ids, inputs), SHORT_TOKENS),
        MODES[3]: lambda row: graphed.run_with_iobinding(binding, options),
    }
    wants = [session.run([output], row.feed(inputs))[0] for row in rows]
    cosine = min(min(min_cosine(calls[mode](row), want) for row, want in zip(rows, wants)) for mode in MODES[1:3])
    result: dict[str, Any] = {"onnxruntime": ort.__version__, "providers": session.get_providers(),
                              "tokens": SHORT_TOKENS, "graph_min_cosine": cosine, "modes": {}}
    for gap_ms in (0.0, spec["gap_ms"]):
        samples: dict[str, list[float]] = {mode: [] for mode in MODES}
        for k in range(spec["warmup"] + spec["repeats"]):
            for mode, call in calls.items():  # in turns: the host's moods weigh on every mode alike
                if gap_ms:
                    time.sleep(gap_ms / 1e3)  # the idle between a lone client's texts, not a synchronisation
                start = time.perf_counter()
                call(rows[k % TEXTS])
                if k >= spec["warmup"]:
                    samples[mode].append(time.perf_counter() - start)
        key = "back to back" if not gap_ms else f"{gap_ms:g} ms idle before each call"
        result["modes"][key] = {mode: {"median_ms": float(np.median(t) * 1e3),
                                       "p90_ms": float(np.percentile(t, 90) * 1e3)} for mode, t in samples.items()}
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.experiments.lone_step", description=__doc__.splitlines()[0])
    add_model_arguments(p, "a packed step's model.onnx (beside its packed_runner.py) instead of --repository")
    p.add_argument("--repeats", type=int, default=400)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--gap-ms", type=float, default=2.0, help="idle before each call in the second series")
    add_run_arguments(p)
    args = p.parse_args(argv)
    model, vocab = model_and_vocab(p, args)
    spec = {"model": str(model), "vocab": vocab, "repeats": args.repeats, "warmup": args.warmup,
            "gap_ms": args.gap_ms, "cpu": args.cpu}
    from loadtest.machine import describe_machine

    try:
        result = in_child(probe, spec, args.python or step_python())
    except RuntimeError as exc:
        print(str(exc)[-4000:], file=sys.stderr, flush=True)
        return 1
    head = (f"onnxruntime {result['onnxruntime']} on {result['providers'][0]}; {model}; a lone text of "
            f"{result['tokens']} tokens, {args.repeats} calls per mode in turns; the graph's min cosine against "
            f"session.run {result['graph_min_cosine']:.7f}")
    lines = [f"# {args.name}-lone-step", "", head, "",
             "| mode | " + " | ".join(f"{key}: median / p90 ms" for key in result["modes"]) + " |",
             "| --- |" + " ---: |" * len(result["modes"])]
    for mode in MODES:
        cells = [f"{m[mode]['median_ms']:.3f} / {m[mode]['p90_ms']:.3f}" for m in result["modes"].values()]
        lines.append(f"| {mode} | " + " | ".join(cells) + " |")
    out = args.out / f"{args.name}-lone-step"
    out.mkdir(parents=True, exist_ok=True)
    record = {"machine": describe_machine().model_dump(mode="json"), "settings": {**vars(args), "model": str(model),
              "out": str(args.out), "repository": str(args.repository)}, "result": result}
    (out / "results.json").write_text(json.dumps(record, indent=1, default=str))
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
