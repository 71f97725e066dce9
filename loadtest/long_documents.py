"""Benchmark of chunked long inputs beside single-text queries: long documents do not hold the queries up.

    python -m loadtest long-docs --repository DIR --model NAME [--seconds 15] [--rate 100] [--doc-share 0.05]
        [--doc-tokens 20000] [--name NAME] [--out DIR] [--table PATH|none]

Starts tritonserver on the repository and the gateway (devstack) with its shipped defaults, except the limits a
document needs (GATEWAY_MAX_INPUT_CHARS, GATEWAY_MAX_CHUNKED_TOKENS), then two phases of `--seconds` each, arrivals
a Poisson process at `--rate` per second, each answer's latency counted from its scheduled arrival:
1. queries alone: single texts of the realistic corpus (loadtest/corpus.py) at (1 - `--doc-share`) x `--rate`;
2. the mixed stream: each arrival is a document of `--doc-tokens` tokens with probability `--doc-share`, sent with
   `truncate: "chunk"` in the batch lane (`X-Priority: batch`, `X-Request-Timeout: 60`), else a query as in 1.
Reported: texts/s answered, the queries' p50 and p99 alone and mixed, the documents' p50 and p99, every status.
Target: the queries' p99 mixed at most 3x their p99 alone.
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

DOCUMENT_HEADERS = {"X-Priority": "batch", "X-Request-Timeout": "60"}


@dataclass
class Stream:
    """What one phase measured, by kind of text (`query`, `document`)."""

    seconds: float = 0.0
    latencies: dict[str, list[float]] = field(default_factory=lambda: {"query": [], "document": []})
    statuses: dict[str, Counter[int]] = field(default_factory=lambda: {"query": Counter(), "document": Counter()})

    def p(self, kind: str, q: float) -> float:
        values = self.latencies[kind]
        return float(np.percentile(values, q) * 1e3) if values else float("nan")

    @property
    def texts_per_s(self) -> float:
        return sum(map(len, self.latencies.values())) / self.seconds if self.seconds else 0.0


class Pool:
    """Idle keep-alive connections with one set of headers."""

    def __init__(self, url: str, headers: dict[str, str] | None = None) -> None:
        self.url, self.headers, self.idle = url, headers, list[Connection]()

    async def post(self, path: str, body: bytes) -> int:
        connection = self.idle.pop() if self.idle else Connection(self.url, self.headers, timeout_s=120)
        try:
            status, _, _ = await connection.post(path, body)
        except (ConnectionError, TimeoutError):
            await connection.close()
            return 0
        self.idle.append(connection)
        return status

    async def close(self) -> None:
        for connection in self.idle:
            await connection.close()


async def documents_of(url: str, model: str, texts: list[str], tokens: int, count: int) -> list[str]:
    """`count` documents of at least `tokens` tokens of the model (as /tokenize counts them), from the corpus."""
    connection, rng = Connection(url, timeout_s=120), random.Random(11)
    found: list[str] = []
    try:
        while len(found) < count:
            document = ""
            while True:
                document += " ".join(rng.choice(texts) for _ in range(64)) + " "
                status, _, body = await connection.post("/tokenize", orjson.dumps(
                    {"model": model, "inputs": document, "add_special_tokens": False}))
                if status != 200:
                    raise RuntimeError(f"/tokenize answered {status}: {body[:200]!r}")
                if len(orjson.loads(body)[0]) >= tokens:
                    break
            found.append(document)
    finally:
        await connection.close()
    return found


async def run_stream(url: str, model: str, queries: list[str], documents: list[str], rate: float, share: float,
                     seconds: float) -> Stream:
    stream, rng = Stream(), random.Random(7)
    pools = {"query": Pool(url), "document": Pool(url, DOCUMENT_HEADERS)}
    tasks: set[asyncio.Task[None]] = set()

    async def one(kind: str, body: bytes, due: float) -> None:
        status = await pools[kind].post("/embed", body)
        stream.statuses[kind][status] += 1
        if status == 200:
            stream.latencies[kind].append(time.monotonic() - due)

    start = due = time.monotonic()
    until, n = start + seconds, 0
    while due < until:
        due += rng.expovariate(rate)
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        if rng.random() < share:
            kind, body = "document", orjson.dumps({"model": model, "inputs": [documents[n % len(documents)]],
                                                   "truncate": "chunk"})
        else:
            kind, body = "query", orjson.dumps({"model": model, "inputs": [queries[n % len(queries)]]})
        task = asyncio.get_running_loop().create_task(one(kind, body, due))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        n += 1
    await asyncio.gather(*tasks)
    stream.seconds = time.monotonic() - start
    for pool in pools.values():
        await pool.close()
    return stream


def report(alone: Stream, mixed: Stream) -> list[tuple[str, float, str, str]]:
    """(measure, value, unit, target) of the two phases."""
    failed = sum(n for counts in mixed.statuses.values() for status, n in counts.items() if status != 200)
    return [
        ("queries alone: texts/s", alone.texts_per_s, "texts/s", ""),
        ("queries alone: p50", alone.p("query", 50), "ms", ""),
        ("queries alone: p99", alone.p("query", 99), "ms", ""),
        ("mixed: texts/s", mixed.texts_per_s, "texts/s", ""),
        ("mixed: query p50", mixed.p("query", 50), "ms", ""),
        ("mixed: query p99", mixed.p("query", 99), "ms", ""),
        ("mixed: document p50", mixed.p("document", 50), "ms", ""),
        ("mixed: document p99", mixed.p("document", 99), "ms", ""),
        ("query p99, mixed / alone", mixed.p("query", 99) / alone.p("query", 99), "x", "<= 3"),
        ("requests refused or failed, mixed", float(failed), "count", "0"),
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest long-docs", description=__doc__.split("\n\n")[0])
    p.add_argument("--repository", type=Path, required=True)
    p.add_argument("--model", required=True, help="the served embedder's NAME")
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--rate", type=float, default=100.0, help="arrivals per second, documents included")
    p.add_argument("--doc-share", type=float, default=0.05, help="share of arrivals that are documents")
    p.add_argument("--doc-tokens", type=int, default=20_000, help="tokens of each document")
    p.add_argument("--name", default="long-docs")
    p.add_argument("--out", type=Path, default=None)
    add_table_argument(p)
    args = p.parse_args(argv)
    queries = make_corpus(CorpusSpec(size=4000))
    out = args.out or RUNS_DIR / args.name
    out.mkdir(parents=True, exist_ok=True)
    settings = {"max_input_chars": str(args.doc_tokens * 20),
                "max_chunked_tokens": str(max(65536, args.doc_tokens * 2)),
                "max_body_bytes": str(max(2 * 1024 * 1024, args.doc_tokens * 80))}
    with local_stack(args.repository, settings) as (_, gw):
        documents = asyncio.run(documents_of(gw.url, args.model, queries, args.doc_tokens, 8))
        asyncio.run(run_stream(gw.url, args.model, queries, documents, args.rate, args.doc_share, 3))  # warm-up
        alone = asyncio.run(run_stream(gw.url, args.model, queries, documents, args.rate * (1 - args.doc_share), 0,
                                       args.seconds))
        mixed = asyncio.run(run_stream(gw.url, args.model, queries, documents, args.rate, args.doc_share,
                                       args.seconds))
    lines = [f"# {args.name}: documents of {args.doc_tokens} tokens chunked beside single-text queries", "",
             f"Poisson arrivals at {args.rate:g}/s, {args.doc_share:.0%} of them documents (`truncate: \"chunk\"`, "
             f"{DOCUMENT_HEADERS}); queries alone at {args.rate * (1 - args.doc_share):g}/s; {args.seconds:g} s "
             "per phase", "", "| measure | value | unit | target |", "| --- | ---: | --- | --- |"]
    rows = report(alone, mixed)
    lines += [f"| {m} | {v:.3f} | {u} | {t} |" for m, v, u, t in rows]
    lines += ["", "statuses (queries alone, mixed queries, mixed documents): "
              f"{dict(alone.statuses['query'])}, {dict(mixed.statuses['query'])}, {dict(mixed.statuses['document'])}"]
    context = publish(out, args.name, lines)
    load = f"{args.rate:g}/s, {args.doc_share:g} documents of {args.doc_tokens} tokens"
    record_rows([context.row("long-docs", "stack scheduler", load, m, v, u) for m, v, u, _ in rows], args.table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
