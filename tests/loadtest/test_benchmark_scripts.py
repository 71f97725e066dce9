"""The GPU-host benchmark scripts run end to end here too (CPU providers, tiny shapes), so they do not
rot between device sessions: their numbers here mean nothing, their plumbing does.

The two whole-stack scripts (bench7: builder, tritonserver, gateway, load steps; cold_shapes: two
sweeps of onnxruntime sessions) cost half a minute of the default run's 5: they are `slow`, run them
before a device session with `scripts/test -m slow tests/loadtest/test_benchmark_scripts.py`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from devstack.tritonserver import REPO_ROOT


def run_module(*args: str, timeout: int = 300) -> str:
    proc = subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, cwd=REPO_ROOT,
                          timeout=timeout, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.timeout(300)
def test_model_step_times_every_variant_and_checks_it_against_pytorch(tmp_path: Path) -> None:
    run_module("loadtest.model_step", "--name", "t", "--shape", "tiny", "--repeats", "2", "--shapes", "1x16",
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
    out = run_module("loadtest.cold_shapes", "--shape", "tiny", "--only", "default")
    line = next(x for x in out.splitlines() if x.startswith("default"))
    assert "batch 1..48 x 128: cold" in line and "8 x width 8..512: cold" in line


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_bench7_scheduler_steps_record_batching_and_latency_breakdown(tmp_path: Path) -> None:
    run_module("loadtest.bench7", "--name", "t", "--shape", "tiny", "--device", "cpu", "--parts", "scheduler",
               "--steps", "single text c=64,short text c=1", "--duration", "1.5", "--warmup", "0.5", "--procs", "1",
               "--workers", "1", "--corpus-size", "100", "--max-batch-size", "16", "--instances", "1",
               "--tokenizer-instances", "1", "--out", str(tmp_path), "--work", str(tmp_path / "work"), timeout=600)
    record = json.loads((tmp_path / "t-7-peers" / "results.json").read_text())
    assert [s["label"] for s in record["steps"]] == ["stack scheduler: single text c=64", "stack scheduler: short text c=1"]
    assert all(s["errors"] == 0 and s["items"] > 0 for s in record["steps"])
    batching = record["settings"]["batching"]["stack scheduler: single text c=64"]
    assert batching["batches"] > 0 and batching["padding_ratio"] >= 1.0 and batching["triton_executions"] > 0
    assert record["settings"]["step_alone"]["median_ms"] > 0
    assert (tmp_path / "t-7-peers" / "peers.png").is_file()
