"""Side-by-side latency: direct tritonclient gRPC vs the gateway, shared memory vs plain gRPC.

    PATH=$PWD/.venv/bin:$PATH .venv/bin/python -m devstack.bench [--repository PATH] [--n 300]

Starts one tritonserver (on PATH, or on the fake repository when none is given) and two
gateways (GATEWAY_SHM=system and none, one worker each), then times, one call at a time
(concurrency 1, after a warm-up), for a batch of 1 and of 8 texts:
  direct-grpc  tritonclient.grpc infer on the ensemble, tensors in the gRPC message
  direct-shm   the same with input and outputs in a pre-registered system shm region
  gateway-shm  POST /embed (or /classify) to the gateway with shm
  gateway-grpc the same gateway code with GATEWAY_SHM=none
Rounds interleave the four so that machine noise hits them alike. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm

from devstack.fake_repository import write_fake_repository
from devstack.gateway import GatewayProcess
from devstack.tritonserver import TritonServer
from gateway.service.registry import ServedModel, parse_ensemble
from gateway.triton.shm_pool import serialize_texts


def discover(client: grpcclient.InferenceServerClient) -> tuple[ServedModel, str]:
    """The first embed model (else classify) of the repository and its ensemble name."""
    found = []
    for m in client.get_model_repository_index().models:
        parsed = parse_ensemble(client.get_model_config(m.name).config)
        if parsed:
            found.append((parsed[0], parsed[1].triton_model))
    found.sort(key=lambda f: f[0].task != "embed")
    return found[0]


def direct_call(
    client: grpcclient.InferenceServerClient, model: ServedModel, ensemble: str, texts: list[str], region: str | None
) -> Callable[[], None]:
    encoded = [t.encode() for t in texts]
    n, width = len(texts), model.output_width
    handle = None
    if region:
        payload = serialize_texts(encoded)
        handle = shm.create_shared_memory_region(region, region, len(payload) + n * (width + 1) * 4)
        client.register_system_shared_memory(region, "/" + region, len(payload) + n * (width + 1) * 4)

    def call() -> None:
        inp = grpcclient.InferInput("text", [n, 1], "BYTES")
        outs = [grpcclient.InferRequestedOutput(model.output_name), grpcclient.InferRequestedOutput("num_tokens")]
        if handle is None:
            inp.set_data_from_numpy(np.array(encoded, dtype=np.object_).reshape(n, 1))
            res = client.infer(ensemble, [inp], outputs=outs)
            res.as_numpy(model.output_name), res.as_numpy("num_tokens")
        else:
            payload = serialize_texts(encoded)
            shm.set_shared_memory_region(handle, [np.array(payload, dtype=np.object_)])
            inp.set_shared_memory(region, len(payload))
            outs[0].set_shared_memory(region, n * width * 4, len(payload))
            outs[1].set_shared_memory(region, n * 4, len(payload) + n * width * 4)
            client.infer(ensemble, [inp], outputs=outs)
            shm.get_contents_as_numpy(handle, np.float32, [n, width], len(payload)).copy()

    call.handle = handle  # type: ignore[attr-defined]
    return call


def gateway_call(http: httpx.Client, model: ServedModel, texts: list[str]) -> Callable[[], None]:
    path = "/embed" if model.task == "embed" else "/classify"
    body = {"model": model.name, "inputs": texts}

    def call() -> None:
        r = http.post(path, json=body)
        r.raise_for_status()
        r.json()

    return call


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repository", type=Path, help="a --runtime python repository (default: fake models)")
    parser.add_argument("--n", type=int, default=300, help="timed calls per variant and batch size")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        repo = args.repository or write_fake_repository(Path(tmp) / "repo")
        with TritonServer(repository=repo) as triton:
            client = grpcclient.InferenceServerClient(triton.grpc_url)
            model, ensemble = discover(client)
            with GatewayProcess(triton.grpc_url, triton_http_url=triton.http_address, settings={"shm": "system", "log_level": "warning", "shm_prefix": "benchshm"}) as g_shm, \
                 GatewayProcess(triton.grpc_url, triton_http_url=triton.http_address, settings={"shm": "none", "log_level": "warning"}) as g_grpc, \
                 httpx.Client(base_url=g_shm.url) as h_shm, httpx.Client(base_url=g_grpc.url) as h_grpc:
                rows = []
                for batch in (1, 8):
                    texts = [f"benchmark sentence number {i} with a few words" for i in range(batch)]
                    variants = {
                        "direct-grpc": direct_call(client, model, ensemble, texts, None),
                        "direct-shm": direct_call(client, model, ensemble, texts, f"benchdirect{batch}"),
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
        print(f"model {model.name} ({model.task}), ensemble {ensemble}, {args.n} calls each, concurrency 1\n")
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


if __name__ == "__main__":
    main()
