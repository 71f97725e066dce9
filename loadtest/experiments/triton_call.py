"""The gateway's Triton client of this checkout against an older one's, side by side on one tritonserver: what one
call to a model step costs the gateway, alone and under concurrency.

    python -m loadtest.experiments.triton_call --before REV|FILE [--rounds 6] [--calls 500] [--concurrency 1,32]
        [--warmup 200] [--out FILE]

`old` is gateway/triton/client.py as it was at REV (read with `git show`; or a copy of it, FILE, where the checkout
has no history), loaded beside this checkout's modules;
`new` is this checkout's. Each has its own system shm pool, one region per concurrent call, and calls
`infer_step` as the scheduler does. The model is a packed step's interface served by a python-backend model that
computes nothing (loadtest/echo_step), so what is timed is the client, gRPC, Triton and the python backend's round
trip. Each round runs both at every concurrency in turn (order alternating); printed: medians of each, and the
median of the per-round new/old ratios, of the median latency, calls/s, and the client process's CPU per call
(user + system, gRPC's threads included).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np

from contract import CU_SEQLENS, INPUT_IDS, TOKEN_TYPE_IDS
from devstack.tritonserver import TritonServer
from loadtest.machine import describe_machine

WIDTH = 384
CONFIG = f"""
name: "echo"
backend: "python"
max_batch_size: 0
input [ {{ name: "{INPUT_IDS}" data_type: TYPE_INT32 dims: [1, -1] }},
        {{ name: "{TOKEN_TYPE_IDS}" data_type: TYPE_INT32 dims: [1, -1] }},
        {{ name: "{CU_SEQLENS}" data_type: TYPE_INT32 dims: [1, -1] }} ]
output [ {{ name: "embeddings" data_type: TYPE_FP32 dims: [-1, {WIDTH}] }} ]
instance_group [ {{ kind: KIND_CPU count: 4 }} ]
"""
Call = Callable[[], Awaitable[object]]


async def _run(call: Call, calls: int, concurrency: int) -> dict[str, float]:
    """`calls` calls from `concurrency` tasks: median latency (ms), calls/s, client CPU per call (us)."""
    latencies: list[float] = []
    left = calls

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            start = time.perf_counter()
            await call()
            latencies.append(time.perf_counter() - start)

    cpu, wall = time.process_time(), time.perf_counter()  # user + system, all threads
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"p50_ms": 1e3 * statistics.median(latencies), "calls_per_s": len(latencies) / wall,
            "cpu_us_per_call": 1e6 * cpu / len(latencies)}


def client_at(revision: str) -> object:
    """gateway/triton/client.py as it was at `revision` (or the file at that path), as a module beside this
    checkout's gateway package."""
    root = Path(__file__).parents[2]
    if Path(revision).is_file():
        source = Path(revision).read_text()
    else:
        source = subprocess.run(["git", "show", f"{revision}:gateway/triton/client.py"], cwd=root,
                                capture_output=True, text=True, check=True).stdout
    spec = importlib.util.spec_from_loader("gateway.triton.client_before", loader=None)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    exec(compile(source, f"{revision}:gateway/triton/client.py", "exec"), module.__dict__)
    return module


async def measure(url: str, before: str, rounds: int, calls: int, levels: list[int], warmup: int = 200
                  ) -> dict[str, object]:
    from gateway.settings import GatewaySettings
    from gateway.triton import client as current

    old_module = client_at(before)
    ids = np.arange(100, 111, dtype=np.int32)[None]
    tensors = {INPUT_IDS: ids, TOKEN_TYPE_IDS: np.zeros_like(ids), CU_SEQLENS: np.array([[0, ids.size]], np.int32)}
    sizes = {INPUT_IDS: 2048, TOKEN_TYPE_IDS: 2048, CU_SEQLENS: 64, "embeddings": 4 * WIDTH}
    ways: dict[str, Call] = {}
    clients = []
    for name, module in (("old", old_module), ("new", current)):
        client = module.TritonClient(GatewaySettings(triton_url=url, shm="system", shm_prefix=f"tcall{name}"))  # type: ignore[attr-defined]
        await client.ensure_pool("echo", sizes, max(levels))
        output = module.Output("embeddings", WIDTH, "echo")  # type: ignore[attr-defined]
        clients.append(client)

        def call(client: object = client, output: object = output) -> Awaitable[object]:
            return client.infer_step("echo", tensors, (1, WIDTH), output, time.monotonic() + 10)  # type: ignore[attr-defined]

        ways[name] = call
    for call in ways.values():  # warm-up, not kept
        await _run(call, warmup, max(levels))
    rows: list[dict[str, object]] = []
    names = list(ways)
    for r in range(rounds):
        order = names[r % 2:] + names[: r % 2]
        for level in levels:
            for name in order:
                rows.append({"round": r + 1, "way": name, "concurrency": level, **await _run(ways[name], calls, level)})
    for client in clients:
        await client.close()  # type: ignore[attr-defined]
    return {"rows": rows}


def summarize(rows: list[dict[str, object]]) -> list[str]:
    """Per concurrency: medians over rounds of each way, and of the per-round new/old ratios."""
    lines = ["| concurrency | measure | old | new | new/old (median of rounds) |", "| --- | --- | ---: | ---: | ---: |"]
    for level in sorted({int(row["concurrency"]) for row in rows}):  # type: ignore[call-overload]
        at = [row for row in rows if row["concurrency"] == level]
        for key in ("p50_ms", "calls_per_s", "cpu_us_per_call"):
            by = {w: {row["round"]: float(row[key]) for row in at if row["way"] == w} for w in ("old", "new")}  # type: ignore[arg-type]
            ratio = statistics.median(by["new"][r] / by["old"][r] for r in by["old"])
            lines.append(f"| {level} | {key} | {statistics.median(by['old'].values()):.3f} | "
                         f"{statistics.median(by['new'].values()):.3f} | {ratio:.3f} |")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtest.experiments.triton_call", description=__doc__.split("\n")[0])
    parser.add_argument("--before", required=True, help="git revision of the `old` client, or a copy of its client.py")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--concurrency", default="1,32", help="comma-separated concurrency levels")
    parser.add_argument("--warmup", type=int, default=200, help="calls of each client before the rounds, not kept")
    parser.add_argument("--out", type=Path, help="JSON file for the machine, settings and every round")
    args = parser.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    echo = (Path(__file__).parents[1] / "echo_step" / "model.py").read_text()
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp)
        (repo / "echo" / "1").mkdir(parents=True)
        (repo / "echo" / "config.pbtxt").write_text(CONFIG)
        (repo / "echo" / "1" / "model.py").write_text(echo)
        server = TritonServer(repo)
        server.start()
        try:
            result = asyncio.run(measure(server.grpc_url, args.before, args.rounds, args.calls, levels, args.warmup))
        finally:
            server.stop(kill=True)  # nothing to drain: the measurement is over
    lines = summarize(result["rows"])  # type: ignore[arg-type]
    print("\n".join(lines))
    if args.out:
        args.out.write_text(json.dumps({"machine": describe_machine().model_dump(mode="json"),
                                        "settings": vars(args) | {"out": str(args.out)}, **result,
                                        "summary": lines}, indent=1))


if __name__ == "__main__":
    main()
