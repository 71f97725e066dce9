"""Where one gateway worker's time goes while it serves lone texts one after another (c=1), on this machine.

    PATH=$PWD/.venv/bin:$PATH .venv/bin/python -m loadtest.experiments.lone_text_profile [--seconds 20] [--out DIR]

Builds loadtest/models.py's `small` BERT embedder (--runtime python, CPU) with its step computing nothing
(loadtest/echo_step, as `ab-gateway --echo-step`), starts one tritonserver and one gateway worker (shipped settings,
scheduler pipeline, system shm, Triton's HTTP endpoint), warms it with 300 requests, then py-spies the worker
(`loadtest.pyspy.profile`, Python frames, not blocking) while one client sends single-text `/embed` requests back to
back. Prints the requests' p50 and the profile summary; `--out` keeps both and the raw stacks (worker.raw, read
with `python -m loadtest.pyspy worker.raw`).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx

from devstack.gateway import GatewayProcess
from devstack.tritonserver import TritonServer
from loadtest.ab_gateway import echo_steps
from loadtest.corpus import CorpusSpec, make_corpus
from loadtest.machine import describe_machine
from loadtest.models import make_bert
from loadtest.pyspy import profile
from tests.fixtures.repository import build_repository


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m loadtest.experiments.lone_text_profile",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="how long py-spy samples the worker")
    parser.add_argument("--out", type=Path, help="directory for summary.md and the raw stacks")
    args = parser.parse_args(argv)
    texts = make_corpus(CorpusSpec(size=256))
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model = make_bert(root / "bert", "embed", "small")
        repository = root / "repository"
        build_repository(repository, [{"model": str(model), "task": "embed", "name": "bert"}], runtime="python",
                         formats="onnx", device="cpu", max_seq_len=128, max_batch_size=64)
        echo_steps(repository)
        raw = (args.out or root) / "worker.raw"
        raw.parent.mkdir(parents=True, exist_ok=True)
        with TritonServer(repository=repository) as server, \
                GatewayProcess(server.grpc_url, triton_http_url=server.http_address,
                               settings={"repository": str(repository), "workers": "1", "shm_prefix": "loneprof"}) as gw:
            assert gw.process is not None
            client = httpx.Client(base_url=gw.url)
            for i in range(300):
                client.post("/embed", json={"inputs": [texts[i % len(texts)]]}).raise_for_status()
            latencies: list[float] = []
            done = threading.Event()

            def load() -> None:
                n = 0
                while not done.is_set():
                    start = time.perf_counter()
                    client.post("/embed", json={"inputs": [texts[n % len(texts)]]}).raise_for_status()
                    latencies.append(time.perf_counter() - start)
                    n += 1

            thread = threading.Thread(target=load)
            thread.start()
            try:
                lines = profile(gw.process.pid, args.seconds, raw, top=30)
            finally:
                done.set()
                thread.join()
    head = (f"{len(latencies)} single-text /embed requests back to back, p50 {1e3 * statistics.median(latencies):.2f} ms "
            f"(one worker, step computing nothing); py-spy of the worker for {args.seconds:.0f} s at 200 Hz")
    print(head + "\n" + "\n".join(lines))
    if args.out:
        machine = describe_machine()
        (args.out / "summary.md").write_text(f"# A lone text's gateway worker, profiled\n\nmachine: {machine.cpu}, "
                                             f"{machine.cpu_count} CPUs, python {machine.python}, "
                                             f"{machine.measured_at}\n\n{head}\n\n```\n" + "\n".join(lines) + "\n```\n")


if __name__ == "__main__":
    main()
