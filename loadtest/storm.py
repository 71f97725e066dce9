"""Overload storm: measure a gateway's capacity, then hit it with far more concurrent clients than it
can serve, and check what a serving stack is judged on in its worst minute.

1. Capacity: `capacity_clients` clients send single-text /embed requests back to back for
   `capacity_s` seconds; correct answers per second is the capacity.
2. Storm: `storm_clients` clients do the same for `storm_s` seconds. A refused client (429/503)
   either waits what Retry-After says (`retry="honour"`, as the OpenAI client does) or sends its
   next request at once (`retry="ignore"`, a naive retry loop). Goodput = correct answers per
   second during the storm.
3. Recovery: from the storm's end, one probe request every 50 ms until one is answered correctly.

Every 200 answer is compared with Triton's own answer for the caller's own text (`reference`):
an answer closer to another text's vector than to its own counts as cross-talk.

The clients run in one child process, in one of two shapes:
- `lean` (the default): raw HTTP/1.1 keep-alive over asyncio streams, one connection each, at a lower CPU priority
  (nice 10): on a machine shared with the stack they stand in for clients on other machines;
- `pooled`: one `httpx.AsyncClient` whose pool of 256 connections all clients share, as a user's own asyncio load
  test is written. Its clients cost far more CPU per request, so on a shared machine they take CPU from the stack:
  run it at the stack's priority (`--nice 0`) and niced (`--nice 19`), with long texts (`--words 200-450`).
`python -m loadtest storm --help`: against a running stack, or `--compare` code checkouts on a
local stack built here (loadtest/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import httpx
import numpy as np
import orjson

from loadtest.http_client import Connection
from loadtest.results_table import (
    RUNS_DIR,
    ResultRow,
    RunContext,
    add_table_argument,
    record_rows,
)

Retry = Literal["honour", "ignore"]
ClientShape = Literal["lean", "pooled"]
Answer = tuple[int, float | None, bytes]  # status, Retry-After, body
POOL_CONNECTIONS = 256


@dataclass
class Phase:
    """What one phase saw."""

    seconds: float = 0.0
    correct: int = 0
    wrong: int = 0  # 200 with a vector that is not Triton's answer for the caller's text
    statuses: Counter[int] = field(default_factory=Counter)
    latencies: list[float] = field(default_factory=list)  # of correct answers

    @property
    def goodput(self) -> float:
        return self.correct / self.seconds if self.seconds else 0.0

    @property
    def answered(self) -> int:
        return sum(n for status, n in self.statuses.items() if status)

    def summary(self) -> dict[str, object]:
        lat = np.array(self.latencies) if self.latencies else np.zeros(1)
        return {
            "seconds": round(self.seconds, 2), "correct": self.correct, "wrong": self.wrong,
            "goodput_per_s": round(self.goodput, 1), "statuses": dict(sorted(self.statuses.items())),
            "p50_ms": round(float(np.percentile(lat, 50)) * 1000, 1),
            "p99_ms": round(float(np.percentile(lat, 99)) * 1000, 1),
        }


@dataclass
class StormReport:
    capacity: Phase
    storm: Phase
    recovery_s: float

    @property
    def goodput_ratio(self) -> float:
        return self.storm.goodput / self.capacity.goodput if self.capacity.goodput else 0.0

    @property
    def abandoned_share(self) -> float:
        """504s (admitted, then out of time) among the storm's answers."""
        return self.storm.statuses[504] / self.storm.answered if self.storm.answered else 0.0

    def summary(self) -> dict[str, object]:
        return {"capacity": self.capacity.summary(), "storm": self.storm.summary(),
                "goodput_ratio": round(self.goodput_ratio, 3), "abandoned_share": round(self.abandoned_share, 4),
                "recovery_s": round(self.recovery_s, 2)}


