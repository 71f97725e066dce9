"""One call at a time: the gateway against direct tritonclient gRPC, shared memory against plain gRPC.

    PATH=$PWD/.venv/bin:$PATH .venv/bin/python -m loadtest transports [--repository PATH] [--n 300]

Starts one tritonserver (on PATH, on the repository's first embed model, or on the fake repository when none
is given) and two gateways (GATEWAY_SHM=system and none, one worker each), then times, one call at a time
(concurrency 1, after a warm-up), for a batch of 1 and of 8 texts:
  direct-grpc  tritonclient.grpc infer on the ensemble, tensors in the gRPC message
  direct-shm   the same with input and outputs in a pre-registered system shm region
  gateway-shm  POST /embed (or /classify) to the gateway with shm
  gateway-grpc the same gateway code with GATEWAY_SHM=none
Rounds interleave the four so that machine noise hits them alike. Prints a Markdown table; the p50s go to the
results table.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm

from contract import TEXT, Param, output_name
from devstack.fake_repository import write_fake_repository
from devstack.gateway import GatewayProcess
from devstack.tritonserver import TritonServer
from loadtest.machine import describe_machine
from loadtest.results_table import RunContext, add_table_argument, record_rows

OUTPUT = output_name("embed")


@dataclass(frozen=True)
class Served:
    """An embed model as the gateway serves it: its name, its ensemble and the width of its vectors."""

    name: str
    ensemble: str
    width: int


def discover(client: grpcclient.InferenceServerClient) -> Served:
    """The repository's first embed ensemble; its width from one plain call."""
    for entry in client.get_model_repository_index().models:
        config = client.get_model_config(entry.name).config
        params = {k: v.string_value for k, v in config.parameters.items()}
        if config.platform == "ensemble" and params.get(Param.TASK) == "embed":
            inp = grpcclient.InferInput(TEXT, [1, 1], "BYTES")
            inp.set_data_from_numpy(np.array([[b"width"]], dtype=np.object_))
            width = client.infer(config.name, [inp]).as_numpy(OUTPUT).shape[-1]
            return Served(params.get(Param.MODEL_NAME) or config.name, config.name, int(width))
    raise SystemExit("no embed model in the repository")


def serialize_texts(texts: list[bytes]) -> bytes:
    """Triton's BYTES tensor: each element's 4-byte little-endian length before it."""
    return b"".join(len(t).to_bytes(4, "little") + t for t in texts)


def direct_call(client: grpcclient.InferenceServerClient, model: Served, texts: list[str], region: str | None
                ) -> Callable[[], None]:
    encoded = [t.encode() for t in texts]
    n, width = len(texts), model.width
    handle = None
    if region:
        payload = serialize_texts(encoded)
        handle = shm.create_shared_memory_region(region, region, len(payload) + n * (width + 1) * 4)
        client.register_system_shared_memory(region, "/" + region, len(payload) + n * (width + 1) * 4)

    def call() -> None:
        inp = grpcclient.InferInput(TEXT, [n, 1], "BYTES")
        outs = [grpcclient.InferRequestedOutput(OUTPUT), grpcclient.InferRequestedOutput("num_tokens")]
        if handle is None:
            inp.set_data_from_numpy(np.array(encoded, dtype=np.object_).reshape(n, 1))
            res = client.infer(model.ensemble, [inp], outputs=outs)
            res.as_numpy(OUTPUT), res.as_numpy("num_tokens")
        else:
            payload = serialize_texts(encoded)
            shm.set_shared_memory_region(handle, [np.array(payload, dtype=np.object_)])
            inp.set_shared_memory(region, len(payload))
            outs[0].set_shared_memory(region, n * width * 4, len(payload))
            outs[1].set_shared_memory(region, n * 4, len(payload) + n * width * 4)
            client.infer(model.ensemble, [inp], outputs=outs)
            shm.get_contents_as_numpy(handle, np.float32, [n, width], len(payload)).copy()

    call.handle = handle  # type: ignore[attr-defined]
    return call


