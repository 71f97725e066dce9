"""What a new input shape costs the model step: onnxruntime CUDA on the builder's fp16 graph.

    python -m loadtest.cold_shapes --model PATH/model.onnx [--name h100]

The gateway's batches and Triton's merged batches take many shapes (rows x padded width). This
times every call of two sweeps in a fresh session, once cold and once warm: batch size 1..48 at
width 128, and width 8..512 (step 8) at batch 8, under several session settings, each in its own
process (some are environment variables read once). Prints, per setting, the median cold and warm
call per sweep; the difference is what each new shape costs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = r"""
import json, os, sys, time
import numpy as np, onnxruntime as ort
path, setting = sys.argv[1], json.loads(sys.argv[2])
options = ort.SessionOptions()
for key, value in setting.get("session", {}).items():
    setattr(options, key, value)
cuda = dict(setting.get("cuda", {}))
sess = ort.InferenceSession(path, sess_options=options, providers=[("CUDAExecutionProvider", cuda), "CPUExecutionProvider"])
def feed(b, s):
    return {"input_ids": np.full((b, s), 7, np.int32), "attention_mask": np.ones((b, s), np.int32),
            "token_type_ids": np.zeros((b, s), np.int32)}
sweeps = {"batch 1..48 x 128": [(b, 128) for b in range(1, 49)],
          "8 x width 8..512": [(8, s) for s in range(8, 513, 8)]}
sess.run(None, feed(2, 24))  # the first call of a session pays its own setup: not a shape cost
out = {"providers": sess.get_providers()}
for name, shapes in sweeps.items():
    times = {}
    for label in ("cold", "warm"):
        t = []
        for b, s in shapes:
            f = feed(b, s)
            t0 = time.perf_counter(); sess.run(None, f); t.append(time.perf_counter() - t0)
        times[label] = float(np.median(t) * 1e3)
        times[label + "_max"] = float(np.max(t) * 1e3)
    out[name] = times
print("COLD " + json.dumps(out))
"""

PROFILE_CHILD = r"""
import collections, json, sys, time
import numpy as np, onnxruntime as ort
options = ort.SessionOptions()
options.enable_profiling = True
sess = ort.InferenceSession(sys.argv[1], sess_options=options, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
def feed(b, s):
    return {"input_ids": np.full((b, s), 7, np.int32), "attention_mask": np.ones((b, s), np.int32),
            "token_type_ids": np.zeros((b, s), np.int32)}
sess.run(None, feed(2, 24))
for b, s in ((3, 40), (5, 72), (3, 40), (5, 72)):  # two new shapes, then the same two again
    t0 = time.perf_counter(); sess.run(None, feed(b, s)); print(f"{b}x{s}: {(time.perf_counter() - t0) * 1e3:.1f} ms")
events = json.load(open(sess.end_profiling()))
runs = [e for e in events if e.get("name") == "model_run"]
for i, run in enumerate(runs[1:3], 1):
    inside = [e for e in events if e.get("cat") == "Node" and run["ts"] <= e["ts"] <= run["ts"] + run["dur"]]
    by = collections.Counter()
    for e in inside:
        by[(e["args"].get("op_name", "?"), e["name"].rsplit("_", 1)[-1])] += e["dur"]
    print(f"cold run {i}: model_run {run['dur'] / 1e3:.1f} ms, nodes {sum(by.values()) / 1e3:.1f} ms; top:",
          [(op, phase, round(us / 1e3, 2)) for (op, phase), us in by.most_common(8)])
other = collections.Counter(e["name"] for e in events if e.get("cat") == "Session")
print("session events:", other.most_common(10))
"""

SETTINGS: dict[str, dict[str, object]] = {
    "default": {},
    "no memory pattern": {"session": {"enable_mem_pattern": False}},
    "arena kSameAsRequested": {"cuda": {"arena_extend_strategy": "kSameAsRequested"}},
    "no TRT fused attention": {"env": {"ORT_DISABLE_FUSED_ATTENTION": "1", "ORT_DISABLE_TRT_FLASH_ATTENTION": "1"}},
    "no fused / flash / efficient attention": {"env": {"ORT_DISABLE_FUSED_ATTENTION": "1",
                                                       "ORT_DISABLE_TRT_FLASH_ATTENTION": "1",
                                                       "ORT_DISABLE_FLASH_ATTENTION": "1",
                                                       "ORT_DISABLE_MEMORY_EFFICIENT_ATTENTION": "1"}},
    "cuBLAS: tunable op off, no tf32": {"cuda": {"tunable_op_enable": "0", "use_tf32": "0"}},
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest.cold_shapes", description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, help="model.onnx (default: export --shape as the builder does, fp16)")
    p.add_argument("--shape", default="base")
    p.add_argument("--python", default=os.environ.get("TRITON_STUB_PYTHON") or sys.executable)
    p.add_argument("--only", default="", help="comma list of setting names (default: all)")
    p.add_argument("--profile", action="store_true", help="onnxruntime's profiler on two cold shapes instead")
    p.add_argument("--all-variants", action="store_true",
                   help="every optimizer variant of loadtest.model_step, default settings, instead")
    args = p.parse_args(argv)
    chosen = [s for s in SETTINGS if not args.only or s in args.only.split(",")]
    if args.model is None:
        from loadtest.model_step import export_variants
        from loadtest.models import make_bert

        work = Path(tempfile.mkdtemp(prefix="cold-shapes-"))
        variants = export_variants(make_bert(work / "model", "embed", args.shape), work / "onnx", float16=True,
                                   builder_only=not args.all_variants)
        args.model = Path(next(iter(variants.values()))["path"])
        if args.all_variants:
            for name, variant in variants.items():
                print(f"{name:<40} {sweep(args.python, Path(variant['path']), {}, dict(os.environ))}", flush=True)
            return 0
    if args.profile:
        proc = subprocess.run([args.python, "-c", PROFILE_CHILD, str(args.model)], capture_output=True, text=True,
                              check=False, cwd=tempfile.gettempdir())
        print(proc.stdout or proc.stderr[-2000:], flush=True)
        return 0
    for name in chosen:
        setting = SETTINGS[name]
        extra: dict[str, str] = setting.get("env", {})  # type: ignore[assignment]
        env = {**os.environ, **extra}
        print(f"{name:<40} {sweep(args.python, args.model, setting, env)}", flush=True)
    return 0


def sweep(python: str, model: Path, setting: dict[str, object], env: dict[str, str]) -> str:
    """One child process: both sweeps cold then warm; a line of medians."""
    proc = subprocess.run([python, "-c", CHILD, str(model), json.dumps(setting)], capture_output=True, text=True,
                          env=env, check=False)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("COLD ")), None)
    if line is None:
        return f"failed: {proc.stderr[-600:]}"
    res = json.loads(line[5:])
    return " | ".join(f"{name}: cold {v['cold']:.1f} ms (max {v['cold_max']:.0f}), warm {v['warm']:.1f} ms"
                      for name, v in res.items() if name != "providers")


if __name__ == "__main__":
    sys.exit(main())