@dataclass(frozen=True)
class ClientsShape:
    """How a storm's clients are written and what they send."""

    client: ClientShape
    words: tuple[int, int]  # each text's words, drawn uniformly
    nice: int  # the client process's CPU priority
    capacity_clients: int  # clients of the capacity phase


SHAPES: dict[str, ClientsShape] = {
    "lean": ClientsShape("lean", (24, 24), 10, 32),  # short texts, lean clients out of the stack's way
    "lean-normal": ClientsShape("lean", (24, 24), 0, 32),  # the same at the stack's priority
    "pooled": ClientsShape("pooled", (200, 450), 0, 8),  # a user's asyncio load test of long texts
    "pooled-niced": ClientsShape("pooled", (200, 450), 19, 8),  # the same, the stack first on the CPU
}


@dataclass(frozen=True)
class StormSettings:
    model: str
    capacity_clients: int = 32  # enough to fill batches: the throughput the stack can sustain
    capacity_s: float = 4.0
    storm_clients: int = 192
    storm_s: float = 8.0
    retry: Retry = "honour"
    recovery_limit_s: float = 30.0
    client_nice: int = 10  # CPU priority of the client process (0: the same as the stack)
    client: ClientShape = "lean"
    seed: int = 0


class Checker:
    """Is an answer Triton's own for the caller's text?"""

    def __init__(self, reference: dict[str, np.ndarray]) -> None:
        self.texts = list(reference)
        self.index = {t: i for i, t in enumerate(self.texts)}
        self.matrix = np.stack([reference[t] for t in self.texts])

    def __call__(self, text: str, vector: np.ndarray) -> bool:
        distances = np.linalg.norm(self.matrix - vector, axis=1)
        own = self.index[text]
        return bool(int(distances.argmin()) == own and np.allclose(vector, self.matrix[own], rtol=1e-3, atol=1e-4))


def _embedding(data: bytes) -> np.ndarray:
    return np.asarray(orjson.loads(data)["embeddings"][0], dtype=np.float32)


