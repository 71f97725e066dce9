"""How much a busy host slows one Python thread: what the GPU host's "16 CPUs" are worth under load.

Issue 20, eleventh session. Under single texts at c=256 the host ran 11 of its 16 CPUs busy, and a gateway worker's
event loop took about 0.7 ms of CPU per request there, against about 0.4 ms per request on the 2-core dev VM. If
two of the host's CPUs share one physical core (hyperthreads the VM does not show as such), the host is fuller than
11 of 16 says. This measures it (standard library and loadtest.machine only):

- alone: a fixed unit of pure-Python work (dicts, strings, JSON: what a gateway worker does) on CPU 0, nothing else
  running;
- pairs: the same beside one spinning process on each other CPU in turn. A CPU whose spinner slows CPU 0 by far
  more than the others shares its core;
- load: the same beside k spinners on other CPUs, k = 0 .. all (a spread of k busy CPUs, as a benchmark makes).

    python -m loadtest.experiments.host_contention --out host-contention.json

It prints the table (per-unit median in ms, and its ratio to alone) and writes it with the CPU topology the kernel
shows (/sys/devices/system/cpu/*/topology) to --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from loadtest.machine import cpu_model

SPIN = "import os, sys; os.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass"


def work_unit() -> None:
    """A fraction of a millisecond of the kind of Python a gateway runs per request (0.18 ms on the dev VM)."""
    for i in range(40):
        record = {"id": f"req-{i}", "model": "bench", "inputs": ["how fast is the model server?"] * 2, "n": i}
        text = json.dumps(record)
        parsed = json.loads(text)
        _ = sorted(parsed.items(), key=lambda kv: kv[0])
        _ = "".join(f"{k}={v};" for k, v in parsed.items())


def time_units(seconds: float) -> float:
    """Median ms of one work unit over `seconds` on the calling thread (pinned to CPU 0 by the caller)."""
    samples: list[float] = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        start = time.perf_counter()
        work_unit()
        samples.append(1e3 * (time.perf_counter() - start))
    return statistics.median(samples)


def with_spinners(cpus: list[int], seconds: float) -> float:
    """time_units on CPU 0 while one spinning process runs on each of `cpus`."""
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN, str(cpu)]) for cpu in cpus]
    try:
        time.sleep(0.2)  # the spinners are running
        return time_units(seconds)
    finally:
        for proc in spinners:
            proc.kill()
        for proc in spinners:
            proc.wait()


def topology(cpus: list[int]) -> dict[str, str]:
    """cpu -> its thread_siblings_list and core_id as the kernel shows them."""
    out = {}
    for cpu in cpus:
        base = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            out[str(cpu)] = (f"siblings {(base / 'thread_siblings_list').read_text().strip()}, "
                             f"core {(base / 'core_id').read_text().strip()}")
        except OSError:
            out[str(cpu)] = "unknown"
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m loadtest.experiments.host_contention", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=1.0, help="measuring time per point")
    p.add_argument("--out", type=Path, default=Path("host-contention.json"))
    args = p.parse_args(argv)
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("needs at least 2 CPUs")
    os.sched_setaffinity(0, {cpus[0]})
    others = cpus[1:]
    time_units(0.3)  # warm
    alone = time_units(args.seconds)
    pairs = {cpu: with_spinners([cpu], args.seconds) for cpu in others}
    counts = sorted({0, *range(2, len(others), 2), len(others)})
    # spread over the other CPUs in order: k spinners, none on CPU 0
    load = {k: with_spinners(others[:k], args.seconds) if k else time_units(args.seconds) for k in counts}
    result = {"cpu_model": cpu_model(), "cpus": len(cpus), "measured_cpu": cpus[0], "alone_ms": alone,
              "pairs_ms": {str(k): v for k, v in pairs.items()}, "load_ms": {str(k): v for k, v in load.items()},
              "topology": topology(cpus)}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{cpu_model()}, {len(cpus)} CPUs; one work unit on CPU {cpus[0]}, median ms (x alone)")
    print(f"alone: {alone:.3f}")
    print("beside one spinner on CPU: " + ", ".join(f"{c}: {v:.3f} ({v / alone:.2f})" for c, v in pairs.items()))
    print("beside k spinners: " + ", ".join(f"{k}: {v:.3f} ({v / alone:.2f})" for k, v in load.items()))
    print("kernel topology: " + "; ".join(f"cpu{c} {t}" for c, t in list(result["topology"].items())[:4]) + " ...")


if __name__ == "__main__":
    main()
