"""The GPU-host benchmarks run end to end here too, through `python -m loadtest COMMAND` as on the host (CPU
providers, tiny shapes), so they do not rot between device sessions: their numbers here mean nothing, their
plumbing does, the rows they append to the results table included (each test's own table: conftest.py).

The whole-stack ones (bench7, stack-check: builder, tritonserver, gateway, load steps) and cold-shapes (two sweeps
of onnxruntime sessions) cost minutes the default run does not have: they are `slow`, run them before a device
session with `scripts/test -m slow tests/loadtest/test_benchmark_scripts.py` (~2 min)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from devstack.tritonserver import REPO_ROOT
from loadtest.models import make_bert
from loadtest.results_table import read_rows
from tests.fixtures.repository import PYTHON_CPU
from tests.fixtures.shared import SharedRepositories


def run_loadtest(*args: str, timeout: int = 300) -> str:
    proc = subprocess.run([sys.executable, "-m", "loadtest", *args], capture_output=True, text=True, cwd=REPO_ROOT,
                          timeout=timeout, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow  # a GPU benchmark's CPU smoke run (~5 s): `scripts/test -m slow`
@pytest.mark.timeout(300)
def test_model_step_times_every_variant_and_checks_it_against_pytorch(tmp_path: Path, own_results_table: Path) -> None:
    run_loadtest("model-step", "--name", "t", "--shape", "tiny", "--repeats", "2", "--shapes", "1x16",
               "--float16", "yes", "--out", str(tmp_path), "--work", str(tmp_path / "work"))
    record = json.loads((tmp_path / "t-model-step" / "results.json").read_text())
    variants = {row["variant"] for row in record["rows"]}
    assert {"builder (fused, fp16)", "fp16, raw 2-D mask", "fused fp32 (before)"} <= variants
    assert record["fused_ops"]["builder (fused, fp16)"]["Attention"] == 2  # the tiny model has 2 layers
    assert {row["shape"] for row in record["rows"]} == {"1x16", "8x64 right-padded"}
    assert all(row["min_cosine_vs_fp32"] > 0.999 for row in record["rows"])
    builder = [r for r in record["rows"] if r["variant"] == "builder (fused, fp16)"]
    rows = read_rows(own_results_table)
    assert [(r.load, r.value, r.peers) for r in rows if r.unit == "ms"] == [
        (r["shape"], pytest.approx(r["ort_iobinding_ms"] or r["ort_run_ms"], rel=1e-6), {"torch-sdpa": pytest.approx(
            r["torch_ms"], rel=1e-6)}) for r in builder]
    assert {r.commit for r in rows} == {record["machine"]["git_commit"]} and {r.run for r in rows} == {"t"}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_cold_shapes_reports_both_sweeps() -> None:
    out = run_loadtest("cold-shapes", "--shape", "tiny", "--only", "default")
    line = next(x for x in out.splitlines() if x.startswith("default"))
    assert "batch 1..48 x 128: cold" in line and "8 x width 8..512: cold" in line


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bench7_scheduler_steps_record_batching_and_latency_breakdown(tmp_path: Path, own_results_table: Path) -> None:
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
    rows = read_rows(own_results_table)  # the headline figures: a lone text's p50 against the step alone, errors
    steps = {s["label"]: s for s in record["steps"]}
    assert [(r.series, r.load, r.metric) for r in rows] == [
        ("stack scheduler", "short text c=1", "p50"), ("stack scheduler tuned", "short text c=1", "p50"),
        ("stack scheduler", "every load", "padding ratio"), ("stack", "every load", "errors")]
    assert rows[0].value == pytest.approx(steps[c1]["latency_ms"]["p50"], rel=1e-6)
    assert rows[0].peers == {"model-step": pytest.approx(record["settings"]["step_alone"]["median_ms"], rel=1e-6),
                             "model-step-after": pytest.approx(record["settings"]["step_alone_after"]["median_ms"],
                                                               rel=1e-6)}
    assert rows[-1].value == 0 and {r.source for r in rows} == {str(tmp_path / "t-7-peers")}
    # an older tree's bench7 appends nothing: `results --import` reads its record into the same rows, at its commit
    run_loadtest("results", "--import", str(tmp_path / "t-7-peers"), "--commit", "0ld7ree")
    imported = read_rows(own_results_table)[len(rows):]
    assert [r.model_copy(update={"commit": "-"}) for r in imported] == \
        [r.model_copy(update={"commit": "-"}) for r in rows]
    assert {r.commit for r in imported} == {"0ld7ree"}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_stack_check_compares_answers_and_times_the_hops(
    python_repository: Path, tiny_embedder_dir: Path, tmp_path: Path, own_results_table: Path
) -> None:
    """The GPU host's answers-under-load check and hop timings, on the shared tiny repository (CPU)."""
    run_loadtest("stack-check", "--repository", str(python_repository), "--model", str(tiny_embedder_dir),
               "--served", "tinyemb", "--texts", "16", "--concurrency", "4", "--repeats", "5", "--lone-texts", "8", "--name", "t",
               "--out", str(tmp_path))
    record = json.loads((tmp_path / "t-stack-check" / "results.json").read_text())
    assert set(record["answers"]) == {"scheduler", "ensemble", "scheduler, one at a time"}
    assert min(record["answers"].values()) >= 0.9999
    assert len(record["hops_ms"]) == 6 and all(v > 0 for v in record["hops_ms"].values())
    rows = {r.series: r.value for r in read_rows(own_results_table)}
    assert rows == pytest.approx({**record["answers"], **record["hops_ms"]}, rel=1e-6)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_transports_times_each_path_and_appends_its_p50s(tmp_path: Path, own_results_table: Path) -> None:
    """`python -m loadtest transports` on the fake repository: four paths, two batch sizes, one call at a time."""
    out = run_loadtest("transports", "--n", "5")
    table = [line.split("|")[1:4] for line in out.splitlines() if line.startswith("| 1 ") or line.startswith("| 8 ")]
    rows = read_rows(own_results_table)
    assert [(r.series, r.load) for r in rows] == [
        (path, f"{batch} text{'s' * (batch > 1)} c=1") for batch in (1, 8)
        for path in ("direct-grpc", "direct-shm", "gateway-shm", "gateway-grpc")]
    assert [r.value for r in rows] == [pytest.approx(float(p50), abs=0.006) for _, _, p50 in table]




