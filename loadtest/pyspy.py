"""py-spy on a running process (a gateway worker under load): sample it, summarise the stacks by function."""

from __future__ import annotations

import collections
import subprocess
from pathlib import Path


def profile(pid: int, seconds: float, raw: Path, top: int = 25) -> list[str]:
    """`py-spy record` of `pid` for `seconds` at 200 Hz into `raw` (collapsed stacks), summarised by `summary`;
    one line saying why when py-spy fails."""
    spy = subprocess.run(["py-spy", "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "200",
                          "--format", "raw", "--nonblocking", "-o", str(raw)], capture_output=True, text=True,
                         check=False)
    return summary(raw, top) if raw.exists() else [f"py-spy failed: {spy.stderr[-500:]}"]


def summary(raw: Path, top: int = 25) -> list[str]:
    """py-spy raw (collapsed) stacks -> lines 'self% total% function (file:line)', then by inclusive time."""
    self_c: collections.Counter[str] = collections.Counter()
    total_c: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        samples += n
        frames = stack.split(";")
        for f in set(frames):
            total_c[f] += n
        self_c[frames[-1]] += n
    if not samples:
        return ["no samples"]
    out = [f"{samples} samples; self% total% frame"]
    out += [f"{self_c[f] / samples:6.1%} {total_c[f] / samples:6.1%}  {f}" for f, _ in self_c.most_common(top)]
    out += ["", "by inclusive time:"]
    out += [f"{total_c[f] / samples:6.1%}  {f}" for f, _ in total_c.most_common(top)]
    return out