class PooledPoster:
    """POSTs through one httpx client (a pool of POOL_CONNECTIONS connections), as `Connection.post` answers."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def post(self, path: str, body: bytes) -> Answer:
        try:
            answer = await self.client.post(path, content=body, headers={"content-type": "application/json"})
        except httpx.HTTPError as error:
            raise ConnectionError(str(error)) from error
        retry_after = answer.headers.get("retry-after")
        return answer.status_code, float(retry_after) if retry_after else None, answer.content


async def _requests(connection: Connection | PooledPoster, s: StormSettings, check: Checker, phase: Phase,
                    until: float, rng: random.Random) -> None:
    while time.monotonic() < until:
        text = rng.choice(check.texts)
        body = orjson.dumps({"model": s.model, "inputs": text, "normalize": False})
        start = time.monotonic()
        try:
            status, retry_after, data = await connection.post("/embed", body)
        except ConnectionError:
            phase.statuses[0] += 1
            await asyncio.sleep(0.1)
            continue
        phase.statuses[status] += 1
        if status == 200:
            if check(text, _embedding(data)):
                phase.correct += 1
                phase.latencies.append(time.monotonic() - start)
            else:
                phase.wrong += 1
        elif status in (429, 503) and s.retry == "honour":
            await asyncio.sleep(retry_after if retry_after is not None else 1.0)


async def _phase(base_url: str, s: StormSettings, clients: int, seconds: float, check: Checker, seed: int) -> Phase:
    phase = Phase()
    if s.client == "pooled":
        limits = httpx.Limits(max_connections=POOL_CONNECTIONS, max_keepalive_connections=POOL_CONNECTIONS)
        async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=60) as client:
            poster = PooledPoster(client)
            until = time.monotonic() + seconds
            await asyncio.gather(*(_requests(poster, s, check, phase, until, random.Random(seed * 1000 + i))
                                   for i in range(clients)))
    else:
        connections = [Connection(base_url) for _ in range(clients)]
        await asyncio.gather(*(c.connect() for c in connections))  # before the clock starts
        until = time.monotonic() + seconds
        try:
            await asyncio.gather(*(
                _requests(conn, s, check, phase, until, random.Random(seed * 1000 + i))
                for i, conn in enumerate(connections)
            ))
        finally:
            await asyncio.gather(*(c.close() for c in connections))
    phase.seconds = seconds  # answers that arrive after `until` (the last in-flight ones) still count
    return phase


async def _recovery(base_url: str, s: StormSettings, check: Checker, since: float) -> float:
    text = check.texts[0]
    connection = Connection(base_url)
    body = orjson.dumps({"model": s.model, "inputs": text, "normalize": False})
    try:
        while time.monotonic() - since < s.recovery_limit_s:
            try:
                status, _, data = await connection.post("/embed", body)
                if status == 200 and check(text, _embedding(data)):
                    return time.monotonic() - since
            except ConnectionError:
                pass
            await asyncio.sleep(0.05)
    finally:
        await connection.close()
    return float("inf")


async def _storm(base_url: str, reference: dict[str, np.ndarray], s: StormSettings) -> StormReport:
    check = Checker(reference)
    capacity = await _phase(base_url, s, s.capacity_clients, s.capacity_s, check, s.seed)
    storm_task = asyncio.create_task(_phase(base_url, s, s.storm_clients, s.storm_s, check, s.seed + 1))
    await asyncio.sleep(s.storm_s)
    ended = time.monotonic()  # no new requests from here; the probe starts at once, behind what is in flight
    recovery_s = await _recovery(base_url, s, check, ended)
    storm = await storm_task
    return StormReport(capacity, storm, recovery_s)


def _client_process(base_url: str, reference: dict[str, np.ndarray], s: StormSettings, out: mp.Queue) -> None:
    if s.client_nice:
        os.nice(s.client_nice)
    out.put(asyncio.run(_storm(base_url, reference, s)))


def run_storm_sync(base_url: str, reference: dict[str, np.ndarray], s: StormSettings,
                   log: Callable[[str], None] = lambda _: None) -> StormReport:
    """Capacity, storm and recovery against the gateway at `base_url`, the clients in a child process."""
    context = mp.get_context("spawn")
    queue: mp.Queue = context.Queue()
    child = context.Process(target=_client_process, args=(base_url, reference, s, queue), daemon=True)
    child.start()
    try:
        report: StormReport = queue.get(timeout=s.capacity_s + s.storm_s + s.recovery_limit_s + 120)
    finally:
        child.join(timeout=30)
        if child.is_alive():
            child.kill()
    log(f"capacity: {report.capacity.summary()}")
    log(f"storm ({s.retry} Retry-After): {report.storm.summary()}; recovery {report.recovery_s:.2f}s")
    return report


async def run_storm(base_url: str, reference: dict[str, np.ndarray], s: StormSettings,
                    log: Callable[[str], None] = lambda _: None) -> StormReport:
    """`run_storm_sync` from a running event loop."""
    return await asyncio.to_thread(run_storm_sync, base_url, reference, s, log)


def triton_embedding(triton: object, ensemble: str, text: str) -> np.ndarray:
    """Triton's own answer for `text` from the ensemble (one text per call: no batching effects)."""
    import tritonclient.grpc as grpcclient

    from contract import TEXT, output_name

    inp = grpcclient.InferInput(TEXT, [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[text.encode()]], dtype=np.object_))
    name = output_name("embed")
    result = triton.infer(ensemble, [inp], outputs=[grpcclient.InferRequestedOutput(name)])  # type: ignore[attr-defined]
    return np.asarray(result.as_numpy(name)[0], dtype=np.float32)


def references(triton_url: str, model: str, texts: list[str]) -> dict[str, np.ndarray]:
    import tritonclient.grpc as grpcclient

    triton = grpcclient.InferenceServerClient(triton_url)
    return {t: triton_embedding(triton, f"{model}_onnx_ensemble", t) for t in texts}


