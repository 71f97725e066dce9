"""Benchmark of the priority lanes: a bulk job beside interactive traffic, on one stack.

    python -m loadtest lanes --repository DIR --model NAME [--seconds 15] [--bulk-clients 8]
        [--bulk-texts 64] [--share 0.1] [--name NAME] [--out DIR] [--table PATH|none]

Starts tritonserver on the repository and the gateway with its shipped defaults (devstack), then three phases of
`--seconds` each, on the realistic corpus (loadtest/corpus.py):
1. bulk alone: `--bulk-clients` closed-loop clients send `--bulk-texts`-text requests that allow 30 s
   (`X-Request-Timeout: 30`, `X-Priority: batch`): the stack's capacity for bulk work, in texts/s;
2. interactive alone: single texts arrive as a Poisson process at `--share` of that capacity (texts/s), the
   latency of each counted from its scheduled arrival (no coordinated omission): the idle stack's p50 and p99;
3. both at once: the bulk job's goodput and refusals, the interactive texts' p50 and p99.
Targets: interactive p99 in 3 at most 3x its p99 in 2; bulk goodput in 3 at least 90% of 1; no bulk
request refused. Every answer's status is counted, errors included, in every phase.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import orjson

from loadtest.corpus import CorpusSpec, make_corpus
from loadtest.http_client import Connection
from loadtest.local_stack import local_stack, publish
from loadtest.results_table import RUNS_DIR, add_table_argument, record_rows

BULK_HEADERS = {"X-Request-Timeout": "30", "X-Priority": "batch"}


@dataclass
class Phase:
    """What one phase measured."""

    seconds: float = 0.0
    bulk_texts: int = 0  # texts of bulk requests answered 200
    bulk_statuses: Counter[int] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)  # interactive, answered 200, from scheduled arrival
    interactive_statuses: Counter[int] = field(default_factory=Counter)

    @property
    def bulk_texts_per_s(self) -> float:
        return self.bulk_texts / self.seconds if self.seconds else 0.0

    def p(self, q: float) -> float:
        return float(np.percentile(self.latencies, q) * 1e3) if self.latencies else float("nan")


def _body(model: str, texts: list[str]) -> bytes:
    return orjson.dumps({"model": model, "inputs": texts})


async def _bulk(url: str, model: str, texts: list[str], size: int, clients: int, until: float, phase: Phase) -> None:
    async def client(k: int) -> None:
        connection = Connection(url, BULK_HEADERS, timeout_s=60)
        i = k * size
        try:
            while time.monotonic() < until:
                chunk = [texts[(i + j) % len(texts)] for j in range(size)]
                i += size * clients
                try:
                    status, _, _ = await connection.post("/embed", _body(model, chunk))
                except (ConnectionError, TimeoutError):
                    status = 0
                phase.bulk_statuses[status] += 1
                if status == 200:
                    phase.bulk_texts += size
        finally:
            await connection.close()

    await asyncio.gather(*(client(k) for k in range(clients)))


async def _interactive(url: str, model: str, texts: list[str], rate: float, until: float, phase: Phase) -> None:
    idle: list[Connection] = []
    tasks: set[asyncio.Task[None]] = set()
    rng = random.Random(7)

    async def one(text: str, due: float) -> None:
        connection = idle.pop() if idle else Connection(url, timeout_s=60)
        try:
            status, _, _ = await connection.post("/embed", _body(model, [text]))
        except (ConnectionError, TimeoutError):
            status = 0
        phase.interactive_statuses[status] += 1
        if status == 200:
            phase.latencies.append(time.monotonic() - due)
        idle.append(connection)

    due, n = time.monotonic(), 0
    while due < until:
        due += rng.expovariate(rate)
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        task = asyncio.get_running_loop().create_task(one(texts[n % len(texts)], due))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        n += 1
    await asyncio.gather(*tasks)
    for connection in idle:
        await connection.close()


async def run_phase(url: str, model: str, texts: list[str], args: argparse.Namespace, bulk: bool,
                    rate: float) -> Phase:
    phase = Phase()
    start = time.monotonic()
    until = start + args.seconds
    jobs = []
    if bulk:
        jobs.append(_bulk(url, model, texts, args.bulk_texts, args.bulk_clients, until, phase))
    if rate > 0:
        jobs.append(_interactive(url, model, texts, rate, until, phase))
    await asyncio.gather(*jobs)
    phase.seconds = time.monotonic() - start
    return phase


def report(alone: Phase, idle: Phase, mixed: Phase) -> list[tuple[str, float, str, str]]:
    """(measure, value, unit, target) of the three phases."""
    refused = sum(n for status, n in mixed.bulk_statuses.items() if status != 200)
    return [
        ("bulk alone: texts/s", alone.bulk_texts_per_s, "texts/s", ""),
        ("interactive alone: p50", idle.p(50), "ms", ""),
        ("interactive alone: p99", idle.p(99), "ms", ""),
        ("mixed: bulk texts/s", mixed.bulk_texts_per_s, "texts/s", ""),
        ("mixed: interactive p50", mixed.p(50), "ms", ""),
        ("mixed: interactive p99", mixed.p(99), "ms", ""),
        ("interactive p99, mixed / alone", mixed.p(99) / idle.p(99), "x", "<= 3"),
        ("bulk goodput, mixed / alone", mixed.bulk_texts_per_s / alone.bulk_texts_per_s, "x", ">= 0.9"),
        ("bulk requests refused or failed, mixed", float(refused), "count", "0"),
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest lanes", description=__doc__.split("\n\n")[0])
    p.add_argument("--repository", type=Path, required=True)
    p.add_argument("--model", required=True, help="the served embedder's NAME")
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--bulk-clients", type=int, default=8)
    p.add_argument("--bulk-texts", type=int, default=64)
    p.add_argument("--share", type=float, default=0.1, help="interactive texts/s as a share of bulk capacity")
    p.add_argument("--name", default="lanes")
    p.add_argument("--out", type=Path, default=None)
    add_table_argument(p)
    args = p.parse_args(argv)
    texts = [t for t in make_corpus(CorpusSpec(size=4000))]
    out = args.out or RUNS_DIR / args.name
    out.mkdir(parents=True, exist_ok=True)
    with local_stack(args.repository) as (_, gw):
        warm = asyncio.run(run_phase(gw.url, args.model, texts, argparse.Namespace(**{**vars(args), "seconds": 3}),
                                     True, 0))
        alone = asyncio.run(run_phase(gw.url, args.model, texts, args, True, 0))
        rate = args.share * alone.bulk_texts_per_s
        idle = asyncio.run(run_phase(gw.url, args.model, texts, args, False, rate))
        mixed = asyncio.run(run_phase(gw.url, args.model, texts, args, True, rate))
    lines = [f"# {args.name}: a bulk job beside interactive traffic", "",
             f"{args.bulk_clients} bulk clients x {args.bulk_texts} texts ({BULK_HEADERS}); interactive single texts "
             f"at {rate:.1f}/s ({args.share:g} of bulk capacity); {args.seconds:g} s per phase",
             "", "| measure | value | unit | target |", "| --- | ---: | --- | --- |"]
    rows = report(alone, idle, mixed)
    lines += [f"| {m} | {v:.3f} | {u} | {t} |" for m, v, u, t in rows]
    lines += ["", "statuses (warm-up, bulk alone, interactive alone, mixed bulk, mixed interactive): "
              f"{dict(warm.bulk_statuses)}, {dict(alone.bulk_statuses)}, {dict(idle.interactive_statuses)}, "
              f"{dict(mixed.bulk_statuses)}, {dict(mixed.interactive_statuses)}"]
    context = publish(out, args.name, lines)
    load = f"{args.bulk_texts} texts x {args.bulk_clients} bulk + interactive at {args.share:g}"
    record_rows([context.row("lanes", "stack scheduler", load, m, v, u) for m, v, u, _ in rows], args.table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
