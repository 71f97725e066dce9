"""`python -m loadtest packed-step --smoke` runs end to end here (tiny model, CPU provider, the packed graph's CPU form), so
the one GPU call that measures the packed step does not fail on its plumbing; its numbers here mean nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from devstack.tritonserver import REPO_ROOT


@pytest.mark.slow  # a GPU benchmark's CPU smoke run (~4-9 s): `scripts/test -m slow`
@pytest.mark.timeout(300)
def test_packed_step_smoke_measures_every_graph(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "loadtest", "packed-step", "--smoke", "--name", "t", "--out",
                           str(tmp_path), "--work", str(tmp_path / "work")], capture_output=True, text=True,
                          cwd=REPO_ROOT, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads((tmp_path / "t-packed-step" / "results.json").read_text())
    graphs = record["onnxruntime"]["graphs"]
    assert set(graphs) == {"padded", "packed", "packed_3gemm", "packed_fp32", "packed_attention"}
    for name, entry in graphs.items():
        assert entry["parity_passed"] and entry["min_cosine"] >= 0.9999, name
        assert {"random32", "random128", "sorted32"} <= set(entry) and entry["placement"]["nodes_per_provider"]
        assert all(c["first_ms"] > 0 for c in entry["cold"])
        assert {"random1", "random8"} <= set(entry) and entry["random1"]["host_feed_ms"] > 0
        assert all(mode["real_tokens_per_s"] > 0 for mode in entry["fresh"].values()), name
    assert graphs["packed"]["random128"]["computed_per_real"] == 1.0
    assert graphs["padded"]["random128"]["computed_per_real"] > 1.0
    assert record["graphs"]["packed"]["fused"]["MultiHeadAttention"] == 2  # CPU form of the tiny model's 2 layers
    assert record["graphs"]["packed_attention"]["fused"]["Attention"] == 2
    assert all(p["passed"] and p["layout"] == "packed" for p in record["graphs"]["packed"]["builder_parity"])
    for peer in ("torch_sdpa_padded", "torch_packed_varlen"):
        assert record["torch"][peer]["min_cosine"] >= 0.9999, record["torch"][peer]
    summary = (tmp_path / "t-packed-step" / "summary.md").read_text()
    assert "| packed | random128 |" in summary and "speedup vs padded" in summary and "Fresh batches" in summary
