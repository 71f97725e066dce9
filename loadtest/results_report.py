"""`python -m loadtest results`: the figures the docs show, made from the results table.

    python -m loadtest results [--docs docs/benchmarks.md ...]   # print "How fast", write the plots, update the docs
    python -m loadtest results --add rows.csv                    # append the rows a GPU host run brought back
    python -m loadtest results --import DIR --commit REV         # rows of bench7 runs an older tree made (no table)
    python -m loadtest results --ab OLD NEW                      # two commits' bench7 loads, run in turns

"How fast" is the latest bench7 runs with peers (one commit, one machine kind, one day): the stack's texts/s per load
against the peers measured in the same run, each ratio taken within its run, and a lone text's p50 against the model
step alone. `--docs FILE` replaces the block between `<!-- results:how-fast -->` and `<!-- /results:how-fast -->`.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from loadtest.results_table import RESULTS, ResultRow, RunContext, append_rows, read_rows, resolve

PLOTS = RESULTS / "plots"
PEERS = {"sentence-transformers": "sentence-transformers `encode`", "hf-sdpa": "the careful HF SDPA loop",
         "infinity": "infinity-emb"}
LARGE_LOADS = ("64 texts c=32", "128 texts c=16", "256 texts c=8", "32 texts c=64")  # bench7's requests of many texts
LOADS = ("single text c=256", "32 texts c=16", *LARGE_LOADS)
LONE = "short text c=1"
SERIES = "stack scheduler"  # the shipped pipeline
BLOCK = "how-fast"


def _runs(rows: Sequence[ResultRow]) -> dict[tuple[str, str, str], list[ResultRow]]:
    """bench7's scheduler rows, by run (its source and name), in the table's order."""
    runs: dict[tuple[str, str, str], list[ResultRow]] = {}
    for row in rows:
        if row.benchmark == "bench7" and row.series in (SERIES, "stack"):  # "stack": the errors of every series
            runs.setdefault((row.source, row.run, row.commit), []).append(row)
    return runs


def latest_bench7(rows: Sequence[ResultRow]) -> list[list[ResultRow]]:
    """The runs of the last bench7 measurement with peers: every run with peers that shares its commit, machine kind
    and day."""
    with_peers = [run for run in _runs(rows).values() if any(r.peers and r.metric == "throughput" for r in run)]
    if not with_peers:
        raise ValueError("no bench7 run with peers in the results table")
    last = with_peers[-1][0]
    return [run for run in with_peers if (run[0].commit, run[0].machine, run[0].date) ==
            (last.commit, last.machine, last.date)]


def _span(values: Sequence[float], fmt: Callable[[float], str]) -> str:
    low, high = fmt(min(values)), fmt(max(values))
    return low if low == high else f"{low}-{high}"


def _count(x: float) -> str:
    return f"{x:,.0f}"


def _ratio(x: float) -> str:
    return f"{x:.2f}"


def _ms(x: float) -> str:
    return f"{x:.2f}"


def _find(run: list[ResultRow], load: str, metric: str) -> ResultRow | None:
    return next((r for r in run if r.load == load and r.metric == metric), None)


def how_fast(rows: Sequence[ResultRow]) -> str:
    """The "How fast" markdown: the latest bench7 runs against their peers."""
    runs = latest_bench7(rows)
    first = runs[0][0]
    head = ["| load | this stack | " + " | ".join(f"x {name}" for name in PEERS.values()) + " |",
            "| --- | ---: |" + " ---: |" * len(PEERS)]
    lines = []
    for load in LOADS:
        measured = [r for run in runs if (r := _find(run, load, "throughput"))]
        if not measured:
            continue
        cells = []
        for peer in PEERS:
            pairs = [(r.value / r.peers[peer], r.peers[peer]) for r in measured if r.peers.get(peer)]
            cells.append(f"{_span([x for x, _ in pairs], _ratio)}x ({_span([p for _, p in pairs], _count)} texts/s)"
                         if pairs else "not measured")
        lines.append(f"| {load} | {_span([r.value for r in measured], _count)} texts/s | " + " | ".join(cells) + " |")
    lone = [r for run in runs if (r := _find(run, LONE, "p50"))]
    if lone:
        steps = [v for r in lone for v in r.peers.values()]
        over = [r.value - v for r in lone for v in r.peers.values()]
        lines.append(f"| {LONE}, p50 | {_span([r.value for r in lone], _ms)} ms | the model step alone: "
                     f"{_span(steps, _ms)} ms, so {_span(over, lambda x: f'+{x:.2f}').replace('-', ' to ')} ms over "
                     "it |" + " |" * (len(PEERS) - 1))
    padding = [r.value for run in runs if (r := _find(run, "every load", "padding ratio"))]
    errors = [r.value for run in runs if (r := _find(run, "every load", "errors"))]
    notes = [f"bench7, {len(runs)} run{'s' * (len(runs) > 1)} on {first.machine} ({first.gpu or 'no GPU'}) at "
             f"{first.commit}, {first.date}, the scheduler pipeline as shipped; each ratio is taken within its run"]
    if padding:
        notes.append(f"padding ratio {_span(padding, lambda x: f'{x:.3f}')}")
    if errors:
        notes.append(f"{_span(errors, _count)} errors")
    return "\n".join([*head, *lines, "", "; ".join(notes) + "."])


AB_RUN = re.compile(r"(?<![a-z])(old|new)(?![a-z])")  # an A/B's runs: gw-old1, round2-new; a commit's other runs are no round


def _round(run: str) -> str:
    """A run's round: its last number (gw-old1, round2-new)."""
    found = re.search(r"(\d+)\D*$", run)
    return found.group(1) if found else run


