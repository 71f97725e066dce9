"""Overload storm: measure a gateway's capacity, then hit it with far more concurrent clients than it
can serve, and check what a serving stack is judged on in its worst minute.

1. Capacity: `capacity_clients` clients send single-text /embed requests back to back for
   `capacity_s` seconds; correct answers per second is the capacity.
2. Storm: `storm_clients` clients do the same for `storm_s` seconds. A client that is refused
   (429/503) waits what Retry-After says, as the OpenAI and most HTTP clients do.
   Goodput = correct answers per second during the storm.
3. Recovery: from the storm's end, one probe request every 50 ms until one is answered correctly.

Every 200 answer is compared with Triton's own answer for the caller's own text (`reference`):
an answer closer to another text's vector than to its own counts as cross-talk.
`python -m loadtest.storm --help` runs it against a running stack (see loadtest/README.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import httpx
import numpy as np


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

    def summary(self) -> dict[str, object]:
        return {"capacity": self.capacity.summary(), "storm": self.storm.summary(),
                "goodput_ratio": round(self.goodput_ratio, 3), "recovery_s": round(self.recovery_s, 2)}


@dataclass(frozen=True)
class StormSettings:
    model: str
    capacity_clients: int = 32  # enough to fill batches: the throughput the stack can sustain
    capacity_s: float = 4.0
    storm_clients: int = 192
    storm_s: float = 8.0
    recovery_limit_s: float = 30.0
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


def _connection(base_url: str) -> httpx.AsyncClient:
    # One connection per client: one shared pool of hundreds costs the load generator more than the server.
    # verify=False: plain HTTP, and loading the CA bundle costs ~25 ms of CPU per client.
    return httpx.AsyncClient(base_url=base_url, timeout=60, limits=httpx.Limits(max_connections=1), verify=False)


async def _requests(
    http: httpx.AsyncClient, model: str, texts: list[str], check: Checker, phase: Phase, until: float, rng: random.Random
) -> None:
    while time.monotonic() < until:
        text = rng.choice(texts)
        start = time.monotonic()
        try:
            r = await http.post("/embed", json={"model": model, "inputs": text, "normalize": False})
        except httpx.HTTPError:
            phase.statuses[0] += 1
            await asyncio.sleep(0.1)
            continue
        phase.statuses[r.status_code] += 1
        if r.status_code == 200:
            if check(text, np.asarray(r.json()["embeddings"][0], dtype=np.float32)):
                phase.correct += 1
                phase.latencies.append(time.monotonic() - start)
            else:
                phase.wrong += 1
        elif r.status_code in (429, 503):
            await asyncio.sleep(float(r.headers.get("retry-after", "1")))


async def _phase(base_url: str, s: StormSettings, clients: int, seconds: float, check: Checker,
                 seed: int) -> Phase:
    phase = Phase()
    connections = [_connection(base_url) for _ in range(clients)]  # made before the clock starts
    until = time.monotonic() + seconds
    try:
        await asyncio.gather(*(
            _requests(http, s.model, check.texts, check, phase, until, random.Random(seed * 1000 + i))
            for i, http in enumerate(connections)
        ))
    finally:
        await asyncio.gather(*(http.aclose() for http in connections))
    phase.seconds = seconds  # answers that arrive after `until` (the last in-flight ones) still count
    return phase


async def _recovery(base_url: str, s: StormSettings, check: Checker, since: float) -> float:
    text = check.texts[0]
    async with _connection(base_url) as http:
        while time.monotonic() - since < s.recovery_limit_s:
            try:
                r = await http.post("/embed", json={"model": s.model, "inputs": text, "normalize": False})
                if r.status_code == 200 and check(text, np.asarray(r.json()["embeddings"][0], dtype=np.float32)):
                    return time.monotonic() - since
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.05)
    return float("inf")


async def run_storm(base_url: str, reference: dict[str, np.ndarray], s: StormSettings,
                    log: Callable[[str], None] = lambda _: None) -> StormReport:
    """Capacity, storm and recovery against the gateway at `base_url`."""
    check = Checker(reference)
    capacity = await _phase(base_url, s, s.capacity_clients, s.capacity_s, check, s.seed)
    log(f"capacity: {capacity.summary()}")
    storm_task = asyncio.create_task(_phase(base_url, s, s.storm_clients, s.storm_s, check, s.seed + 1))
    await asyncio.sleep(0)  # the storm's connections are made (synchronously) before its clock starts
    await asyncio.sleep(s.storm_s)
    ended = time.monotonic()  # no new requests from here; the probe starts at once, behind what is in flight
    recovery_s = await _recovery(base_url, s, check, ended)
    storm = await storm_task
    log(f"storm: {storm.summary()}; recovery {recovery_s:.2f}s")
    return StormReport(capacity, storm, recovery_s)


def main(argv: list[str] | None = None) -> None:
    import tritonclient.grpc as grpcclient

    from loadtest.corpus import fixed_length_corpus

    parser = argparse.ArgumentParser(prog="python -m loadtest.storm", description=__doc__.splitlines()[0])
    parser.add_argument("--gateway", default="http://127.0.0.1:8080")
    parser.add_argument("--triton", default="127.0.0.1:8001", help="Triton gRPC, for the reference answers")
    parser.add_argument("--model", required=True, help="served embed model NAME (its NAME_onnx_ensemble is the reference)")
    parser.add_argument("--clients", type=int, default=192)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--texts", type=int, default=128)
    parser.add_argument("--words", type=int, default=24)
    args = parser.parse_args(argv)
    texts = fixed_length_corpus(args.words, size=args.texts)
    triton = grpcclient.InferenceServerClient(args.triton)
    reference = {t: triton_embedding(triton, f"{args.model}_onnx_ensemble", t) for t in texts}
    settings = StormSettings(model=args.model, storm_clients=args.clients, storm_s=args.seconds)
    report = asyncio.run(run_storm(args.gateway, reference, settings, log=print))
    print(json.dumps({"settings": asdict(settings), **report.summary()}, indent=2))


def triton_embedding(triton: object, ensemble: str, text: str) -> np.ndarray:
    """Triton's own answer for `text` from the ensemble (one text per call: no batching effects)."""
    import tritonclient.grpc as grpcclient

    from contract import TEXT, output_name

    inp = grpcclient.InferInput(TEXT, [1, 1], "BYTES")
    inp.set_data_from_numpy(np.array([[text.encode()]], dtype=np.object_))
    name = output_name("embed")
    result = triton.infer(ensemble, [inp], outputs=[grpcclient.InferRequestedOutput(name)])  # type: ignore[attr-defined]
    return np.asarray(result.as_numpy(name)[0], dtype=np.float32)


if __name__ == "__main__":
    main()
