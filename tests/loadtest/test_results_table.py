"""The results table (loadtest/results_table.py) and what `python -m loadtest results` makes of it
(loadtest/results_report.py), on real rows of the committed table: the figures expected are the ones its rows imply."""

from __future__ import annotations

import re
import statistics
from pathlib import Path

import pytest
from pydantic import ValidationError

from devstack.tritonserver import REPO_ROOT
from loadtest.machine import Machine
from loadtest.results_report import BLOCK, ab_table, how_fast, latest_bench7, plot, replace_block
from loadtest.results_table import COLUMNS, TABLE, ResultRow, RunContext, append_rows, machine_name, read_rows

ROWS = read_rows(TABLE)


def from_source(folder: str) -> list[ResultRow]:
    return [r for r in ROWS if r.source.endswith(f"loadtest/results/{folder}")]


def test_every_row_says_when_where_what_and_which_commit() -> None:
    assert len(ROWS) > 1000
    for row in ROWS:  # the model refuses an empty one; the source is a path git still holds, or a run's folder
        assert re.fullmatch(r"[0-9a-f]{7,40}:loadtest/results/[\w.-]+|loadtest/results/runs/.+", row.source), row
    assert {r.machine for r in ROWS} >= {"h100", "h200", "h200x2", "local-2core"}


def test_rows_read_back_as_they_were_appended(tmp_path: Path) -> None:
    rows = from_source("h200-20al-lone-row")
    table = tmp_path / "results.csv"
    append_rows(rows[:10], table)
    append_rows(rows[10:], table)
    assert read_rows(table) == rows
    lines = table.read_text().splitlines()
    assert lines[0] == ",".join(COLUMNS) and len(lines) == len(rows) + 1  # one header


def test_a_row_needs_its_commit_and_load_and_reads_its_peers() -> None:
    fields = ROWS[-1].csv_fields()
    with pytest.raises(ValidationError):
        ResultRow.model_validate(fields | {"commit": ""})
    with pytest.raises(ValidationError):
        ResultRow.model_validate(fields | {"load": ""})
    row = ResultRow.model_validate(fields | {"peers": "sentence-transformers=4880;hf-sdpa=7127.5"})
    assert row.peers == {"sentence-transformers": 4880.0, "hf-sdpa": 7127.5}
    assert ResultRow.model_validate(row.csv_fields()) == row


@pytest.mark.parametrize(("gpu", "cpus", "name"), [
    ("NVIDIA H200, 580.159.04, 143771 MiB", 16, "h200"),
    ("NVIDIA H100 80GB HBM3, 580.159.04, 81559 MiB", 16, "h100"),
    ("NVIDIA H200, 580.159.04, 143771 MiB\nNVIDIA H200, 580.159.04, 143771 MiB", 32, "h200x2"),
    (None, 2, "local-2core"),
])
def test_a_run_is_named_by_its_machine(gpu: str | None, cpus: int, name: str) -> None:
    machine = Machine(measured_at="2026-11-28T22:51:20+00:00", hostname="vm", platform="linux", cpu="x",
                      cpu_count=cpus, memory_gib=1.0, gpu=gpu, python="3.12", packages={}, git_commit="abc1234")
    context = RunContext.of(machine, "final1", REPO_ROOT / "loadtest" / "results" / "runs" / "final1-7-peers")
    row = context.row("bench7", "stack scheduler", "32 texts c=16", "throughput", 1.0, "texts/s", {"x": None})
    assert (row.machine, row.gpu, str(row.date), row.commit) == (name, (gpu or "").split(",")[0], "2026-11-28",
                                                                 "abc1234")
    assert row.source == "loadtest/results/runs/final1-7-peers" and row.peers == {}
    assert machine_name(machine) == name


def test_how_fast_shows_the_latest_runs_against_their_peers() -> None:
    text = how_fast(ROWS)
    runs = latest_bench7(ROWS)
    assert len({(run[0].commit, run[0].date) for run in runs}) == 1
    for load in ("single text c=256", "32 texts c=16"):
        got = [r for run in runs for r in run if r.load == load and r.metric == "throughput"]
        line = next(x for x in text.splitlines() if x.startswith(f"| {load} |"))
        assert f"{min(r.value for r in got):,.0f}-{max(r.value for r in got):,.0f} texts/s" in line
        for peer in ("sentence-transformers", "hf-sdpa"):
            ratios = [r.value / r.peers[peer] for r in got]
            assert f"{min(ratios):.2f}-{max(ratios):.2f}x" in line
        assert line.endswith("| not measured |") == all("infinity" not in r.peers for r in got)
    lone = [r for run in runs for r in run if r.metric == "p50"]
    line = next(x for x in text.splitlines() if x.startswith("| short text c=1, p50 |"))
    assert f"{min(r.value for r in lone):.2f}-{max(r.value for r in lone):.2f} ms" in line
    assert f"{len(runs)} runs on {runs[0][0].machine}" in text and f"at {runs[0][0].commit}" in text


def test_the_latest_runs_are_the_last_in_the_table() -> None:
    older, newer = from_source("h200-20ak-graph-inputs"), from_source("h200-20al-lone-row")
    final = {rows[0].source: next(r.commit for r in rows if r.benchmark == "bench7" and r.peers)
             for rows in (older, newer)}
    assert {run[0].commit for run in latest_bench7(older + newer)} == {final[newer[0].source]}
    assert {run[0].commit for run in latest_bench7(newer + older)} == {final[older[0].source]}
    with pytest.raises(ValueError):
        latest_bench7(from_source("local-2core-20al-gateway-since-02fb6b0"))


def test_ab_compares_two_commits_round_by_round() -> None:
    rows = [r for r in from_source("h100-20g-gateway") if re.search(r"round\d-(old|new)$", r.run)]
    old, new = rows[0].commit, next(r.commit for r in rows if r.commit != rows[0].commit)
    text = ab_table(rows, old, new)
    line = next(x for x in text.splitlines() if x.startswith("| single text c=256 |"))
    pick = {(r.commit, r.run[:6]): r.value for r in rows if r.load == "single text c=256"}
    for n in ("round1", "round2"):
        assert f"{pick[new, n] / pick[old, n]:.3f}" in line
    median = statistics.median(pick[new, n] for n in ("round1", "round2")) / \
        statistics.median(pick[old, n] for n in ("round1", "round2"))
    assert line.endswith(f"| {median:.3f} | {'yes' if median >= 0.95 else 'NO'} |")
    with pytest.raises(ValueError):
        ab_table(rows, old, "0000000")


def test_a_docs_block_is_replaced_and_nothing_else() -> None:
    text = f"# Title\n\nbefore\n<!-- results:{BLOCK} -->\nold figures\n<!-- /results:{BLOCK} -->\nafter\n"
    assert replace_block(text, "new figures") == text.replace("old figures", "new figures")
    with pytest.raises(ValueError):
        replace_block("no block here", "new figures")


@pytest.mark.parametrize("doc", ["docs/benchmarks.md", "README.md"])
def test_the_docs_figures_are_the_tables(doc: str) -> None:
    """The docs show what `python -m loadtest results --docs DOC` makes of the table."""
    text = (REPO_ROOT / doc).read_text()
    assert replace_block(text, how_fast(ROWS)) == text


def test_the_plots_are_written(tmp_path: Path) -> None:
    paths = plot(from_source("h200-20al-lone-row"), tmp_path)
    assert [p.name for p in paths] == ["bench7-latest.png", "bench7-history.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in paths)