def ab_table(rows: Sequence[ResultRow], old: str, new: str) -> str:
    """bench7's scheduler loads of two commits (run in turns on one machine): each round's new/old and the medians'.
    Within 5%: texts/s at least 0.95x the old, a lone text's p50 at most 1.05x."""
    picked = [r for r in rows if r.benchmark == "bench7" and r.series == SERIES and r.metric in ("throughput", "p50")
              and AB_RUN.search(r.run)]
    lines = ["| load | metric | old | new | new / old per round | new / old of the medians | within 5% |",
             "| --- | --- | --- | --- | --- | ---: | --- |"]
    for load, metric in [*((load, "throughput") for load in LOADS), (LONE, "p50")]:
        sides = [[r for r in picked if r.load == load and r.metric == metric and r.commit.startswith(rev)]
                 for rev in (old, new)]
        if not all(sides):
            continue
        olds, news = ({_round(r.run): r.value for r in side} for side in sides)
        per_round = [f"{news[k] / olds[k]:.3f}" for k in olds if k in news]
        ratio = statistics.median(news.values()) / statistics.median(olds.values())
        within = ratio >= 0.95 if metric == "throughput" else ratio <= 1.05
        fmt = _count if metric == "throughput" else _ms
        lines.append(f"| {load} | {metric} ({sides[0][0].unit}) | {', '.join(fmt(v) for v in olds.values())} | "
                     f"{', '.join(fmt(v) for v in news.values())} | {', '.join(per_round)} | {ratio:.3f} | "
                     f"{'yes' if within else 'NO'} |")
    if len(lines) == 2:
        raise ValueError(f"no bench7 scheduler rows of both {old} and {new} in the results table")
    return "\n".join(lines)


def replace_block(text: str, content: str, name: str = BLOCK) -> str:
    """`text` with the block between its `<!-- results:NAME -->` and `<!-- /results:NAME -->` markers replaced."""
    start, end = f"<!-- results:{name} -->", f"<!-- /results:{name} -->"
    if start not in text or end not in text:
        raise ValueError(f"no {start} ... {end} block")
    head, rest = text.split(start, 1)
    return f"{head}{start}\n{content}\n{end}{rest.split(end, 1)[1]}"


