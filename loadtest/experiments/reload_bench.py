"""The reload gap (issue 11): what clients see while a rebuilt model replaces the served one.

Builds loadtest/models.py's `small` BERT embedder (seed 1) with --runtime python --device cpu into a
fresh repository, starts the local stack (CPU tritonserver in explicit model control, as compose
runs it, and the gateway as a process with an admin key), and sends `--clients` concurrent
`/embed` requests of 1-4 texts in a loop. Meanwhile it builds version 2 of the model (seed 2: other
weights, same tokenizer), waits `--settle` seconds, calls `POST /admin/models/NAME/reload`, and
keeps the load for `--after` seconds more (load starts `--settle` seconds before the build). Reported: failed requests, and latency percentiles of the
requests sent before the reload, while it ran (call to answer) and after it; every answer is checked
to be the old or the new model's vector for its text (known from single-text calls before and after).

    python -m loadtest.experiments.reload_bench --out loadtest/results/local-2core-11-reload
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import random
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from devstack.stack import LocalStack
from loadtest.models import make_bert
from tests.fixtures.repository import PYTHON_CPU, build_repository

NAME = "small"
TEXTS = [f"request {i}: " + "the movie was good and the story was long " * (1 + i % 5) for i in range(16)]
KEY = "bench-admin-key"


def _build(repository: Path, checkpoint: Path) -> None:
    build_repository(repository, [{"model": str(checkpoint), "task": "embed", "name": NAME}], **PYTHON_CPU)


async def _vectors(client: httpx.AsyncClient) -> np.ndarray:
    rows = []
    for text in TEXTS:
        r = await client.post("/embed", json={"model": NAME, "inputs": [text], "normalize": False})
        r.raise_for_status()
        rows.append(r.json()["embeddings"][0])
    return np.array(rows, dtype=np.float32)


def _percentiles(ms: list[float]) -> dict[str, float]:
    if not ms:
        return {"n": 0}
    q = np.percentile(ms, [50, 90, 99])
    return {"n": len(ms), "p50_ms": float(q[0]), "p90_ms": float(q[1]), "p99_ms": float(q[2]), "max_ms": max(ms)}


async def run(url: str, rebuild: Any, clients: int, settle: float, after: float) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        old = await _vectors(client)
        records: list[tuple[float, float, list[int], Any]] = []  # (sent, answered, texts, rows or error)
        stop = asyncio.Event()

        async def one_client(seed: int) -> None:
            rng = random.Random(seed)
            while not stop.is_set():
                picked = rng.sample(range(len(TEXTS)), rng.randint(1, 4))
                sent = time.monotonic()
                try:
                    r = await client.post("/embed", json={"model": NAME, "inputs": [TEXTS[i] for i in picked],
                                                          "normalize": False})
                    rows: Any = np.array(r.json()["embeddings"], dtype=np.float32) if r.status_code == 200 else \
                        f"{r.status_code} {r.text[:200]}"
                except httpx.HTTPError as exc:
                    rows = f"{type(exc).__name__}: {exc}"
                records.append((sent, time.monotonic(), picked, rows))

        tasks = [asyncio.create_task(one_client(i)) for i in range(clients)]
        await asyncio.sleep(settle)
        build_started = time.monotonic()
        await asyncio.to_thread(rebuild)
        build_s = time.monotonic() - build_started
        await asyncio.sleep(settle)
        reload_started = time.monotonic()
        r = await client.post(f"/admin/models/{NAME}/reload", headers={"Authorization": f"Bearer {KEY}"})
        reload_ended = time.monotonic()
        r.raise_for_status()
        await asyncio.sleep(after)
        stop.set()
        await asyncio.gather(*tasks)
        new = await _vectors(client)

    failed = [rows for *_, rows in records if isinstance(rows, str)]
    mixed = 0
    kinds = {"old": 0, "new": 0}
    for _, _, picked, rows in records:
        if isinstance(rows, str):
            continue
        for i, row in zip(picked, rows):
            if np.allclose(row, new[i], rtol=1e-4, atol=1e-5):
                kinds["new"] += 1
            elif np.allclose(row, old[i], rtol=1e-4, atol=1e-5):
                kinds["old"] += 1
            else:
                mixed += 1
    windows: dict[str, list[float]] = {"baseline": [], "while the builder runs": [], "between build and reload": [],
                                       "during the reload": [], "after the reload": []}
    for sent, answered, _, rows in records:
        if isinstance(rows, str):
            continue
        ms = (answered - sent) * 1000
        if answered < build_started:
            windows["baseline"].append(ms)
        elif answered < build_started + build_s:
            windows["while the builder runs"].append(ms)
        elif answered < reload_started:
            windows["between build and reload"].append(ms)
        elif sent > reload_ended:
            windows["after the reload"].append(ms)
        else:
            windows["during the reload"].append(ms)
    return {"requests": len(records), "failed": len(failed), "failures": failed[:5], "neither_old_nor_new": mixed,
            "texts_answered": kinds, "reload_s": reload_ended - reload_started, "build_s": build_s,
            "old_differs_from_new": bool(not np.allclose(old, new, atol=1e-3)),
            "latency": {k: _percentiles(v) for k, v in windows.items()}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtest.experiments.reload_bench",
                                     description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--settle", type=float, default=2.0, help="seconds of load between the build and the reload")
    parser.add_argument("--after", type=float, default=5.0, help="seconds of load after the reload")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="reload_bench_") as tmp:
        root = Path(tmp)
        repository = root / "model_repository" / "models"
        repository.parent.mkdir()
        _build(repository, make_bert(root / "v1", "embed", NAME, seed=1))
        v2 = make_bert(root / "v2", "embed", NAME, seed=2)
        settings = {"admin_keys": KEY, "refresh_interval_s": "2"}
        with LocalStack(repository, gateway_settings=settings, log_dir=root / "logs") as stack:
            assert stack.gateway is not None
            result = asyncio.run(run(stack.gateway.url, lambda: _build(repository, v2), args.clients, args.settle,
                                     args.after))
    result["settings"] = {"clients": args.clients, "model": f"loadtest.models {NAME} embed (python runtime, cpu)",
                          "machine": f"{platform.node()} {platform.machine()}, {platform.python_version()}",
                          "versions": {p: version(p) for p in ("tritonclient", "onnxruntime", "tokenizers")},
                          "date": time.strftime("%Y-%m-%d")}
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
