"""loadtest.experiments.triton_call end to end on a real tritonserver: both clients call the echo step at each
concurrency in every round, and the record says what each cost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devstack.tritonserver import REPO_ROOT
from loadtest.experiments import triton_call


@pytest.mark.slow  # a GPU experiment's CPU smoke run (~2 s): `scripts/test -m slow`
def test_both_clients_are_timed_at_every_concurrency_in_every_round(tmp_path: Path, capsys) -> None:
    before = tmp_path / "client.py"  # the form the GPU host takes (no history there): a copy of a client.py
    before.write_text((REPO_ROOT / "gateway" / "triton" / "client.py").read_text())
    out = tmp_path / "call.json"
    triton_call.main(["--before", str(before), "--rounds", "2", "--calls", "20", "--concurrency", "1,4",
                      "--warmup", "8", "--out", str(out)])
    record = json.loads(out.read_text())
    cells = {(row["round"], row["way"], row["concurrency"]) for row in record["rows"]}
    assert cells == {(r, w, c) for r in (1, 2) for w in ("old", "new") for c in (1, 4)}
    assert all(row["calls_per_s"] > 0 and row["p50_ms"] > 0 and row["cpu_us_per_call"] > 0 for row in record["rows"])
    assert record["machine"]["cpu_count"] >= 1 and record["settings"]["before"] == str(before)
    printed = capsys.readouterr().out
    assert record["summary"][0] in printed and len(record["summary"]) == 2 + 2 * 3
