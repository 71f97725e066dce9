import asyncio, os, statistics, subprocess, sys, time
from pathlib import Path
import orjson
from devstack.gateway import GatewayProcess
from devstack.tritonserver import TritonServer
from loadtest.storm import Connection
repo = Path(sys.argv[1])
TEXT = "how fast is the model server?"
def threads(pid):
    out = {}
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            raw = open(f"/proc/{pid}/task/{t}/stat").read()
        except OSError:
            continue
        name = raw[raw.index("(")+1:raw.rindex(")")]
        f = raw.rsplit(")", 1)[1].split()
        out[(t, name + "-user")] = int(f[11]) / os.sysconf("SC_CLK_TCK")
        out[(t, name + "-sys")] = int(f[12]) / os.sysconf("SC_CLK_TCK")
    return out
def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
async def loop(url, seconds, path="/embed"):
    c = Connection(url); body = orjson.dumps({"model": "bench", "inputs": TEXT, "normalize": False})
    end = time.monotonic() + seconds; t = []
    while time.monotonic() < end:
        s = time.perf_counter(); st, _, _ = await c.post(path, body); t.append(time.perf_counter() - s)
    await c.close(); return t
with TritonServer(repository=repo, log_path=Path("/tmp/hops/t.log")) as triton:
    with GatewayProcess(triton.grpc_url, settings={"repository": str(repo), "workers": "1", **dict(a.split("=",1) for a in sys.argv[2:])}, log_path=Path("/tmp/hops/gw.log")) as gw:
        pid = gw.process.pid
        kids = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
        asyncio.run(loop(gw.url, 2))
        for path in ("/embed", "/tokenize", "/embed"):
            th0 = threads(pid)
            c0 = cpu(pid) + sum(cpu(k) for k in kids); t = asyncio.run(loop(gw.url, 8, path)); c1 = cpu(pid) + sum(cpu(k) for k in kids)
            th1 = threads(pid)
            print({k[1]+k[0]: round(1e6*(v - th0.get(k, 0))/len(t)) for k, v in th1.items() if v - th0.get(k, 0) > 0})
            print(f"{path}: {len(t)} requests, p50 {statistics.median(t)*1e3:.3f} ms, gateway CPU {1e6*(c1-c0)/len(t):.0f} us/request (kids {kids})")
