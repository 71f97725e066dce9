"""A run's folder (loadtest/results/runs/<name>/): results.json, summary.md and PNG plots."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from loadtest.machine import Machine
from loadtest.results_table import RUNS_DIR
from loadtest.stats import StepResult


class RunRecord(BaseModel):
    """One whole run: where, what, with which settings, and every step's result."""

    name: str
    description: str = ""
    machine: Machine
    settings: dict[str, Any] = Field(default_factory=dict)
    steps: list[StepResult] = Field(default_factory=list)
    ratios: dict[str, float] = Field(default_factory=dict, description="Headline comparisons of a benchmark.")
    notes: list[str] = Field(default_factory=list)


def _x(step: StepResult) -> float:
    return step.settings.rate if step.settings.mode == "open" and step.settings.rate else step.settings.concurrency


def table(steps: list[StepResult]) -> str:
    """A Markdown table of the steps."""
    head = ("| series | mode | conc | rate | batch | req/s | texts/s | p50 ms | p95 ms | p99 ms | errors | warm-up errors "
            "| dropped | client µs/req |\n"
            "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    rows = [
        f"| {s.label} | {s.settings.mode} | {s.settings.concurrency} | {s.settings.rate or '-'} | {s.settings.batch} "
        f"| {s.throughput_rps:.1f} | {s.items_per_s:.1f} | {s.latency_ms.p50:.2f} | {s.latency_ms.p95:.2f} "
        f"| {s.latency_ms.p99:.2f} | {s.errors} | {s.warmup_errors} | {s.dropped} | {s.client_cpu_us_per_request:.0f} |"
        for s in steps
    ]
    return "\n".join([head, *rows])


def summary_markdown(record: RunRecord) -> str:
    m = record.machine
    lines = [
        f"# {record.name}", "", record.description, "",
        f"- measured: {m.measured_at} on `{m.hostname}` ({m.cpu}, {m.cpu_count} cores, {m.memory_gib} GiB"
        + (f", GPU {m.gpu}" if m.gpu else ", no GPU") + ")",
        f"- python {m.python}; " + ", ".join(f"{k} {v}" for k, v in sorted(m.packages.items())),
        f"- git commit: {m.git_commit}",
        f"- settings: `{record.settings}`", "",
    ]
    if record.ratios:
        lines += ["| ratio | value |", "| --- | ---: |"]
        lines += [f"| {k} | {v:.3f} |" for k, v in record.ratios.items()] + [""]
    lines += [table(record.steps), ""]
    lines += [f"- {n}" for n in record.notes]
    return "\n".join(lines) + "\n"


def plot(record: RunRecord, out_dir: Path) -> list[Path]:
    """Throughput and p50/p95/p99 latency against concurrency (or rate), one line per series."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: dict[str, list[StepResult]] = {}
    for step in record.steps:
        series.setdefault(step.label, []).append(step)
    xlabel = "offered rate (req/s)" if all(s.settings.mode == "open" for s in record.steps) else "concurrency"
    fig, (ax_t, ax_l) = plt.subplots(1, 2, figsize=(12, 4.5))
    for label, steps in series.items():
        steps = sorted(steps, key=_x)
        xs = [_x(s) for s in steps]
        ax_t.plot(xs, [s.items_per_s for s in steps], marker="o", label=label)
        for pct, style in (("p50", "-"), ("p95", "--"), ("p99", ":")):
            ax_l.plot(xs, [getattr(s.latency_ms, pct) for s in steps], style, marker=".", label=f"{label} {pct}")
    for ax in (ax_t, ax_l):
        ax.set_xscale("log", base=2)
        ax.set_xlabel(xlabel)
        ax.grid(True, alpha=0.3)
    ax_t.set_ylabel("texts / s")
    ax_t.set_title("throughput")
    ax_l.set_ylabel("latency (ms)")
    ax_l.set_yscale("log")
    ax_l.set_title("latency p50 / p95 / p99")
    ax_t.legend(fontsize=7)
    ax_l.legend(fontsize=6, ncol=2)
    fig.suptitle(f"{record.name} - {record.machine.cpu_count} cores" + (f", {record.machine.gpu.split(',')[0]}" if record.machine.gpu else ""))
    fig.tight_layout()
    path = out_dir / "throughput_latency.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


def save(record: RunRecord, root: Path = RUNS_DIR) -> Path:
    """Write results.json, summary.md and the plot to root/<name>/; return that folder."""
    out = root / record.name
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(record.model_dump_json(indent=2))
    (out / "summary.md").write_text(summary_markdown(record))
    if record.steps:
        plot(record, out)
    return out


def save_step_record(record: dict[str, Any], root: Path, summary: list[str], description: str = "") -> Path:
    """A model-step benchmark's record (its own fields, no load steps; `name` and `machine` among them):
    root/<name>/results.json, and summary.md headed by the name, `description` and the machine, then `summary`'s
    lines. Prints the summary; returns the folder."""
    out = root / record["name"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(record, indent=2))
    machine = record["machine"]
    head = [f"# {record['name']}", "", *([description, ""] if description else []),
            f"- machine: {machine.get('gpu') or 'no GPU'}; {machine.get('cpu')}; {machine.get('measured_at')}"]
    text = "\n".join([*head, *summary]) + "\n"
    (out / "summary.md").write_text(text)
    print(text, flush=True)
    return out


def load(path: Path) -> RunRecord:
    """Read a results.json back."""
    return RunRecord.model_validate_json(Path(path).read_text())