def gateway_call(http: httpx.Client, model: Served, texts: list[str]) -> Callable[[], None]:
    body = {"model": model.name, "inputs": texts}

    def call() -> None:
        r = http.post("/embed", json=body)
        r.raise_for_status()
        r.json()

    return call


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest transports", description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, help="a --runtime python repository (default: fake models)")
    parser.add_argument("--n", type=int, default=300, help="timed calls per variant and batch size")
    parser.add_argument("--name", default="transports", help="the run's name in the results table")
    add_table_argument(parser)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        repo = args.repository or write_fake_repository(Path(tmp) / "repo")
        with TritonServer(repository=repo) as triton:
            client = grpcclient.InferenceServerClient(triton.grpc_url)
            model = discover(client)
            shm_settings = {"shm": "system", "log_level": "warning", "shm_prefix": "benchshm"}
            grpc_settings = {"shm": "none", "log_level": "warning"}
            with GatewayProcess(triton.grpc_url, triton_http_url=triton.http_address, settings=shm_settings) as g_shm, \
                 GatewayProcess(triton.grpc_url, triton_http_url=triton.http_address, settings=grpc_settings) as g_grpc, \
                 httpx.Client(base_url=g_shm.url) as h_shm, httpx.Client(base_url=g_grpc.url) as h_grpc:
                rows = []
                for batch in (1, 8):
                    texts = [f"benchmark sentence number {i} with a few words" for i in range(batch)]
                    variants = {
                        "direct-grpc": direct_call(client, model, texts, None),
                        "direct-shm": direct_call(client, model, texts, f"benchdirect{batch}"),
                        "gateway-shm": gateway_call(h_shm, model, texts),
                        "gateway-grpc": gateway_call(h_grpc, model, texts),
                    }
                    times: dict[str, list[float]] = {k: [] for k in variants}
                    for _ in range(30):
                        for call in variants.values():
                            call()
                    for _ in range(args.n):
                        for name, call in variants.items():
                            t0 = time.perf_counter()
                            call()
                            times[name].append((time.perf_counter() - t0) * 1000)
                    for name, ts in times.items():
                        ts.sort()
                        rows.append((batch, name, statistics.median(ts), ts[int(len(ts) * 0.9)], statistics.mean(ts)))
                    for name in ("direct-shm",):
                        client.unregister_system_shared_memory(f"benchdirect{batch}")
                        shm.destroy_shared_memory_region(variants[name].handle)  # type: ignore[attr-defined]
        print(f"model {model.name}, ensemble {model.ensemble}, {args.n} calls each, concurrency 1\n")
        print("| batch | path | p50 ms | p90 ms | mean ms |\n| --- | --- | --- | --- | --- |")
        for batch, name, p50, p90, mean in rows:
            print(f"| {batch} | {name} | {p50:.2f} | {p90:.2f} | {mean:.2f} |")
        med = {(b, n): p50 for b, n, p50, _, _ in rows}
        for b in (1, 8):
            print(
                f"\nbatch {b}: gateway adds {med[b, 'gateway-shm'] - med[b, 'direct-shm']:.2f} ms p50 over direct shm, "
                f"{med[b, 'gateway-grpc'] - med[b, 'direct-grpc']:.2f} ms over direct gRPC; "
                f"shm vs gRPC: direct {med[b, 'direct-shm'] - med[b, 'direct-grpc']:+.2f} ms, "
                f"gateway {med[b, 'gateway-shm'] - med[b, 'gateway-grpc']:+.2f} ms"
            )
    context = RunContext.of(describe_machine(), args.name, "")
    record_rows([context.row("transports", name, f"{batch} text{'s' * (batch > 1)} c=1", "p50", p50, "ms")
                 for batch, name, p50, _, _ in rows], args.table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