def compare(args: argparse.Namespace) -> None:
    """Build the storm model here, start one Triton, and storm a gateway from each code checkout
    (`label=path`), each pipeline, clients' shape and retry mode in turn, the checkouts side by side; the run's
    folder is loadtest/results/runs/<name>/."""
    import tempfile

    from devstack.gateway import GatewayProcess
    from devstack.tritonserver import TritonServer
    from loadtest.machine import describe_machine
    from loadtest.models import make_bert
    from tests.fixtures.repository import PYTHON_CPU, build_repository

    work = Path(tempfile.mkdtemp(prefix="storm-"))
    source = make_bert(work / "source", "embed", args.shape)
    repository = work / "model_repository"
    build_repository(repository, [{"model": str(source), "task": "embed", "name": args.model}], **PYTHON_CPU,
                     max_seq_len=128, max_batch_size=32)
    roots = dict(item.split("=", 1) for item in args.compare.split(","))
    rows = []
    with TritonServer(repository=repository, log_path=work / "tritonserver.log") as triton:
        for shape_name in args.shapes.split(","):
            shape = SHAPES[shape_name]
            words = _words(args.words) if args.words else shape.words
            reference = references(triton.grpc_url, args.model, corpus(words, args.texts))
            for pipeline in args.pipelines.split(","):
                for retry in args.retry.split(","):
                    for label, root in roots.items():
                        s = settings_of(args, shape, retry)
                        gateway = {"repository": str(repository), "pipeline": pipeline, "request_timeout_s": "3",
                                   "triton_timeout_s": "2", "shm_pool_size": "4"}
                        with GatewayProcess(triton_url=triton.grpc_url, triton_http_url=triton.http_address,
                                            settings=gateway, code_root=Path(root),
                                            log_path=work / f"gateway-{label}-{pipeline}-{shape_name}-{retry}.log"
                                            ) as gw:
                            report = run_storm_sync(gw.url, reference, s, log=print)
                        rows.append({"code": label, "pipeline": pipeline, "shape": shape_name, "retry": retry,
                                     "load": load_of(s, words), **report.summary()})
                        print(json.dumps(rows[-1]), flush=True)
    out = Path(args.out or RUNS_DIR) / args.name
    out.mkdir(parents=True, exist_ok=True)
    machine = describe_machine()
    (out / "results.json").write_text(json.dumps({"machine": machine.model_dump(), "settings": vars(args),
                                                  "rows": rows}, indent=1, default=str))
    header = ("| code | pipeline | clients | retry | capacity/s | storm goodput/s | ratio | 504 share | recovery s | "
              "cross-talk | statuses |")
    lines = [header, "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['code']} | {r['pipeline']} | {r['shape']} | {r['retry']} | "
                     f"{r['capacity']['goodput_per_s']} | {r['storm']['goodput_per_s']} | {r['goodput_ratio']} | "
                     f"{r['abandoned_share']} | {r['recovery_s']} | {r['storm']['wrong']} | {r['storm']['statuses']} |")
    (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    context = RunContext.of(machine, args.name, out)
    record_rows([row for r in rows for row in table_rows(
        replace(context, commit=checkout_commit(Path(roots[r["code"]])) or context.commit),
        f"{r['code']} {r['pipeline']} {r['shape']} retry={r['retry']}", r["load"], r)], args.table)


def _words(text: str) -> tuple[int, int]:
    """`24` or `200-450`."""
    low, _, high = text.partition("-")
    return int(low), int(high or low)


def corpus(words: tuple[int, int], size: int) -> list[str]:
    from loadtest.corpus import fixed_length_corpus

    return fixed_length_corpus(words, size=size)


def settings_of(args: argparse.Namespace, shape: ClientsShape, retry: str) -> StormSettings:
    nice = shape.nice if args.nice is None else args.nice
    return StormSettings(model=args.model, storm_clients=args.clients, storm_s=args.seconds, retry=retry,  # type: ignore[arg-type]
                         client=shape.client, client_nice=nice, capacity_clients=shape.capacity_clients)


def load_of(s: StormSettings, words: tuple[int, int]) -> str:
    length = f"{words[0]}" if words[0] == words[1] else f"{words[0]}-{words[1]}"
    return f"{s.storm_clients} {s.client} clients nice {s.client_nice}, {length} words"


def checkout_commit(root: Path) -> str | None:
    """The commit a code checkout is at (None for a copy without git)."""
    import subprocess

    done = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        return None
    return done.stdout.strip() or None


def table_rows(context: RunContext, series: str, load: str, summary: dict[str, Any]) -> list[ResultRow]:
    """The results table's rows of one storm: goodput during it against capacity, wrong answers, recovery."""
    storm = summary["storm"]
    return [context.row("storm", series, load, "goodput storm/capacity", summary["goodput_ratio"], "x"),
            context.row("storm", series, load, "storm goodput", storm["goodput_per_s"], "texts/s"),
            context.row("storm", series, load, "504 share", summary["abandoned_share"], "x"),
            context.row("storm", series, load, "wrong answers", storm["wrong"], "count"),
            context.row("storm", series, load, "recovery", summary["recovery_s"], "s")]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtest storm", description=__doc__.splitlines()[0])
    parser.add_argument("--gateway", default="http://127.0.0.1:8080")
    parser.add_argument("--triton", default="127.0.0.1:8001", help="Triton gRPC, for the reference answers")
    parser.add_argument("--model", default="stormemb",
                        help="served embed model NAME (its NAME_onnx_ensemble is the reference)")
    parser.add_argument("--clients", type=int, default=192)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--retry", default="honour", help="honour, ignore, or both: honour,ignore")
    parser.add_argument("--shapes", default="lean", help=f"the clients' shapes, of {', '.join(SHAPES)}: "
                        "lean (short texts, raw connections, nice 10), lean-normal (the same at nice 0), pooled (one "
                        "httpx pool, 200-450 words, nice 0), pooled-niced (the same at nice 19)")
    parser.add_argument("--texts", type=int, default=128)
    parser.add_argument("--words", default="", help="words per text, N or MIN-MAX (default: the shape's)")
    parser.add_argument("--nice", type=int, default=None, help="the client process's nice (default: the shape's)")
    parser.add_argument("--compare", default="", help="label=checkout,...: build a local stack and storm a gateway "
                        "run from each checkout (e.g. before=/tmp/old,after=.)")
    parser.add_argument("--pipelines", default="scheduler,ensemble", help="with --compare")
    parser.add_argument("--shape", default="medium", help="with --compare: loadtest.models shape of the model")
    parser.add_argument("--name", default="storm", help="the run's name (with --compare: its results folder)")
    parser.add_argument("--out", default="", help="with --compare: results root (default loadtest/results/runs)")
    add_table_argument(parser)
    args = parser.parse_args(argv)
    if args.compare:
        compare(args)
        return
    from loadtest.machine import describe_machine

    context = RunContext.of(describe_machine(), args.name, args.gateway)
    for shape_name in args.shapes.split(","):
        shape = SHAPES[shape_name]
        words = _words(args.words) if args.words else shape.words
        reference = references(args.triton, args.model, corpus(words, args.texts))
        for retry in args.retry.split(","):
            settings = settings_of(args, shape, retry)
            report = run_storm_sync(args.gateway, reference, settings, log=print)
            print(json.dumps({"settings": asdict(settings), **report.summary()}, indent=2))
            record_rows(table_rows(context, f"{args.gateway} {shape_name} retry={retry}", load_of(settings, words),
                                   report.summary()), args.table)


if __name__ == "__main__":
    main()