@pytest.mark.slow
@pytest.mark.timeout(600)
def test_encode_runs_one_request_against_one_per_output(shared: SharedRepositories, tmp_path: Path,
                                                        own_results_table: Path) -> None:
    """`python -m loadtest encode` on a tiny embedder with bge-m3's heads (loadtest/models.py `--heads`): both output
    sets, both arms, every status counted; /encode runs the model once where the routes apart run it per output."""
    model = make_bert(tmp_path / "m3", "embed", "tiny", heads=True)
    repository = shared.repository("encode-bench", [{"model": str(model), "task": "embed", "name": "m3"}], **PYTHON_CPU)
    out = run_loadtest("encode", "--repository", str(repository), "--model", "m3", "--texts", "4", "--clients", "2",
                       "--seconds", "1", "--warmup", "0.5", "--rounds", "2", "--out", str(tmp_path / "out"),
                       timeout=500)
    assert "statuses of every request, warm-up included: {200:" in out and "| dense+sparse+multi_vector | all |" in out
    rows = {r.metric: r.value for r in read_rows(own_results_table)}
    assert rows["errors, warm-up included"] == 0
    for name in ("dense+sparse+multi_vector", "dense+sparse"):
        assert rows[f"{name}: one /encode texts/s"] > 0 and rows[f"{name}: a request per output texts/s"] > 0
        one, apart = rows[f"{name}: executions per 1,000 texts, one"], rows[f"{name}: executions per 1,000 texts, apart"]
        assert apart > one > 0  # each request per output runs the model again (Triton may merge a few)
