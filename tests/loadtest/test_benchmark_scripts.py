"""The GPU-host benchmarks run end to end here too, through `python -m loadtest COMMAND` as on the host (CPU
providers, tiny shapes), so they do not rot between device sessions: their numbers here mean nothing, their
plumbing does.

The whole-stack ones (bench7, transport, sparse: builder, tritonserver, gateway, load steps), cold-shapes (two
sweeps of onnxruntime sessions) and long-context (two 8k loads) cost minutes the default run does not have: they
are `slow`, run them before a device session with `scripts/test -m slow tests/loadtest/test_benchmark_scripts.py`
(~2.5 min)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from devstack.tritonserver import REPO_ROOT


def run_loadtest(*args: str, timeout: int = 300) -> str:
    proc = subprocess.run([sys.executable, "-m", "loadtest", *args], capture_output=True, text=True, cwd=REPO_ROOT,
                          timeout=timeout, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow  # a GPU benchmark's CPU smoke run (~5 s): `scripts/test -m slow`
@pytest.mark.timeout(300)
def test_model_step_times_every_variant_and_checks_it_against_pytorch(tmp_path: Path) -> None:
    run_loadtest("model-step", "--name", "t", "--shape", "tiny", "--repeats", "2", "--shapes", "1x16",
               "--float16", "yes", "--out", str(tmp_path), "--work", str(tmp_path / "work"))
    record = json.loads((tmp_path / "t-model-step" / "results.json").read_text())
    variants = {row["variant"] for row in record["rows"]}
    assert {"builder (fused, fp16)", "fp16, raw 2-D mask", "fused fp32 (before)"} <= variants
    assert record["fused_ops"]["builder (fused, fp16)"]["Attention"] == 2  # the tiny model has 2 layers
    assert {row["shape"] for row in record["rows"]} == {"1x16", "8x64 right-padded"}
    assert all(row["min_cosine_vs_fp32"] > 0.999 for row in record["rows"])


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_cold_shapes_reports_both_sweeps() -> None:
    out = run_loadtest("cold-shapes", "--shape", "tiny", "--only", "default")
    line = next(x for x in out.splitlines() if x.startswith("default"))
    assert "batch 1..48 x 128: cold" in line and "8 x width 8..512: cold" in line


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bench7_scheduler_steps_record_batching_and_latency_breakdown(tmp_path: Path) -> None:
    run_loadtest("bench7", "--name", "t", "--shape", "tiny", "--device", "cpu", "--parts", "scheduler",
               "--steps", "single text c=64,short text c=1", "--duration", "1.5", "--warmup", "0.5", "--procs", "1",
               "--workers", "1", "--corpus-size", "100", "--max-batch-size", "16", "--instances", "1",
               "--tokenizer-instances", "1", "--tuned", "max_batches_in_flight=3", "--out", str(tmp_path), "--work",
               str(tmp_path / "work"), timeout=600)
    record = json.loads((tmp_path / "t-7-peers" / "results.json").read_text())
    assert [s["label"] for s in record["steps"]] == [
        f"stack {series}: {step}" for series in ("scheduler", "scheduler tuned")
        for step in ("single text c=64", "short text c=1")]
    tuned = next(n for n in record["notes"] if n.startswith("stack scheduler tuned: gateway settings"))
    assert "'max_batches_in_flight': '3'" in tuned  # the tuned series beside the shipped one (gateway_ab.sh TUNED=)
    assert all(s["errors"] == 0 and s["items"] > 0 for s in record["steps"])
    batching = record["settings"]["batching"]["stack scheduler: single text c=64"]
    assert batching["batches"] > 0 and batching["padding_ratio"] >= 1.0 and batching["triton_executions"] > 0
    assert record["settings"]["step_alone"]["median_ms"] > 0
    assert record["settings"]["step_alone_after"]["median_ms"] > 0  # timed again where the c=1 steps ran
    c1 = "stack scheduler: short text c=1"
    assert all(key in record["ratios"] for key in (f"{c1}: p50 - model step alone at batch 1 (ms)",
                                                   f"{c1}: p50 - model step alone, timed after the steps (ms)"))
    assert (tmp_path / "t-7-peers" / "peers.png").is_file()


@pytest.mark.slow  # a GPU benchmark's CPU smoke run (~4-9 s): `scripts/test -m slow`
@pytest.mark.timeout(300)
def test_modernbert_attention_smoke_compares_fused_and_plain_exports(tmp_path: Path) -> None:
    """The H100 command of issue 23 (loadtest/device/README.md), here with --smoke (tiny model, CPU)."""
    run_loadtest("modernbert-attention", "--smoke", "--name", "t", "--out", str(tmp_path),
               "--work", str(tmp_path / "work"))
    record = json.loads((tmp_path / "t-modernbert-attention" / "results.json").read_text())
    fused = record["fused_ops"]["builder: fused MultiHeadAttention"]
    assert fused["MultiHeadAttention"] == 3 and "MultiHeadAttention" not in record["fused_ops"]["plain export: unfused"]
    assert {(r["variant"], r["shape"]) for r in record["rows"]} == {
        (v, s) for v in record["fused_ops"] for s in ("1x96", "2x200")}
    assert all(r["error"] is None and r["min_cosine_vs_fp32"] > 0.9999 for r in record["rows"])


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_long_context_load_measures_every_variant(tmp_path: Path) -> None:
    """`python -m loadtest long-context` end to end (slow: builds and loads an 8k model twice, ~25 s here):
    `pytest -m slow tests/loadtest/test_benchmark_scripts.py -k long_context`."""
    run_loadtest("long-context", "--rounds", "1", "--models", "modernbert-8k", "--variants",
               "warm-up bounded,after", "--out", str(tmp_path), "--work", str(tmp_path / "work"), timeout=900)
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [r["variant"] for r in rows] == ["warm-up bounded", "after"]
    assert all(r["load_s"] > 0 and r["peak_rss_gib"] > 0 for r in rows)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_stack_check_compares_answers_and_times_the_hops(
    python_repository: Path, tiny_embedder_dir: Path, tmp_path: Path
) -> None:
    """The H100 command of issue 20's answers-under-load check, on the shared tiny repository (CPU)."""
    run_loadtest("stack-check", "--repository", str(python_repository), "--model", str(tiny_embedder_dir),
               "--served", "tinyemb", "--texts", "16", "--concurrency", "4", "--repeats", "5", "--lone-texts", "8", "--name", "t",
               "--out", str(tmp_path))
    record = json.loads((tmp_path / "t-stack-check" / "results.json").read_text())
    assert set(record["answers"]) == {"scheduler", "ensemble", "scheduler, one at a time"}
    assert min(record["answers"].values()) >= 0.9999
    assert len(record["hops_ms"]) == 6 and all(v > 0 for v in record["hops_ms"].values())


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_transport_compares_the_transports_this_machine_has(tmp_path: Path) -> None:
    """`python -m loadtest transport` on the CPU (cuda left out, with the reason): system and none agree, and each
    gateway used its own transport (~25 s)."""
    run_loadtest("transport", "--device", "cpu", "--shape", "tiny", "--rounds", "1", "--duration", "0.5", "--warmup",
                 "0.2", "--max-batch-size", "64", "--corpus-size", "200", "--name", "t", "--out", str(tmp_path),
                 "--work", str(tmp_path / "work"), timeout=600)
    record = json.loads((tmp_path / "t-12-transports" / "results.json").read_text())
    checks = record["settings"]["checks"]
    assert record["settings"]["transports"] == ["system", "none"]
    assert any("GATEWAY_SHM=cuda left out" in note for note in record["notes"])
    assert checks["agreement with system"]["none"]["64 texts max_abs_diff"] < 1e-4
    calls = checks["gateway calls by transport (after the agreement check)"]
    assert set(calls["system"]) == {"shm"} and set(calls["none"]) == {"grpc"}
    assert len(record["steps"]) == 10 and all(s["errors"] == 0 and s["items"] > 0 for s in record["steps"])


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sparse_times_the_full_row_and_topk(tmp_path: Path) -> None:
    """`python -m loadtest sparse` end to end on the CPU: the step in onnxruntime, through Triton with the gateway's
    client, and /embed_sparse through the gateway (~25 s)."""
    run_loadtest("sparse", "--repeats", "2", "--out", str(tmp_path), "--work", str(tmp_path / "work"), timeout=600)
    record = json.loads((tmp_path / "results.json").read_text())
    assert 0 < record["nonzeros_per_text"]["min"] <= record["nonzeros_per_text"]["max"] < 30522
    assert len(record["step_ms"]) == 2 and all(ms > 0 for ms in record["step_ms"].values())
    assert len(record["through_triton_ms"]) == 3 and all(ms > 0 for ms in record["through_triton_ms"].values())
    assert record["bytes_per_text"]["full row (shm)"] == 30522 * 4


