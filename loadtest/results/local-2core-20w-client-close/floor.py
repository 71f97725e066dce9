"""c=1 latency floors of the gateway: a route with no Triton call vs /embed vs the bare Triton step."""
import asyncio, statistics, sys, time
from pathlib import Path
import orjson
from devstack.gateway import GatewayProcess
from devstack.tritonserver import TritonServer
from loadtest.storm import Connection
from loadtest.stack_check import triton_ms
from transformers import AutoTokenizer

repo = Path(sys.argv[1]); model = Path("/tmp/hops/model")
TEXT = "how fast is the model server?"
async def med(url, path, body, n=500):
    c = Connection(url)
    for _ in range(30): await c.post(path, body)
    t = []
    for _ in range(n):
        s = time.perf_counter(); st, _, _ = await c.post(path, body); t.append(time.perf_counter() - s)
        assert st == 200, st
    await c.close(); return statistics.median(t) * 1e3
ids = AutoTokenizer.from_pretrained(model)(TEXT)["input_ids"]
with TritonServer(repository=repo, log_path=Path("/tmp/hops/t.log")) as triton:
    settings = {"repository": str(repo), "workers": "1", **dict(a.split("=") for a in sys.argv[2:])}
    with GatewayProcess(triton.grpc_url, settings=settings, log_path=Path("/tmp/hops/gw.log")) as gw:
        for rnd in range(2):
            step = triton_ms(triton.grpc_url, "bench_onnx", None, ids, 500)["triton step (gRPC)"]
            tok = asyncio.run(med(gw.url, "/tokenize", orjson.dumps({"model": "bench", "inputs": TEXT})))
            emb = asyncio.run(med(gw.url, "/embed", orjson.dumps({"model": "bench", "inputs": TEXT, "normalize": False})))
            print(f"step {step:.3f}  /tokenize {tok:.3f}  /embed {emb:.3f}  embed-step {emb-step:.3f}")
