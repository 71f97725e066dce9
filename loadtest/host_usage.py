"""Where a load step's time goes on its host: the cores each process group used over the step (from the processes'
CPU times before and after), the GPU's busy share (nvidia-smi dmon's SM %, sampled each second), and, when
$LOADTEST_PYSPY names a folder, a py-spy profile (raw collapsed stacks) of one process of each Python group.

Groups: `gateway` (`python -m gateway` and its workers), `tritonserver`, `stub MODEL` (Triton's python-backend stub
of each model), `mps` (the CUDA MPS daemon), `infinity-emb` (bench7's server peer), `load client` (the loadtest
process and its other children), `other`.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Self

import psutil

PYTHON_GROUPS = ("gateway",)  # py-spy: one worker of the gateway, and one stub of each model


def group_of(process: psutil.Process, me: int) -> str:
    """The group a process belongs to, by its own command line or its nearest recognised ancestor's."""
    try:
        line = " ".join(process.cmdline())
    except psutil.Error:
        return "other"
    if "triton_python_backend_stub" in line:
        model = re.search(r"/([^/\s]+)/\d+/model\.py", line)
        return f"stub {model.group(1) if model else '?'}"
    if "nvidia-cuda-mps" in line:
        return "mps"
    if "infinity_emb" in line:  # bench7's server peer
        return "infinity-emb"
    if os.path.basename(line.split(" ", 1)[0]) == "tritonserver":
        return "tritonserver"
    try:
        chain = [process, *process.parents()]
    except psutil.Error:
        chain = [process]
    for p in chain:
        try:
            if p.pid == me or "loadtest" in " ".join(p.cmdline()):
                return "load client"
            if "-m gateway" in " ".join(p.cmdline()):
                return "gateway"
        except psutil.Error:
            continue
    return "other"


def sm_samples(dmon: str) -> list[int]:
    """The SM % column of `nvidia-smi dmon -s u` output (GPU 0's rows; headers and stray lines skipped)."""
    rows = [line.split() for line in dmon.splitlines() if not line.lstrip().startswith("#")]
    return [int(row[1]) for row in rows if len(row) > 1 and row[0] == "0" and row[1].isdigit()]


def _cpu_seconds() -> dict[int, tuple[float, psutil.Process]]:
    seen = {}
    for p in psutil.process_iter():
        try:
            t = p.cpu_times()
            seen[p.pid] = (t.user + t.system, p)
        except psutil.Error:
            continue
    return seen


@dataclass
class HostUsage:
    """A context around one load step; `summary()` after it: cores per group, host busy cores, GPU SM %."""

    label: str
    cores: dict[str, float] = field(default_factory=dict)
    gpu_sm_pct: float | None = None
    gpu_samples: list[int] = field(default_factory=list)
    _start: float = 0.0
    _before: dict[int, tuple[float, psutil.Process]] = field(default_factory=dict)
    _host_before: float = 0.0
    _children_before: float = 0.0
    _dmon: subprocess.Popen[str] | None = None
    _spies: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __enter__(self) -> Self:
        self._before = _cpu_seconds()
        self._host_before = _host_busy()
        self._children_before = _children_seconds()
        self._start = time.monotonic()
        if shutil.which("nvidia-smi"):
            self._dmon = subprocess.Popen(["nvidia-smi", "dmon", "-s", "u", "-d", "1"], stdout=subprocess.PIPE,
                                          stderr=subprocess.DEVNULL, text=True)
        self._start_spies()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        elapsed = max(time.monotonic() - self._start, 1e-9)
        after = _cpu_seconds()
        me = os.getpid()
        for pid, (seconds, process) in after.items():
            used = seconds - self._before.get(pid, (0.0, process))[0]
            if used > 0:
                group = group_of(process, me)
                self.cores[group] = self.cores.get(group, 0.0) + used / elapsed
        # the load client's processes that ended within the step (a pool's), reaped by this one
        reaped = (_children_seconds() - self._children_before) / elapsed
        self.cores["load client"] = self.cores.get("load client", 0.0) + reaped
        self.cores["host busy"] = (_host_busy() - self._host_before) / elapsed
        if self._dmon is not None:
            self._dmon.terminate()
            out, _ = self._dmon.communicate(timeout=10)
            self.gpu_samples = sm_samples(out)
            if self.gpu_samples:
                self.gpu_sm_pct = sum(self.gpu_samples) / len(self.gpu_samples)
        for spy in self._spies:
            try:
                spy.wait(timeout=60)
            except subprocess.TimeoutExpired:
                spy.kill()

    def _start_spies(self) -> None:
        folder = os.environ.get("LOADTEST_PYSPY")
        spy = shutil.which("py-spy")
        if not folder or not spy:
            return
        seconds = os.environ.get("LOADTEST_PYSPY_SECONDS", "6")
        Path(folder).mkdir(parents=True, exist_ok=True)
        me, picked = os.getpid(), {}
        for pid, (_, process) in self._before.items():
            group = group_of(process, me)
            if not (group in PYTHON_GROUPS or group.startswith("stub ")) or pid == me or group in picked:
                continue
            try:
                line = " ".join(process.cmdline())
            except psutil.Error:
                continue
            if "resource_tracker" not in line and "-m gateway" not in line:  # a worker, not a supervisor
                picked[group] = pid
        stem = re.sub(r"[^A-Za-z0-9]+", "-", self.label).strip("-")
        for group, pid in picked.items():
            name = re.sub(r"[^A-Za-z0-9]+", "-", group)
            self._spies.append(subprocess.Popen(
                [spy, "record", "--nonblocking", "-r", "250", "-d", seconds, "-f", "raw", "-p", str(pid),
                 "-o", f"{folder}/{stem}.{name}.txt"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def summary(self) -> dict[str, float]:
        """Cores per group (`cores <group>`), and `gpu_sm_pct` when the GPU was sampled."""
        out = {f"cores {k}": round(v, 2) for k, v in sorted(self.cores.items(), key=lambda kv: -kv[1]) if v >= 0.05}
        if self.gpu_sm_pct is not None:
            out["gpu_sm_pct"] = round(self.gpu_sm_pct, 1)
        return out


def _host_busy() -> float:
    t = psutil.cpu_times()
    return t.user + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0) + getattr(t, "nice", 0.0)


def _children_seconds() -> float:
    t = os.times()
    return t.children_user + t.children_system


def spy_report(path: str, top: int = 20) -> str:
    """The frames a py-spy raw profile (collapsed stacks) spent its samples in: by own time, then including callees."""
    own: Counter[str] = Counter()
    within: Counter[str] = Counter()
    for line in Path(path).read_text().splitlines():
        if " " not in line.strip():
            continue
        stack, count = line.rsplit(" ", 1)
        frames = stack.split(";")
        own[frames[-1]] += int(count)
        for frame in set(frames):
            within[frame] += int(count)
    total = sum(own.values()) or 1
    lines = [f"{path}: {total} samples", "own time:"]
    lines += [f"  {100 * n / total:5.1f}% {frame[:140]}" for frame, n in own.most_common(top)]
    lines += ["including callees:"]
    lines += [f"  {100 * n / total:5.1f}% {frame[:140]}" for frame, n in within.most_common(top)]
    return "\n".join(lines)


if __name__ == "__main__":  # python -m loadtest.host_usage PROFILE.txt...: what each py-spy profile spent its time in
    import sys

    print("\n\n".join(spy_report(path) for path in sys.argv[1:]))
