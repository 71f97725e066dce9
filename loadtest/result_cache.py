"""The gateway's embedding result cache (GATEWAY_CACHE): how often it hits where it lives, and what it gains.

    python -m loadtest result-cache hit-rates [--texts 100000] [--requests 1000000] [--zipf 1.1] [--workers 12]
        [--budget-mib 16,64,256] [--dim 768] [--out DIR] [--table T]
    python -m loadtest result-cache ab [--repository DIR --served NAME | --shape small] [--cache local|redis]
        [--rounds 4] [--clients 256] [--calls 20000] [--texts 100000] [--zipf 1.1] [--workers N] [--name NAME]
        [--out DIR] [--table T]

`hit-rates` replays a key stream through the gateway's own per-worker store (gateway/service/cache/local.py): texts
drawn Zipf-distributed (rank k with weight k^-s) from `--texts` distinct texts of the loadtest corpus, each request
sent to one of `--workers` workers at random, as the kernel spreads connections. It compares, per byte budget, one
cache all workers share (Redis) against per-worker caches of the same total bytes and per-worker caches of the
whole budget each (`--workers` times the memory). Entries are sized as the gateway sizes them (`--dim` floats).
The hit rate is counted over the second half of the stream (the first warms the caches).

`ab` measures the same stream on a real stack: one tritonserver, two gateways (GATEWAY_CACHE=off and `--cache`,
a redis-server started here for `redis`), single-text /embed requests from `--clients` connections, `--calls`
per gateway per round, the two in alternating order; texts/s, p50 and the cache's hit rate (its /metrics) per side.
Each round draws a new stream from the same distribution, the same for both sides; the cache stays warm across
rounds, as a running gateway's does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson

from loadtest.corpus import CorpusSpec, make_corpus
from loadtest.machine import describe_machine
from loadtest.results_table import ResultRow, RunContext, add_table_argument, record_rows

MIB = 1024 * 1024


def distinct_texts(count: int, seed: int = 1234) -> list[str]:
    """`count` distinct texts of the loadtest corpus (short ones repeat in a large corpus), the same on every run."""
    size = count
    while True:
        texts = list(dict.fromkeys(make_corpus(CorpusSpec(size=size, seed=seed))))
        if len(texts) >= count:
            return texts[:count]
        size += count - len(texts) + count // 10


def zipf_stream(count: int, distinct: int, s: float, seed: int) -> np.ndarray:
    """`count` indices into `distinct` items, item k (0-based) drawn with weight (k + 1)^-s."""
    weights = np.arange(1, distinct + 1, dtype=np.float64) ** -s
    return np.random.default_rng(seed).choice(distinct, size=count, p=weights / weights.sum())


# --- hit-rates: the gateway's own store on a simulated stream ------------------------------------------------
async def _hit_rate(stream: np.ndarray, workers: np.ndarray, keys: list[bytes], stores: list[object], value: bytes
                    ) -> float:
    """The share of hits over the second half of `stream`, each request on store `workers[i]`."""
    from gateway.service.cache.local import LocalStore

    typed = [s for s in stores if isinstance(s, LocalStore)]
    hits, counted = 0, 0
    half = len(stream) // 2
    for i, (item, worker) in enumerate(zip(stream.tolist(), workers.tolist())):
        store = typed[worker]
        key = keys[item]
        found, _ = await store.get("m", [key])
        if found[0] is None:
            await store.put([(key, value)])
        elif i >= half:
            hits += 1
        counted += i >= half
    return hits / counted


def hit_rates(args: argparse.Namespace) -> list[tuple[str, float, float]]:
    """(series, budget MiB, hit rate) per budget and cache placement."""
    from gateway.service.cache.keys import text_key
    from gateway.service.cache.local import LocalStore
    from gateway.service.cache.store import new_epoch, pack

    texts = distinct_texts(args.texts)
    order = np.random.default_rng(args.seed).permutation(len(texts))  # which text has which popularity rank
    identity = b"\0" * 16
    keys = [text_key(identity, "right", texts[i]) for i in order]
    value = pack(new_epoch(), np.zeros(args.dim, np.float32), 8)
    stream = zipf_stream(args.requests, len(texts), args.zipf, args.seed)
    workers = np.random.default_rng(args.seed + 1).integers(args.workers, size=args.requests)
    one = np.zeros(args.requests, dtype=np.int64)
    results = []
    for mib in args.budget_mib:
        budget = int(mib * MIB)
        placements = {
            "one shared cache": ([LocalStore(budget)], one),
            f"{args.workers} per-worker caches, same total bytes": (
                [LocalStore(budget // args.workers) for _ in range(args.workers)], workers),
            f"{args.workers} per-worker caches, the budget each": (
                [LocalStore(budget) for _ in range(args.workers)], workers),
        }
        for series, (stores, assignment) in placements.items():
            rate = asyncio.run(_hit_rate(stream, assignment, keys, list(stores), value))
            results.append((series, mib, rate))
            print(f"{mib:>8g} MiB  {series:<48} hit rate {rate:.1%}", flush=True)
    return results


# --- ab: off against on, on a real stack ---------------------------------------------------------------------
async def _load(url: str, texts: list[str], stream: np.ndarray, clients: int) -> tuple[float, float]:
    """Texts per second and the p50 latency (s) of one single-text /embed call per item of `stream`."""
    from loadtest.http_client import Connection

    queue = iter(stream.tolist())
    latencies: list[float] = []
    connections = [Connection(url) for _ in range(clients)]
    await asyncio.gather(*(c.connect() for c in connections))

    async def worker(connection: Connection) -> None:
        for item in queue:
            sent = time.perf_counter()
            status, _, body = await connection.post("/embed", orjson.dumps({"inputs": [texts[item]]}))
            latencies.append(time.perf_counter() - sent)
            if status != 200:
                raise RuntimeError(f"HTTP {status}: {body[:200]!r}")

    start = time.perf_counter()
    try:
        await asyncio.gather(*(worker(c) for c in connections))
    finally:
        await asyncio.gather(*(c.close() for c in connections))
    return len(stream) / (time.perf_counter() - start), statistics.median(latencies)


def _lookups(url: str) -> tuple[float, float]:
    from loadtest.stack_metrics import metric_sums

    sums = metric_sums(url, {"hit": ("gateway_cache_lookups_total", {"result": "hit"}),
                             "miss": ("gateway_cache_lookups_total", {"result": "miss"})})
    return sums["hit"], sums["miss"]


def ab(args: argparse.Namespace) -> dict[str, dict[str, list[float]]]:
    from contextlib import ExitStack

    from devstack.gateway import GatewayProcess
    from devstack.tritonserver import TritonServer
    from loadtest.models import make_bert
    from loadtest.stack_metrics import wait_until_served
    from devstack.redis_server import RedisServer
    from tests.fixtures.repository import build_repository

    texts = distinct_texts(args.texts)
    order = np.random.default_rng(args.seed).permutation(len(texts))
    sides = {"off": {"cache": "off"}, args.cache: {"cache": args.cache}}
    results: dict[str, dict[str, list[float]]] = {
        side: {"texts/s": [], "p50 ms": [], "hit rate %": []} for side in sides}
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        root = Path(tmp)
        repository, served = args.repository, args.served
        if repository is None:
            repository, served = root / "repository", "bench"
            build_repository(repository, [{"model": str(make_bert(root / "bert", "embed", args.shape)),
                                           "task": "embed", "name": served}],
                             runtime="python", formats="onnx", device="cpu", max_seq_len=128, max_batch_size=64)
        server = stack.enter_context(TritonServer(repository=repository, log_path=root / "triton.log"))
        common = {"repository": str(repository), **({"workers": str(args.workers)} if args.workers else {})}
        if args.cache == "redis":
            redis = stack.enter_context(RedisServer(root / "redis.log", maxmemory=f"{args.redis_mib}mb"))
            sides[args.cache]["cache_redis_url"] = redis.url
        urls = {}
        for side, settings in sides.items():
            gateway = stack.enter_context(GatewayProcess(
                server.grpc_url, triton_http_url=server.http_address, log_path=root / f"{side}.log",
                settings={**common, **settings, "shm_prefix": f"cache{side}"}))
            if served == "bench":  # the name wait_until_served looks for (bench7's, gateway_ab.sh's)
                wait_until_served(gateway.url)
            urls[side] = gateway.url
        warmup = zipf_stream(min(args.calls, 2000), len(texts), args.zipf, args.seed + 100)
        for side in sides:  # connections, tokenizer, shapes; not the cache, which each round's stream warms
            asyncio.run(_load(urls[side], [f"warm-up {i}" for i in range(len(warmup))], np.arange(len(warmup)),
                              min(args.clients, 64)))
        for r in range(args.rounds):
            stream = order[zipf_stream(args.calls, len(texts), args.zipf, args.seed + r)]
            for side in (list(sides) if r % 2 == 0 else list(sides)[::-1]):
                before = _lookups(urls[side])
                per_s, p50 = asyncio.run(_load(urls[side], texts, stream, args.clients))
                hits, misses = (a - b for a, b in zip(_lookups(urls[side]), before))
                results[side]["texts/s"].append(per_s)
                results[side]["p50 ms"].append(p50 * 1e3)
                results[side]["hit rate %"].append(100 * hits / (hits + misses) if hits + misses else 0.0)
                print(f"round {r + 1} cache={side}: {per_s:.0f} texts/s, p50 {p50 * 1e3:.2f} ms, "
                      f"hit rate {results[side]['hit rate %'][-1]:.1f}%", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest result-cache", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    h = sub.add_parser("hit-rates", help="per-worker against shared caches on a simulated Zipf stream")
    h.add_argument("--requests", type=int, default=1_000_000)
    h.add_argument("--workers", type=int, default=12)
    h.add_argument("--budget-mib", type=lambda t: [float(x) for x in t.split(",")], default=[16.0, 64.0, 256.0])
    h.add_argument("--dim", type=int, default=768, help="floats per cached row")
    a = sub.add_parser("ab", help="cache off against on, side by side on one tritonserver")
    a.add_argument("--repository", type=Path, help="a built repository (default: build --shape's BERT here)")
    a.add_argument("--served", default="bench", help="the embedder's name in --repository")
    a.add_argument("--shape", default="small", help="loadtest.models shape when no --repository is given")
    a.add_argument("--cache", choices=["local", "redis"], default="local")
    a.add_argument("--redis-mib", type=int, default=1024, help="redis-server's maxmemory (--cache redis)")
    a.add_argument("--rounds", type=int, default=4)
    a.add_argument("--clients", type=int, default=256)
    a.add_argument("--calls", type=int, default=20_000, help="single-text calls per gateway per round")
    a.add_argument("--workers", type=int, default=0, help="gateway workers (0: its default, auto)")
    for p in (h, a):
        p.add_argument("--texts", type=int, default=100_000, help="distinct texts of the loadtest corpus")
        p.add_argument("--zipf", type=float, default=1.1, help="the Zipf exponent s")
        p.add_argument("--seed", type=int, default=53)
        p.add_argument("--name", default="result-cache", help="the run's name in the results table")
        p.add_argument("--out", type=Path, help="directory for results.json")
        add_table_argument(p)
    args = parser.parse_args(argv)
    machine = describe_machine()
    context = RunContext.of(machine, args.name, args.out or "")
    stream = f"zipf s={args.zipf:g} over {args.texts} texts"
    rows: list[ResultRow] = []
    record: dict[str, object]
    if args.mode == "hit-rates":
        found = hit_rates(args)
        load = f"simulated {stream}, {args.requests} requests, {args.dim}-dim rows"
        rows = [context.row("result-cache hit rate", series, load, f"hit rate at {mib:g} MiB", 100 * rate, "%")
                for series, mib, rate in found]
        record = {"hit_rates": [{"series": s, "budget_mib": m, "hit_rate": r} for s, m, r in found]}
    else:
        results = ab(args)
        load = f"single text c={args.clients}, {stream}"
        for side, measures in results.items():
            for metric, values in measures.items():
                unit = metric.split()[-1] if metric != "texts/s" else "texts/s"
                name = metric.removesuffix(" ms").removesuffix(" %")
                rows.append(context.row("result-cache", f"cache={side}", load,
                                        f"{name} (median of {args.rounds} rounds)", statistics.median(values), unit))
        record = {"results": results}
    record_rows(rows, args.table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(
            {**record, "args": {k: str(v) for k, v in vars(args).items()},
             "machine": machine.model_dump(mode="json")}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