def plot(rows: Sequence[ResultRow], out: Path) -> list[Path]:
    """bench7-latest.png (the latest runs against their peers) and bench7-history.png (every run with peers: the
    stack's texts/s over each peer's, per load)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    runs = latest_bench7(rows)
    fig, axes = plt.subplots(1, len(LOADS), figsize=(11, 4))
    for ax, load in zip(axes, LOADS):
        measured = [r for run in runs if (r := _find(run, load, "throughput"))]
        bars = {"this stack": [r.value for r in measured]}
        bars.update({PEERS[p]: [r.peers[p] for r in measured if p in r.peers] for p in PEERS})
        names = [n for n, v in bars.items() if v]
        ax.bar(names, [statistics.median(bars[n]) for n in names], color="#4878a8",
               yerr=[[statistics.median(bars[n]) - min(bars[n]) for n in names],
                     [max(bars[n]) - statistics.median(bars[n]) for n in names]], capsize=4)
        ax.set_title(load)
        ax.set_ylabel("texts / s")
        ax.tick_params(axis="x", labelsize=7)
        ax.grid(True, axis="y", alpha=0.3)
    first = runs[0][0]
    fig.suptitle(f"bench7 at {first.commit} on {first.machine}, {first.date}: median and range of {len(runs)} runs")
    fig.tight_layout()
    latest = out / "bench7-latest.png"
    fig.savefig(latest, dpi=100)
    plt.close(fig)
    history = [run for run in _runs(rows).values() if any(r.peers and r.metric == "throughput" for r in run)]
    fig, axes = plt.subplots(1, len(LOADS), figsize=(11, 4), sharey=True)
    for ax, load in zip(axes, LOADS):
        for peer, name in PEERS.items():
            points = [(i, r.date, r.value / r.peers[peer]) for i, run in enumerate(history)
                      if (r := _find(run, load, "throughput")) and r.peers.get(peer)]
            if points:
                ax.plot([p[0] for p in points], [p[2] for p in points], marker=".", linestyle="", label=f"x {name}")
        ax.axhline(1.0, color="#888", linewidth=0.8)
        ax.set_title(load)
        ax.set_xlabel("bench7 runs with peers, oldest first")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("the stack's texts/s over the peer's")
    fig.tight_layout()
    trend = out / "bench7-history.png"
    fig.savefig(trend, dpi=100)
    plt.close(fig)
    return [latest, trend]


def import_runs(paths: Sequence[Path], commit: str) -> list[ResultRow]:
    """Rows of bench7 runs from their results.json (under each path): what an older tree's bench7 wrote."""
    from loadtest.bench7 import table_rows
    from loadtest.report import load

    rows = []
    for path in paths:
        for found in sorted(path.rglob("results.json") if path.is_dir() else [path]):
            record = load(found)
            context = RunContext.of(record.machine, record.name.removesuffix("-7-peers"), found.parent, commit)
            rows += table_rows(record, context)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest results", description=__doc__.splitlines()[0])
    p.add_argument("--table", default=None, help="the results table (default: $LOADTEST_TABLE, else "
                   "loadtest/results/results.csv)")
    p.add_argument("--docs", type=Path, nargs="*", default=[], help="markdown files whose how-fast block to rewrite")
    p.add_argument("--plots", type=Path, default=PLOTS, help="where the plots go")
    p.add_argument("--add", type=Path, help="a results table whose rows to append (a GPU host's $OUT/results.csv)")
    p.add_argument("--import", dest="imports", type=Path, nargs="*", default=[],
                   help="bench7 results.json files, or folders holding them, whose rows to append (with --commit)")
    p.add_argument("--commit", help="with --import: the commit those runs measured")
    p.add_argument("--ab", nargs=2, metavar=("OLD", "NEW"), help="compare two commits' bench7 rows")
    args = p.parse_args(argv)
    table = resolve(args.table)
    if args.add or args.imports:
        if args.imports and not args.commit:
            p.error("--import needs --commit")
        added = (read_rows(args.add) if args.add else []) + import_runs(args.imports, args.commit)
        append_rows(added, table)
        print(f"{len(added)} rows -> {table}")
        return 0
    rows = read_rows(table)
    if args.ab:
        print(ab_table(rows, *args.ab))
        return 0
    text = how_fast(rows)
    print(text)
    for doc in args.docs:
        doc.write_text(replace_block(doc.read_text(), text))
        print(f"updated {doc}", file=sys.stderr)
    for path in plot(rows, args.plots):
        print(f"wrote {path}", file=sys.stderr)
    return 0
