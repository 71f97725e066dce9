"""What an nsys capture (exported to SQLite) says about the GPU's time: the share of the window in which at least one
kernel ran, the idle gaps by length, kernels and kernel time per process, copies, and the CUDA API calls that took
the most CPU time.

    python3 loadtest/device/nsys_summary.py REPORT.sqlite
"""

from __future__ import annotations

import sqlite3
import sys
from collections import Counter, defaultdict


def union(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def main(path: str) -> None:
    db = sqlite3.connect(path)
    kernels = db.execute("SELECT start, end, globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchall()
    if not kernels:
        print("no kernels in the capture")
        return
    busy = union([(s, e) for s, e, _ in kernels])
    first, last = busy[0][0], busy[-1][1]
    window = last - first
    busy_ns = sum(e - s for s, e in busy)
    print(f"window {window / 1e6:.1f} ms: a kernel running {100 * busy_ns / window:.1f}% of it, "
          f"{len(kernels)} kernels ({len(kernels) / (window / 1e9):.0f}/s)")
    gaps = [b[0] - a[1] for a, b in zip(busy, busy[1:])]
    bins = Counter()
    idle = defaultdict(int)
    for gap in gaps:
        edge = next((limit for limit in (5_000, 20_000, 100_000, 1_000_000) if gap < limit), 10**12)
        bins[edge] += 1
        idle[edge] += gap
    for edge in sorted(bins):
        label = f"< {edge / 1000:.0f} us" if edge < 10**12 else ">= 1000 us"
        print(f"  idle gaps {label:>10}: {bins[edge]:7d}, {100 * idle[edge] / window:5.1f}% of the window")
    per_pid: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for start, end, pid in kernels:
        per_pid[pid >> 24][0] += 1
        per_pid[pid >> 24][1] += end - start
    for pid, (count, ns) in sorted(per_pid.items(), key=lambda kv: -kv[1][1]):
        print(f"  process {pid}: {count} kernels, {100 * ns / window:.1f}% of the window in kernels, "
              f"mean {ns / count / 1000:.1f} us")
    try:
        copies = db.execute("SELECT copyKind, COUNT(*), SUM(end - start), SUM(bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY "
                            "GROUP BY copyKind").fetchall()
    except sqlite3.OperationalError:
        copies = []
    for kind, count, ns, size in copies:
        print(f"  copies of kind {kind}: {count}, {100 * ns / window:.1f}% of the window, {size / 1e6:.1f} MB")
    try:
        api = db.execute("SELECT s.value, COUNT(*), SUM(r.end - r.start) FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
                         "JOIN StringIds s ON s.id = r.nameId GROUP BY s.value ORDER BY 3 DESC LIMIT 10").fetchall()
    except sqlite3.OperationalError:
        api = []
    for name, count, ns in api:
        print(f"  CUDA API {name}: {count} calls, {ns / 1e6:.1f} ms ({ns / count / 1000:.1f} us each)")


if __name__ == "__main__":
    main(sys.argv[1])
