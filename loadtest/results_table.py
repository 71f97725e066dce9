"""The results table: one row per measured figure, appended by each benchmark as it runs.

`loadtest/results/results.csv` holds every headline figure measured so far: when, on what, at which commit, which
benchmark, series and load, the value, and the peers' values measured beside it in the same run. The docs' figures
and plots are made from it (`python -m loadtest results`). A run's own folder (results.json, summary.md, plots) goes
to `loadtest/results/runs/`, which git ignores; `source` names it (or, for runs before the table, the
`COMMIT:loadtest/results/FOLDER` that git still holds).
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from loadtest.machine import Machine

RESULTS = Path(__file__).resolve().parent / "results"
TABLE = RESULTS / "results.csv"
RUNS_DIR = RESULTS / "runs"
TABLE_ENV = "LOADTEST_TABLE"  # another table for this process (a GPU host writes its rows under $OUT)


class ResultRow(BaseModel):
    """One measured figure."""

    model_config = ConfigDict(frozen=True)

    date: dt.date
    machine: str = Field(min_length=1, description="h100, h200, h200x2, local-2core, ...")
    gpu: str = Field("", description="the GPU's model name; empty on a CPU machine")
    commit: str = Field(min_length=1, description="the code that was measured")
    benchmark: str = Field(min_length=1)
    run: str = Field("", description="the run within its source (final1, gw-new2, ...)")
    series: str = Field("", description="what was measured: stack scheduler, before, ...")
    load: str = Field(min_length=1, description="single text c=256, 32 texts c=16, short text c=1, ...")
    metric: str = Field(min_length=1)
    value: float
    unit: str = ""
    peers: dict[str, float] = Field(default_factory=dict, description="peer -> its value in the same run")
    source: str = Field("", description="the run's folder, or COMMIT:loadtest/results/FOLDER")

    @field_validator("peers", mode="before")
    @classmethod
    def _parse_peers(cls, value: Any) -> Any:
        if isinstance(value, str):
            return {k: float(v) for k, v in (item.split("=", 1) for item in value.split(";") if item)}
        return value

    def csv_fields(self) -> dict[str, str]:
        fields = {name: str(getattr(self, name)) for name in COLUMNS}
        fields["value"] = f"{self.value:.7g}"
        fields["peers"] = ";".join(f"{k}={v:.7g}" for k, v in self.peers.items())
        return fields


COLUMNS = list(ResultRow.model_fields)


def resolve(table: Path | str | None = None) -> Path | None:
    """The table to use: `table`, else $LOADTEST_TABLE, else TABLE; None for "none" (append nothing)."""
    chosen = str(table) if table is not None else os.environ.get(TABLE_ENV, str(TABLE))
    return None if chosen == "none" else Path(chosen)


def read_rows(table: Path | str | None = None) -> list[ResultRow]:
    path = resolve(table)
    if path is None or not path.exists():
        return []
    with path.open(newline="", encoding="utf-8") as f:
        return [ResultRow.model_validate(fields) for fields in csv.DictReader(f)]


def append_rows(rows: Iterable[ResultRow], table: Path | str | None = None) -> Path | None:
    """Append rows to the table (with its header when it is new); the table's path, or None if none is kept."""
    path = resolve(table)
    rows = list(rows)
    if path is None or not rows:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists() or path.stat().st_size == 0
    with path.open("a", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, COLUMNS, lineterminator="\n")
        if new:
            writer.writeheader()
        writer.writerows(row.csv_fields() for row in rows)
    return path


def machine_name(machine: Machine) -> str:
    """h200, h200x2 (two GPUs), or local-Ncore without a GPU."""
    gpus = [line for line in (machine.gpu or "").splitlines() if line.strip()]
    if not gpus:
        return f"local-{machine.cpu_count}core"
    model = re.search(r"\b([A-Z]+\d+[A-Za-z]*)\b", gpus[0].split(",")[0].replace("NVIDIA", ""))
    name = model.group(1).lower() if model else "gpu"
    return f"{name}x{len(gpus)}" if len(gpus) > 1 else name


@dataclass(frozen=True)
class RunContext:
    """What every row of one run shares."""

    date: dt.date
    machine: str
    gpu: str
    commit: str
    run: str
    source: str

    @classmethod
    def of(cls, machine: Machine, run: str, source: Path | str, commit: str | None = None) -> RunContext:
        path = Path(source)
        if path.is_absolute() and path.is_relative_to(RESULTS.parent.parent):
            source = path.relative_to(RESULTS.parent.parent).as_posix()
        return cls(date=dt.date.fromisoformat(machine.measured_at[:10]), machine=machine_name(machine),
                   gpu=(machine.gpu or "").splitlines()[0].split(",")[0].strip() if machine.gpu else "",
                   commit=commit or machine.git_commit or "unknown", run=run, source=str(source))

    def row(self, benchmark: str, series: str, load: str, metric: str, value: float, unit: str,
            peers: dict[str, float | None] | None = None) -> ResultRow:
        return ResultRow(date=self.date, machine=self.machine, gpu=self.gpu, commit=self.commit, benchmark=benchmark,
                         run=self.run, series=series, load=load, metric=metric, value=value, unit=unit,
                         peers={k: v for k, v in (peers or {}).items() if v is not None}, source=self.source)


def add_table_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--table", default=None,
                        help=f"the results table this run's rows are appended to (default: ${TABLE_ENV}, else "
                             "loadtest/results/results.csv; 'none': append nothing)")


def record_rows(rows: Iterable[ResultRow], table: Path | str | None) -> None:
    """Append a run's rows and say where they went."""
    rows = list(rows)
    path = append_rows(rows, table)
    print(f"results table: {len(rows)} rows -> {path if path else 'not kept (--table none)'}", flush=True)
