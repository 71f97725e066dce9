"""Where a host's CPU goes under load: cores used by each process group (the load generator, the gateway, tritonserver,
the python-backend stubs, the rest), the gateway's by kind of thread (event loops, grpc's threads, the others), the
stubs' by thread (`stub_thread_kind`: their main threads, and the others by name: onnxruntime's, CUDA's, the stub's
own), and the GPU's utilization, sampled every `--interval` seconds from /proc and nvidia-smi. Start it, then the load;
samples while the gateway is busy are summarized (median per group). How evenly the gateway's workers share the
load: the busiest and the idlest worker's event loop, and the fewest and most client connections a worker holds.

    python -m loadtest.experiments.host_cpu --seconds 150 --out cpu.json &
    python -m loadtest bench7 --parts scheduler --steps "single text c=256" ...
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

TICKS = os.sysconf("SC_CLK_TCK")
# first match wins: the stub's command line names tritonserver's backend directory too, and the load generator's may
# name the gateway (`bench7 --name gateway-spy`: until 2026-11-24 its clients were counted as gateway event loops)
GROUPS = (("stubs", "triton_python_backend_stub"), ("tritonserver", "tritonserver"), ("load generator", "-m loadtest"),
          ("gateway", "gateway"), ("gateway", "uvicorn"))


def group_of(cmdline: str) -> str:
    return next((name for name, needle in GROUPS if needle in cmdline), "other")


def cpu_ticks() -> dict[int, tuple[str, int]]:
    """pid -> (group, user + system ticks so far). A process whose command line names no group (a multiprocessing
    child: the gateway's workers, the load generator's clients) belongs to its nearest ancestor's group."""
    seen: dict[int, tuple[str, int, int]] = {}  # pid -> (own group, parent pid, ticks)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        seen[int(entry)] = (group_of(cmdline), int(fields[1]), int(fields[11]) + int(fields[12]))

    def group(pid: int) -> str:
        for _ in range(32):  # up the parent chain
            own, parent, _ticks = seen.get(pid, ("other", 0, 0))
            if own != "other" or parent not in seen:
                return own
            pid = parent
        return "other"

    return {pid: (group(pid), ticks) for pid, (_, _, ticks) in seen.items()}


GRPC_THREADS = ("grpc", "event_engine", "lifeguard", "default-executo", "resolver-execut")


def gateway_thread_kind(pid: int, tid: int, comm: str) -> str:
    """The event loop (a process's main thread), grpc's own threads (by name), the other threads (the tokenizer's:
    asyncio's worker threads and the Rust tokenizer's pool; grpc.aio's poller)."""
    return ("gateway: event loops" if tid == pid else "gateway: grpc threads" if comm.startswith(GRPC_THREADS)
            else "gateway: other threads")


def stub_thread_kind(pid: int, tid: int, comm: str) -> str:
    """A stub's main thread, else the thread's name (onnxruntime's pool, CUDA's event handler, the stub's own
    helpers) without trailing digits, so that a pool's threads add up."""
    if tid == pid:
        return "stubs: main threads"
    return f"stubs: threads {comm.rstrip('0123456789_-') or 'unnamed'}"


def thread_ticks(pids: list[int], kind_of: Callable[[int, int, str], str]) -> dict[tuple[int, int], tuple[str, int]]:
    """(pid, tid) -> (kind, user + system ticks) of every thread of the processes `pids`; `kind_of(pid, tid, comm)`."""
    ticks: dict[tuple[int, int], tuple[str, int]] = {}
    for pid in pids:
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
        for tid in tids:
            try:
                comm = Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
                fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            ticks[(pid, tid)] = (kind_of(pid, tid, comm), int(fields[11]) + int(fields[12]))
    return ticks


LISTENING, ESTABLISHED = "0A", "01"  # TCP states as /proc/net/tcp writes them


def tcp_sockets(pid: int) -> list[tuple[int, int, str]]:
    """(inode, local port, state) of each TCP socket process `pid` holds open (none if it is gone)."""
    table: dict[int, tuple[int, str]] = {}
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(path).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            table[int(fields[9])] = (int(fields[1].rsplit(":", 1)[1], 16), fields[3])
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return []
    links = []
    for fd in fds:
        try:
            links.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
        except OSError:  # closed meanwhile (the listing's own descriptor, when pid is this process)
            continue
    inodes = (int(link[8:-1]) for link in links if link.startswith("socket:["))
    return [(inode, *table[inode]) for inode in inodes if inode in table]


