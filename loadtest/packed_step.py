"""The packed model step against the padded one, on the same batches of the loadtest corpus.

    python -m loadtest packed-step --name h100 [--shape base] [--out DIR]     # the GPU host (CUDA provider)
    python -m loadtest packed-step --smoke --out /tmp/ps                      # here: tiny model, CPU, seconds

Builds a random BERT embedder of `--shape` (loadtest.models) with the real builder, as GPU steps
(`--runtime python --device gpu`): `--layout packed` (fp16, PackedMultiHeadAttention: FlashAttention varlen
on SM90), `--layout padded` (fp16, fused Attention) and `--layout packed --onnx-precision fp32` (onnxruntime's
unfused attention path, which reads the graph's token_offset). The builder's parity gate runs on each, on
the GPU when onnxruntime-gpu is importable. A third graph is the packed rewrite of the padded build's Attention
fusion (PackedAttention: CUTLASS memory-efficient attention on SM90, TensorRT fused kernels on SM 70-89).

Batch sets drawn from the loadtest corpus (tokenized with the model's tokenizer, at most 512 tokens):
random draws of 32 and of 128 texts, and length-sorted runs of 32. The padded graph gets each batch padded
to the declared width above its longest row (contract/batching.py default_widths), as a padded GPU step
runs; the packed graphs get the rows back to back with their index tensors (contract/packing.py `feed`).
Per graph, in a child process of `--ort-python` (onnxruntime's CUDA provider; `run` with numpy inputs and
outputs, as the python runner calls it): median ms per batch, real tokens/s, computed/real tokens, min
cosine per row vs PyTorch fp32 on the first batches of every set (gate 0.9999), nodes per execution
provider and Memcpy nodes of one profiled run, and the first-run cost of never-seen shapes (new token
counts T for the packed graphs, new (rows, width) for the padded one) in a fresh session. PyTorch runs
HF SDPA fp16 padded to each batch's longest row, and the packed PyTorch forward with varlen attention
(loadtest/packed_torch.py), as references. `--smoke`: tiny model, CPU provider, builds for --device cpu
(the packed graph's CPU form), texts cut to 64 tokens, one batch per set: it checks the plumbing, its numbers
mean nothing.
Results: OUT/<name>-packed-step/results.json and summary.md (loadtest/packed_step_report.py), and rows of the results
table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from contract.batching import Shapes, default_widths
from contract.packing import from_rows
from loadtest.ort_probe import (
    in_child,
    medians_in_turns,
    min_cosine,
    open_session,
    packed_feed,
    placement,
    profile_events,
    providers,
    seconds,
)
from loadtest.results_table import RUNS_DIR, RunContext, add_table_argument, record_rows

SETS = ("random1", "random8", "random32", "random128", "sorted32")
GATE = 0.9999
# builder padded (fp16), builder packed (fp16), builder packed fp32 (onnxruntime's unfused CUDA path, the one that
# reads token_offset: its parity matters), the PackedAttention rewrite of the padded graph (fp16)
# packed_3gemm: the builder's packed graph with its merged QKV GEMM split back into three (what merge_qkv saves);
# packed_before: --before-graph, a packed graph built by an older builder (e.g. the in-graph index arithmetic and three
# QKV GEMMs per layer before 2026-11-24), fed what it declares
GRAPHS = ("padded", "packed_before", "packed_3gemm", "packed", "packed_fp32", "packed_attention")


# ---- batches ---------------------------------------------------------------------------------------------

def draw_batches(lengths: list[int], draws: int, seed: int = 1) -> dict[str, list[list[int]]]:
    """Text indices of each batch set: random draws of 1, 8, 32 and 128 (the small ones are where launches, not
    FLOPs, bound a call), and length-sorted runs of 32 spread over the length distribution."""
    rng = np.random.default_rng(seed)
    n = len(lengths)
    sets = {f"random{rows}": [rng.choice(n, min(rows, n), replace=False).tolist() for _ in range(draws)]
            for rows in (1, 8, 32, 128)}
    order = np.argsort(lengths, kind="stable")
    starts = np.linspace(0, max(0, n - 32), draws).astype(int)
    sets["sorted32"] = [order[s:s + 32].tolist() for s in starts]
    return sets


def fresh_batches(texts: int, count: int, seed: int = 2) -> list[list[int]]:
    """`count` random batches of 8 to 24 texts: what the stack's step gets at c=256 (about 13 texts a call, every
    call a token count it may not have seen)."""
    rng = np.random.default_rng(seed)
    return [rng.choice(texts, int(rng.integers(8, 25)), replace=False).tolist() for _ in range(count)]


FRESH_MODES = {"mem pattern on (default)": {}, "mem pattern off": {"enable_mem_pattern": False}}


def padded_feed(rows: list[np.ndarray], widths: tuple[int, ...]) -> dict[str, np.ndarray]:
    """The batch padded to the declared width above its longest row (how a padded GPU step runs it)."""
    width = Shapes(widths[-1], widths).width(max(map(len, rows)))
    ids = np.zeros((len(rows), width), np.int32)
    mask = np.zeros_like(ids)
    for r, row in enumerate(rows):
        ids[r, :len(row)], mask[r, :len(row)] = row, 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


# ---- onnxruntime (in a child process: loadtest.ort_probe) ------------------------------------------------

def _first_output(session: Any) -> list[str]:
    """The per-row output alone (embeddings): what the runner asks for on /embed; an embed graph's per-token
    outputs ([T, hidden] packed, [rows, width, hidden] padded) would add their copies to the host."""
    return [session.get_outputs()[0].name]


def cold_shapes(path: str, provider_names: list[str], texts: list[np.ndarray], packed: bool, widths: tuple[int, ...]
                ) -> list[dict[str, Any]]:
    """First and second run of never-seen shapes in a fresh session."""
    session = open_session(path, provider_names)
    longest = widths[-1]
    shapes = ((8, 64), (8, 64), (16, 64), (31, 128), (32, 128), (64, 256), (96, longest))
    out = []
    for rows, width in dict.fromkeys((rows, min(width, longest)) for rows, width in shapes):
        chosen = [np.resize(texts[i % len(texts)], width) for i in range(rows)]
        declared = {i.name for i in session.get_inputs()}
        feed = packed_feed(from_rows(chosen), declared) if packed else padded_feed(chosen, widths)
        first, second = (seconds(lambda: session.run(_first_output(session), feed)) * 1e3 for _ in range(2))
        out.append({"rows": rows, "width": width, "tokens": rows * width, "first_ms": round(first, 2),
                    "second_ms": round(second, 2)})
    return out


def run_ort(spec: dict[str, Any]) -> dict[str, Any]:
    """Every graph of `spec` on every batch set: parity, placement, latency, cold shapes."""
    import onnxruntime as ort

    ort.set_default_logger_severity(3)
    work = Path(spec["work"])
    texts = list(np.load(work / "texts.npz").values())
    refs = dict(np.load(work / "reference_fp32.npz"))
    sets = spec["sets"]
    widths = tuple(spec["widths"])
    names = providers(cuda=spec["device"] == "gpu")
    result: dict[str, Any] = {"onnxruntime": ort.__version__, "providers": names, "graphs": {}}
    for name, path in spec["graphs"].items():
        packed = name != "padded"
        entry: dict[str, Any] = result["graphs"].setdefault(name, {})

        started = time.perf_counter()
        session = open_session(path, names)
        declared = {i.name for i in session.get_inputs()}

        def feed(members: list[int], packed: bool = packed, declared: set[str] = declared) -> dict[str, np.ndarray]:
            rows = [texts[i] for i in members]
            return packed_feed(from_rows(rows), declared) if packed else padded_feed(rows, widths)

        entry["load_s"] = round(time.perf_counter() - started, 2)
        profiler = open_session(path, names, profile_prefix=str(work / f"profile_{name}"))
        profiler.run(_first_output(profiler), feed(sets["random32"][0]))
        entry["placement"] = placement(profile_events(profiler.end_profiling()))
        del profiler
        cosines = {}
        for key, want in refs.items():
            set_name, index = key.rsplit("_", 1)
            members = sets[set_name][int(index)]
            cosines[key] = min_cosine(session.run(_first_output(session), feed(members))[0][:len(members)], want)
        entry["min_cosine"] = min(cosines.values())
        entry["parity_passed"] = entry["min_cosine"] >= GATE
        for set_name, batches in sets.items():
            feeds = [feed(m) for m in batches]
            # what the runner adds on the host per call (packing, index tensors); outside the timed runs below
            host = medians_in_turns([lambda m=m: feed(m) for m in batches], spec["rounds"])
            runs = [lambda f=f: session.run(_first_output(session), f) for f in feeds]
            times = medians_in_turns(runs, spec["rounds"])
            real = [sum(len(texts[i]) for i in m) for m in batches]
            computed = [int(f["input_ids"].size) for f in feeds]
            entry[set_name] = {"ms_per_batch": round(float(np.median(times)) * 1e3, 3),
                               "real_tokens_per_s": round(sum(real) / sum(times)),
                               "computed_per_real": round(sum(computed) / sum(real), 3),
                               "rows": len(batches[0]), "batches": len(batches),
                               "host_feed_ms": round(float(np.median(host)) * 1e3, 3)}
        del session
        entry["fresh"] = {}
        for mode, options in FRESH_MODES.items():  # a new session each: every batch below is run once
            fresh_session = open_session(path, names, options)
            fresh_session.run(_first_output(fresh_session), feed(sets["random32"][0]))  # the arena's first growth
            walls = [seconds(lambda f=feed(m): fresh_session.run(_first_output(fresh_session), f))
                     for m in spec["fresh"]]
            real = sum(len(texts[i]) for m in spec["fresh"] for i in m)
            entry["fresh"][mode] = {"mean_ms": round(float(np.mean(walls)) * 1e3, 3),
                                    "p50_ms": round(float(np.median(walls)) * 1e3, 3),
                                    "real_tokens_per_s": round(real / sum(walls))}
            del fresh_session
        entry["cold"] = cold_shapes(path, names, texts, packed, widths)
        print(f"onnxruntime {name}: {json.dumps({k: v for k, v in entry.items() if k != 'cold'})}", flush=True)
    return result


# ---- build and PyTorch (parent process) ------------------------------------------------------------------

def build_graphs(model_dir: Path, work: Path, device: str, max_seq_len: int) -> dict[str, Any]:
    """The builder's packed and padded GPU (or, --smoke, CPU) steps, and the PackedAttention rewrite of the padded
    build's graph: name -> {path, fused ops, the builder's parity}. The builder runs in a process of its own:
    its parity opens onnxruntime CUDA sessions, and this process keeps the GPU for PyTorch."""
    import onnx

    from builder.manifest import read_manifest
    from builder.optimize import FUSED_OPS, onnx_op_counts, save_onnx
    from builder.packing import packed_model
    from transformers import AutoConfig

    repository = work / "repository"
    spec = {"defaults": {"model": str(model_dir), "task": "embed", "runtime": "python", "device": device,
                         "formats": "onnx", "max_seq_len": max_seq_len, "max_batch_size": 128, "warmup": False},
            "models": [{"name": "packed", "layout": "packed"}, {"name": "padded", "layout": "padded"},
                       {"name": "packed_fp32", "layout": "packed", "onnx_precision": "fp32"}]}
    (work / "models.yaml").write_text(json.dumps(spec))  # JSON is YAML
    subprocess.run([sys.executable, "-m", "builder", "build", "--spec", str(work / "models.yaml"), "--repository",
                    str(repository)], check=True, env=os.environ.copy())
    graphs: dict[str, Any] = {}
    for name in ("packed", "padded", "packed_fp32"):
        manifest = read_manifest(repository / f"{name}_onnx")
        assert manifest is not None
        graphs[name] = {"path": str(repository / f"{name}_onnx" / "1" / "model.onnx"), "fused": manifest.onnx.fused_ops,
                        "precision": manifest.onnx.precision,
                        "builder_parity": [p.model_dump(mode="json") for p in manifest.parity]}
    config = AutoConfig.from_pretrained(model_dir)
    split = work / "packed_3gemm" / "model.onnx"
    split.parent.mkdir(parents=True)
    save_onnx(split_qkv(onnx.load(graphs["packed"]["path"])), split)
    graphs["packed_3gemm"] = {**graphs["packed"], "path": str(split), "builder_parity": []}
    target = work / "packed_attention" / "model.onnx"
    target.parent.mkdir(parents=True)
    save_onnx(packed_model(onnx.load(graphs["padded"]["path"]), task="embed", pooling="mean",
                           num_heads=config.num_attention_heads, hidden_size=config.hidden_size,
                           form="gpu" if device == "gpu" else "cpu"), target)
    counts = onnx_op_counts(target)
    graphs["packed_attention"] = {"path": str(target), "fused": {op: counts[op] for op in FUSED_OPS if op in counts},
                                  "precision": graphs["padded"]["precision"], "builder_parity": []}
    return graphs


def split_qkv(model: Any) -> Any:
    """merge_qkv undone (builder/packing.py): each attention's packed-QKV input back to three MatMuls of [H, H]
    weights feeding query, key and value. A graph without merged projections (a CPU form) comes back as it was."""
    from onnx import helper, numpy_helper

    g = model.graph
    made_by = {o: n for n in g.node for o in n.output}
    inits = {i.name: i for i in g.initializer}
    for node in [n for n in g.node if n.op_type == "PackedMultiHeadAttention" and not n.input[1]]:
        reshape = made_by[node.input[0]]
        matmul = made_by[reshape.input[0]]
        heads = int(next(a.i for a in node.attribute if a.name == "num_heads"))
        merged = numpy_helper.to_array(inits[matmul.input[1]])
        hidden = merged.shape[0]
        blocks = merged.reshape(hidden, heads, 3, -1).transpose(0, 2, 1, 3).reshape(hidden, 3, -1)
        for k, role in enumerate(("q", "k", "v")):
            weight = f"{node.name}/split_{role}"
            g.initializer.append(numpy_helper.from_array(np.ascontiguousarray(blocks[:, k]), weight))
            g.node.append(helper.make_node("MatMul", [matmul.input[0], weight], [f"{weight}_out"]))
            node.input[k] = f"{weight}_out"
    from builder.graph_edit import prune, topological_sort

    prune(g, [o.name for o in g.output])
    topological_sort(g)
    return model


def torch_peers(model_dir: Path, texts: list[np.ndarray], sets: dict[str, list[list[int]]], refs: dict[str, np.ndarray],
                rounds: int, device: str) -> dict[str, Any]:
    """HF SDPA fp16 padded to each batch's longest row, and the packed PyTorch forward (varlen attention on CUDA,
    one SDPA per row on CPU): same batches, same measures (numpy in, numpy out, synchronized)."""
    import torch
    from transformers import AutoModel

    from builder.export import RepositoryModel
    from loadtest.packed_torch import ATTENTIONS, packed_output

    cuda = device == "gpu" and torch.cuda.is_available()
    dev, dtype = ("cuda", torch.float16) if cuda else ("cpu", torch.float32)
    sdpa = RepositoryModel(AutoModel.from_pretrained(model_dir, attn_implementation="sdpa", dtype=dtype).to(dev).eval(),
                           "embed", "mean").eval()
    eager = RepositoryModel(AutoModel.from_pretrained(model_dir, attn_implementation="eager", dtype=dtype).to(dev)
                            .eval(), "embed", "mean").eval()
    attention = ATTENTIONS["varlen" if cuda else "loop"]

    def run_sdpa(members: list[int]) -> np.ndarray:
        rows = [texts[i] for i in members]
        feed = padded_feed(rows, (max(map(len, rows)),))
        with torch.inference_mode():
            return sdpa(*(torch.from_numpy(feed[k]).to(dev) for k in ("input_ids", "attention_mask",
                                                                     "token_type_ids"))).float().cpu().numpy()

    def run_packed(members: list[int]) -> np.ndarray:
        rows = from_rows([texts[i] for i in members])
        args = [torch.from_numpy(a).to(dev) for a in (rows.input_ids, rows.token_type_ids, rows.cu_seqlens)]
        return packed_output(eager, *args, int(rows.lengths.max()), attention).float().cpu().numpy()

    peers: dict[str, Any] = {"torch": f"{torch.__version__} {dev} {str(dtype).removeprefix('torch.')}"}
    for label, run in (("torch_sdpa_padded", run_sdpa), ("torch_packed_varlen", run_packed)):
        entry: dict[str, Any] = {}
        try:
            entry["min_cosine"] = min(min_cosine(run(sets[k.rsplit("_", 1)[0]][int(k.rsplit("_", 1)[1])]), want)
                                      for k, want in refs.items())
            for set_name, batches in sets.items():  # numpy out: every call ends synchronized
                seconds = medians_in_turns([lambda m=m, r=run: r(m) for m in batches], rounds)
                real = sum(len(texts[i]) for m in batches for i in m)
                entry[set_name] = {"ms_per_batch": round(float(np.median(seconds)) * 1e3, 3),
                                   "real_tokens_per_s": round(real / sum(seconds))}
        except Exception as exc:  # noqa: BLE001 - a peer that cannot run (e.g. no varlen_attn) is reported, not fatal
            entry["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        peers[label] = entry
        print(f"{label}: {json.dumps(entry)}", flush=True)
    return peers


def references(model_dir: Path, texts: list[np.ndarray], sets: dict[str, list[list[int]]], device: str,
               per_set: int = 3) -> dict[str, np.ndarray]:
    """PyTorch fp32 (eager, padded to the longest row) outputs of the first batches of every set."""
    import torch
    from transformers import AutoModel

    from builder.export import RepositoryModel

    dev = "cuda" if device == "gpu" and torch.cuda.is_available() else "cpu"
    model = RepositoryModel(AutoModel.from_pretrained(model_dir, attn_implementation="eager",
                                                      dtype=torch.float32).to(dev).eval(), "embed", "mean").eval()
    refs = {}
    for set_name, batches in sets.items():
        for index, members in enumerate(batches[:per_set]):
            rows = [texts[i] for i in members]
            feed = padded_feed(rows, (max(map(len, rows)),))
            with torch.inference_mode():
                refs[f"{set_name}_{index}"] = model(*(torch.from_numpy(feed[k]).to(dev) for k in
                                                      ("input_ids", "attention_mask", "token_type_ids"))).cpu().numpy()
    return refs


# ---- report ----------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest packed-step", description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="local")
    parser.add_argument("--shape", default="base")
    parser.add_argument("--draws", type=int, default=8, help="batches per set")
    parser.add_argument("--rounds", type=int, default=10, help="timed runs per batch")
    parser.add_argument("--corpus-size", type=int, default=4000)
    parser.add_argument("--ort-python", default=sys.executable, help="python with onnxruntime-gpu importable")
    parser.add_argument("--smoke", action="store_true", help="tiny model on the CPU: checks the plumbing in seconds")
    parser.add_argument("--before-graph", type=Path, help="a packed model.onnx of an older builder, for before/after")
    parser.add_argument("--work", type=Path)
    parser.add_argument("--out", type=Path, default=None)
    add_table_argument(parser)
    args = parser.parse_args(argv)
    if args.smoke:
        args.shape, args.draws, args.rounds, args.corpus_size = "tiny", 1, 1, 200
    device = "cpu" if args.smoke else "gpu"
    from loadtest.corpus import CorpusSpec, make_corpus
    from loadtest.machine import describe_machine
    from loadtest.models import SHAPES, make_bert
    from loadtest.report import save_step_record
    from loadtest.packed_step_report import summarize, table_rows
    from transformers import AutoTokenizer

    work = args.work or Path(tempfile.mkdtemp(prefix="packed-step-"))
    started = time.perf_counter()

    def log(message: str) -> None:
        print(f"[{time.perf_counter() - started:6.1f}s] {message}", file=sys.stderr, flush=True)

    model_dir = make_bert(work / "model", "embed", args.shape)
    max_seq_len = 64 if args.smoke else min(512, SHAPES[args.shape].max_positions)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    encoded = tokenizer(make_corpus(CorpusSpec(size=args.corpus_size)), truncation=True, max_length=max_seq_len)
    texts = [np.asarray(ids, np.int32) for ids in encoded["input_ids"]]
    np.savez(work / "texts.npz", *texts)
    sets = draw_batches([len(t) for t in texts], args.draws)
    fresh = fresh_batches(len(texts), 40 if args.smoke else 300)
    log(f"corpus: {len(texts)} texts, {sum(map(len, texts))} tokens; building the packed and padded steps")
    graphs = build_graphs(model_dir, work, device, max_seq_len)
    if args.before_graph:
        from builder.optimize import FUSED_OPS, onnx_op_counts

        counts = onnx_op_counts(args.before_graph)
        graphs["packed_before"] = {"path": str(args.before_graph), "precision": graphs["packed"]["precision"],
                                   "fused": {op: counts[op] for op in FUSED_OPS if op in counts}, "builder_parity": []}
    refs = references(model_dir, texts, sets, device)
    np.savez(work / "reference_fp32.npz", **refs)
    spec = {"work": str(work), "sets": sets, "fresh": fresh, "rounds": args.rounds, "device": device,
            "widths": list(default_widths(max_seq_len)), "graphs": {n: g["path"] for n, g in graphs.items()}}
    log("onnxruntime: parity, placement, latency, cold shapes")
    ort_result = in_child(run_ort, spec, python=args.ort_python)
    log("PyTorch references")
    peers = torch_peers(model_dir, texts, sets, refs, args.rounds, device)
    record = {"name": f"{args.name}-packed-step", "machine": describe_machine().model_dump(), "shape": args.shape,
              "device": device, "texts": len(texts), "rounds": args.rounds, "draws": args.draws,
              "graphs": graphs, "onnxruntime": ort_result, "torch": peers, "smoke": args.smoke,
              "fresh_count": len(fresh)}
    out = save_step_record(record, args.out or RUNS_DIR, summarize(record))
    record_rows(table_rows(record, RunContext.of(describe_machine(), args.name, out)), args.table)
    failed = [n for n, g in ort_result["graphs"].items() if not g["parity_passed"]]
    log(f"done; results in {out}" + (f"; PARITY FAILED: {failed}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
