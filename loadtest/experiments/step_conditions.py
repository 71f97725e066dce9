"""Why the packed step's onnxruntime call takes longer inside Triton than alone (issue 20).

    python -m loadtest.experiments.step_conditions --repository DIR --out DIR [--name N]

stack-check (h100-20j) timed a lone short text: the graph alone 1.36 ms, the step through Triton 4.25 ms, and the
same step config with a model.py that computes nothing 1.22 ms; the runner's own Python is ~30 us. So the same
`session.run` costs ~1.7 ms more inside the stub than in a loop. This times `session.run` on a lone short text and
on 16 corpus-like texts (filled as the runner fills them) in the stub's python under conditions the stub differs
in: back to back (the benchmarks' way), with an idle gap between calls as at c=1 (`--gap-ms`; the thread sleeps,
its core may idle), with onnxruntime's intra-op pool at 1 thread, and with its threads not spinning; and reports
where onnxruntime placed the graph's nodes (its profiler).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from loadtest.experiments.cuda_graphs import (
    CUDA_OPTIONS,
    SESSION_OPTIONS,
    add_model_arguments,
    add_run_arguments,
    model_and_vocab,
    packed_run,
    run_lengths,
)
from loadtest.ort_probe import CUDA, Spec, in_child, open_session, placement, profile_events, providers, step_python

CONDITIONS = {
    "back to back": ({}, {}, 0.0),
    "gap": ({}, {}, None),  # None: --gap-ms
    "intra-op 1 thread, back to back": ({"intra_op_num_threads": 1}, {}, 0.0),
    "intra-op 1 thread, gap": ({"intra_op_num_threads": 1}, {}, None),
    "no spinning, gap": ({}, {"session.intra_op.allow_spinning": "0"}, None),
}
RUNS = {"lone short text": 1, "16 texts": 16}


def conditions(spec: Spec) -> dict[str, Any]:
    """The child's job: median ms of session.run per run and condition, and the nodes per provider."""
    import onnxruntime as ort

    cuda = CUDA in providers()
    out: dict[str, Any] = {"onnxruntime": ort.__version__, "rows": {}}
    for condition, (options, entries, gap) in CONDITIONS.items():
        gap_s = (spec["gap_ms"] if gap is None else gap) / 1e3
        session_options = ort.SessionOptions()
        for key, value in {**SESSION_OPTIONS, **options}.items():
            setattr(session_options, key, value)
        for key, value in entries.items():
            session_options.add_session_config_entry(key, value)
        session = ort.InferenceSession(spec["model"], sess_options=session_options,
                                       providers=[(CUDA, CUDA_OPTIONS), "CPUExecutionProvider"] if cuda else None)
        names = {i.name for i in session.get_inputs()}
        out_name = session.get_outputs()[0].name
        for k, (label, texts) in enumerate(RUNS.items()):
            feed = packed_run(run_lengths(texts, k), spec["vocab"], 16384, 512, seed=k).feed(names)
            for _ in range(20):
                session.run([out_name], feed)
            times = []
            for _ in range(spec["repeats"]):
                if gap_s:
                    time.sleep(gap_s)  # the idle time between two requests at c=1
                start = time.perf_counter()
                session.run([out_name], feed)
                times.append(time.perf_counter() - start)
            out["rows"].setdefault(label, {})[condition] = {"median_ms": float(np.median(times) * 1e3),
                                                            "p90_ms": float(np.percentile(times, 90) * 1e3)}
    with tempfile.TemporaryDirectory() as tmp:
        session = open_session(spec["model"], providers(), SESSION_OPTIONS, CUDA_OPTIONS if cuda else None,
                               profile_prefix=str(Path(tmp) / "p"))
        names = {i.name for i in session.get_inputs()}
        session.run(None, packed_run([11], spec["vocab"], 16384, 512, seed=0).feed(names))
        out["placement"] = placement(profile_events(session.end_profiling()))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.experiments.step_conditions",
                                description=__doc__.splitlines()[0])
    add_model_arguments(p)
    p.add_argument("--repeats", type=int, default=300)
    p.add_argument("--gap-ms", type=float, default=3.0)
    add_run_arguments(p, cpu=False)
    args = p.parse_args(argv)
    model, vocab = model_and_vocab(p, args)
    result = in_child(conditions, {"model": str(model), "vocab": vocab, "repeats": args.repeats,
                                   "gap_ms": args.gap_ms}, args.python or step_python())
    from loadtest.machine import describe_machine

    lines = [f"# {args.name}-step-conditions", "", f"onnxruntime {result['onnxruntime']}; {model}; gap {args.gap_ms} ms;"
             f" median (p90) ms of session.run over {args.repeats} calls", "",
             "| condition | " + " | ".join(RUNS) + " |", "| --- |" + " ---: |" * len(RUNS)]
    for condition in CONDITIONS:
        cells = [f"{result['rows'][r][condition]['median_ms']:.3f} ({result['rows'][r][condition]['p90_ms']:.3f})"
                 for r in RUNS]
        lines.append(f"| {condition} | " + " | ".join(cells) + " |")
    lines += ["", f"placement: {result['placement']}"]
    out = args.out / f"{args.name}-step-conditions"
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"machine": describe_machine().model_dump(mode="json"),
                                                  "settings": vars(args) | {"model": str(model), "out": str(args.out),
                                                                            "repository": str(args.repository)},
                                                  **result}, indent=1, default=str))
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