def worker_connections(pids: list[int]) -> dict[int, int]:
    """pid -> established connections on the port that process listens on, for each of `pids` that listens (a
    gateway worker). uvicorn's parent holds the workers' shared listening socket too, with no connection: pass the
    workers only."""
    counts: dict[int, int] = {}
    for pid in pids:
        held = tcp_sockets(pid)
        ports = {port for _, port, state in held if state == LISTENING}
        if ports:
            counts[pid] = sum(1 for _, port, state in held if state == ESTABLISHED and port in ports)
    return counts


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def host_busy() -> tuple[int, int]:
    """(busy, total) jiffies of all CPUs."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]
    return sum(values) - idle, sum(values)


def sample(interval: float) -> dict[str, float]:
    """Cores per group and host-wide over one interval, and the GPU's mean utilization (%) meanwhile."""
    gpu = subprocess.Popen(["nvidia-smi", "--query-gpu=index,utilization.gpu", "--format=csv,noheader,nounits",
                            "-lms", "100"], stdout=subprocess.PIPE, text=True) if _has_nvidia_smi() else None
    before, busy0 = cpu_ticks(), host_busy()
    gateway = [pid for pid, (group, _) in before.items() if group == "gateway"]
    stubs = [pid for pid, (group, _) in before.items() if group == "stubs"]

    def threads() -> dict[tuple[int, int], tuple[str, int]]:
        return thread_ticks(gateway, gateway_thread_kind) | thread_ticks(stubs, stub_thread_kind)

    threads_before = threads()
    started = time.perf_counter()
    time.sleep(interval)  # the measurement window itself, not synchronisation
    after, busy1 = cpu_ticks(), host_busy()
    threads_after = threads()
    elapsed = time.perf_counter() - started
    cores: dict[str, float] = {}
    for pid, (group, ticks) in after.items():
        used = ticks - before[pid][1] if pid in before else ticks  # a process born in the window: all of it
        cores[group] = cores.get(group, 0.0) + used / TICKS / elapsed
    for key, (kind, ticks) in threads_after.items():
        used = ticks - threads_before[key][1] if key in threads_before else ticks
        cores[kind] = cores.get(kind, 0.0) + used / TICKS / elapsed
    cores["gateway threads (count)"] = float(sum(1 for pid, _ in threads_after if pid in gateway))
    cores["stubs threads (count)"] = float(sum(1 for pid, _ in threads_after if pid in stubs))
    loops = {pid: (ticks - threads_before[(pid, tid)][1]) / TICKS / elapsed for (pid, tid), (kind, ticks)
             in threads_after.items() if kind == "gateway: event loops" and (pid, tid) in threads_before}
    connections = worker_connections([pid for pid in gateway if _parent(pid) in gateway])  # not uvicorn's parent
    busy_loops = [loops[pid] for pid in connections if pid in loops]  # the workers' loops, not their parent's
    if busy_loops:
        cores["gateway: busiest event loop"] = max(busy_loops)
        cores["gateway: idlest event loop"] = min(busy_loops)
    if connections:
        cores["gateway: most connections of a worker (count)"] = float(max(connections.values()))
        cores["gateway: fewest connections of a worker (count)"] = float(min(connections.values()))
    cores["host (all CPUs)"] = (busy1[0] - busy0[0]) / max(1, busy1[1] - busy0[1]) * (os.cpu_count() or 1)
    if gpu is not None:
        gpu.terminate()
        cores.update(gpu_utilization(gpu.communicate()[0] or ""))
    return {k: round(v, 2) for k, v in cores.items()}


def gpu_utilization(readings: str) -> dict[str, float]:
    """Mean utilization (%) of each GPU ("gpu N utilization %", where there are several) and of all of them
    ("gpu utilization %"), from nvidia-smi's `index, utilization` lines; -1 with no reading."""
    per_gpu: dict[str, list[float]] = {}
    for line in readings.splitlines():
        index, _, value = line.partition(",")
        if index.strip().isdigit() and value.strip().replace(".", "", 1).isdigit():
            per_gpu.setdefault(index.strip(), []).append(float(value))
    every = [v for values in per_gpu.values() for v in values]
    out = {"gpu utilization %": statistics.fmean(every) if every else -1.0}
    if len(per_gpu) > 1:
        out.update({f"gpu {index} utilization %": statistics.fmean(values) for index, values in per_gpu.items()})
    return out


def _has_nvidia_smi() -> bool:
    return any(Path(p, "nvidia-smi").exists() for p in os.environ.get("PATH", "").split(":"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m loadtest.experiments.host_cpu", description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--interval", type=float, default=2.0)
    parser.add_argument("--busy", type=float, default=1.0,
                        help="gateway cores that mark a sample as under load (the load generator also works while it "
                             "prepares its corpus, the gateway only under load)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    samples = []
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        samples.append(sample(args.interval))
    loaded = [s for s in samples if s.get("gateway", 0.0) >= args.busy]
    keys = sorted({k for s in loaded for k in s})
    summary = {k: statistics.median(s.get(k, 0.0) for s in loaded) for k in keys} if loaded else {}
    args.out.write_text(json.dumps({"cpus": os.cpu_count(), "interval_s": args.interval, "samples": samples,
                                    "loaded_samples": len(loaded), "median_under_load": summary}, indent=1))
    print(f"{len(loaded)} of {len(samples)} samples under load; median cores (of {os.cpu_count()}):")
    for key, value in summary.items():
        print(f"  {key:24s} {value:6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
