"""Benchmark of several outputs from one forward pass: `/encode` against one request per output, on one stack.

    python -m loadtest encode --repository DIR --model NAME [--texts 32] [--clients 16] [--seconds 15]
        [--rounds 2] [--name NAME] [--out DIR] [--table PATH|none]

Starts tritonserver on the repository (an embedder built with bge-m3's heads: `python -m loadtest random-model DIR
embed large --heads` is its shape) and the gateway with its shipped defaults (devstack). For each set of outputs
(dense + sparse + multi_vector, and dense + sparse), two arms run in turns, `--rounds` times, the order reversed
every other round, each for `--seconds` after a warm-up, with `--clients` closed-loop clients of `--texts`
corpus texts (loadtest/corpus.py):
- one: a client sends one `/encode` request naming the outputs;
- apart: a client sends one request per output at once (`/embed`, `/embed_sparse`, `/embed_multi_vector`), as a
  user of a server without /encode does, and its texts are done when every answer is in.
Texts/s of each arm (texts whose every output came back), the ratio one/apart per round, and Triton's executions of
the model step per 1,000 texts. Every answer's status is counted, warm-up included.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import orjson
import tritonclient.grpc as grpcclient

from devstack.tritonserver import TritonServer
from loadtest.corpus import CorpusSpec, make_corpus
from loadtest.http_client import Connection
from loadtest.local_stack import local_stack, publish
from loadtest.results_table import RUNS_DIR, add_table_argument, record_rows

ROUTES = {"dense": "/embed", "sparse": "/embed_sparse", "multi_vector": "/embed_multi_vector"}
OUTPUT_SETS = (("dense", "sparse", "multi_vector"), ("dense", "sparse"))


@dataclass
class Window:
    """What one arm measured in one window."""

    seconds: float = 0.0
    texts: int = 0  # texts whose every output came back 200
    executions: int = 0  # of the model step, from Triton's statistics
    statuses: Counter[int] = field(default_factory=Counter)

    @property
    def texts_per_s(self) -> float:
        return self.texts / self.seconds if self.seconds else 0.0


async def _post(connection: Connection, path: str, body: bytes, window: Window) -> bool:
    try:
        status, _, _ = await connection.post(path, body)
    except (ConnectionError, TimeoutError):
        status = 0
    window.statuses[status] += 1
    return status == 200


async def run_arm(url: str, model: str, texts: list[str], outputs: tuple[str, ...], one: bool, args: argparse.Namespace,
                  seconds: float) -> Window:
    """`--clients` closed-loop clients for `seconds`: /encode (`one`) or a request per output."""
    window = Window()
    until = time.monotonic() + seconds

    async def client(k: int) -> None:
        connections = [Connection(url, timeout_s=120) for _ in (outputs if not one else ("encode",))]
        i = k * args.texts
        try:
            while time.monotonic() < until:
                chunk = [texts[(i + j) % len(texts)] for j in range(args.texts)]
                i += args.texts * args.clients
                if one:
                    body = orjson.dumps({"model": model, "inputs": chunk, "outputs": list(outputs)})
                    done = await _post(connections[0], "/encode", body, window)
                else:
                    body = orjson.dumps({"model": model, "inputs": chunk})
                    answers = await asyncio.gather(*(_post(c, ROUTES[o], body, window)
                                                     for c, o in zip(connections, outputs)))
                    done = all(answers)
                if done:
                    window.texts += len(chunk)
        finally:
            for connection in connections:
                await connection.close()

    start = time.monotonic()
    await asyncio.gather(*(client(k) for k in range(args.clients)))
    window.seconds = time.monotonic() - start
    return window


def executions(grpc_url: str, step: str) -> int:
    stats = grpcclient.InferenceServerClient(grpc_url).get_inference_statistics(step, as_json=True)
    return sum(int(entry.get("execution_count", 0)) for entry in stats.get("model_stats", []))


def measure(triton: TritonServer, url: str, args: argparse.Namespace, texts: list[str]) -> tuple[list[str], list[tuple[str, float, str]], Counter[int]]:
    """Every output set's arms in turns: (summary lines, (metric, value, unit) rows, statuses of every window)."""
    step = f"{args.model}_onnx"
    lines, rows, statuses = [], [], Counter[int]()
    for outputs in OUTPUT_SETS:
        name = "+".join(outputs)
        ratios, totals = [], {True: Window(), False: Window()}
        for arm in (True, False):  # warm-up, counted
            statuses.update(asyncio.run(run_arm(url, args.model, texts, outputs, arm, args, args.warmup)).statuses)
        for round_ in range(args.rounds):
            got = {}
            for arm in ((True, False) if round_ % 2 == 0 else (False, True)):
                before = executions(triton.grpc_url, step)
                window = asyncio.run(run_arm(url, args.model, texts, outputs, arm, args, args.seconds))
                window.executions = executions(triton.grpc_url, step) - before
                statuses.update(window.statuses)
                got[arm] = window
                total = totals[arm]
                total.seconds += window.seconds
                total.texts += window.texts
                total.executions += window.executions
            ratios.append(got[True].texts_per_s / got[False].texts_per_s if got[False].texts_per_s else float("nan"))
            lines.append(f"| {name} | {round_ + 1} | {got[True].texts_per_s:,.0f} | {got[False].texts_per_s:,.0f} | "
                         f"{ratios[-1]:.2f}x |")
        one, apart = totals[True], totals[False]
        per_k = {arm: 1000 * w.executions / w.texts if w.texts else float("nan") for arm, w in totals.items()}
        lines.append(f"| {name} | all | {one.texts_per_s:,.0f} | {apart.texts_per_s:,.0f} | "
                     f"{one.texts_per_s / apart.texts_per_s if apart.texts_per_s else float('nan'):.2f}x "
                     f"(executions per 1,000 texts: {per_k[True]:.1f} / {per_k[False]:.1f}) |")
        rows += [(f"{name}: one /encode texts/s", one.texts_per_s, "texts/s"),
                 (f"{name}: a request per output texts/s", apart.texts_per_s, "texts/s"),
                 (f"{name}: one / apart", one.texts_per_s / apart.texts_per_s if apart.texts_per_s else float("nan"), "x"),
                 (f"{name}: executions per 1,000 texts, one", per_k[True], "count"),
                 (f"{name}: executions per 1,000 texts, apart", per_k[False], "count")]
    return lines, rows, statuses


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m loadtest encode", description=__doc__.split("\n\n")[0])
    p.add_argument("--repository", type=Path, required=True)
    p.add_argument("--model", required=True, help="the served embedder's NAME (built with bge-m3's heads)")
    p.add_argument("--texts", type=int, default=32, help="texts per request")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seconds", type=float, default=15.0)
    p.add_argument("--warmup", type=float, default=5.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--name", default="encode")
    p.add_argument("--out", type=Path, default=None)
    add_table_argument(p)
    args = p.parse_args(argv)
    texts = make_corpus(CorpusSpec(size=4000))
    out = args.out or RUNS_DIR / args.name
    out.mkdir(parents=True, exist_ok=True)
    with local_stack(args.repository) as (triton, gw):
        lines, rows, statuses = measure(triton, gw.url, args, texts)
    context = publish(out, args.name, [
        f"# {args.name}: several outputs of one forward pass (/encode) against a request per output", "",
        f"{args.clients} closed-loop clients x {args.texts} corpus texts per request; {args.seconds:g} s per window, "
        f"arms in turns, {args.rounds} rounds", "",
        "| outputs | round | one /encode texts/s | a request per output texts/s | one / apart |",
        "| --- | ---: | ---: | ---: | --- |", *lines, "",
        f"statuses of every request, warm-up included: {dict(statuses)}"])
    load = f"{args.texts} texts c={args.clients}"
    errors = sum(n for status, n in statuses.items() if status != 200)
    record_rows([context.row("encode", "stack scheduler", load, m, v, u) for m, v, u in rows]
                + [context.row("encode", "stack scheduler", load, "errors, warm-up included", float(errors), "count")],
                args.table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