@pytest.mark.slow  # a GPU experiment's CPU smoke run (~3 s): `scripts/test -m slow`
@pytest.mark.timeout(300)
def test_cuda_graph_probe_times_each_run_and_mode(tmp_path: Path) -> None:
    """loadtest.experiments.cuda_graphs on the CPU: `run` and `bound` per run; two processes, then one process of two
    threads, at once, cycling through every run and through one; the graph session is recorded as impossible here,
    with the reason."""
    from tests.loadtest.test_ort_probe import packed_graph

    proc = subprocess.run([sys.executable, "-m", "loadtest.experiments.cuda_graphs", "--model",
                           str(packed_graph(tmp_path / "packed.onnx")), "--cpu", "--layouts", "2x1,1x2",
                           "--cycles", "mix,1", "--seconds", "0.5",
                           "--repeats", "3", "--warmup", "1", "--vocab", "300", "--name", "t", "--out", str(tmp_path)],
                          capture_output=True, text=True, cwd=REPO_ROOT, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((tmp_path / "t-cuda-graphs" / "results.json").read_text())
    runs = record["single"]["runs"]
    assert [row["rows"] for row in runs.values()] == [1, 17, 41]  # 16 and 40 texts, each run filled by one row
    assert all(set(row["median_ms"]) == {"run", "bound"} and row["bound_min_cosine"] == 1.0 for row in runs.values())
    assert record["single"]["graph_error"] == "no CUDA provider here"
    concurrent = record["concurrent"]
    assert list(concurrent) == ["run 2x1 mix", "run 1x2 mix", "run 2x1 16 texts (single texts c=256)",
                                "run 1x2 16 texts (single texts c=256)"]
    assert [len(c["per_process"]) for c in concurrent.values()] == [2, 1, 2, 1]
    assert all(c["runs_per_s"] > 0 and c["min_cosine"] > 0.99999 for c in concurrent.values())


@pytest.mark.slow  # a GPU experiment's CPU smoke run (~3 s): `scripts/test -m slow`
@pytest.mark.timeout(300)
def test_lone_step_times_each_mode_with_the_runners_code(tmp_path: Path) -> None:
    """loadtest.experiments.lone_step on the CPU: the runner's OneRowGraphs, imported from beside the model as the
    stub imports it, answers as session.run does; every mode is timed back to back and with the idle gap."""
    from tests.loadtest.test_ort_probe import packed_graph

    step = tmp_path / "step"
    step.mkdir()
    model = packed_graph(step / "model.onnx")
    shutil.copy(REPO_ROOT / "builder" / "triton_models" / "packed_runner.py", step / "packed_runner.py")
    shutil.copy(REPO_ROOT / "contract" / "packing.py", step / "packing.py")
    proc = subprocess.run([sys.executable, "-m", "loadtest.experiments.lone_step", "--model", str(model), "--cpu",
                           "--repeats", "5", "--warmup", "1", "--gap-ms", "0.5", "--vocab", "300", "--name", "t",
                           "--out", str(tmp_path)], capture_output=True, text=True, cwd=REPO_ROOT, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((tmp_path / "t-lone-step" / "results.json").read_text())["result"]
    assert result["graph_min_cosine"] > 0.99999
    assert list(result["modes"]) == ["back to back", "0.5 ms idle before each call"]
    for modes in result["modes"].values():
        assert list(modes) == ["session.run", "graph, every input copied", "graph, as the runner feeds it",
                               "replay alone"]
        assert all(0 < m["median_ms"] <= m["p90_ms"] for m in modes.values())


@pytest.mark.slow  # an experiment's smoke run (~5 s, most of it making the tokenizer): `scripts/test -m slow`
@pytest.mark.timeout(300)
def test_runner_cost_times_each_shape() -> None:
    """loadtest.experiments.runner_cost: the packed runner's own Python per execute() for every (requests, rows)
    shape, on rows of the corpus; more rows carry more tokens."""
    proc = subprocess.run([sys.executable, "-m", "loadtest.experiments.runner_cost", "--calls", "5",
                           "--max-seq-len", "128"], capture_output=True, text=True, cwd=REPO_ROOT, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split("|")[1:4] for line in proc.stdout.splitlines()[2:] if line.startswith("| ")]
    assert [shape.strip() for shape, _, _ in rows[:5]] == ["1 x 1", "1 x 8", "2 x 8", "4 x 8", "1 x 32"]
    assert len(rows) == 6 and rows[5][0].strip().startswith("1 x 1, a lone text of")  # the one-row graph's path
    tokens = [int(t) for _, t, _ in rows]
    assert tokens[0] <= 128 and tokens[1] < tokens[2] < tokens[3] and tokens[5] <= 16
    assert all(float(us) > 0 for _, _, us in rows)
