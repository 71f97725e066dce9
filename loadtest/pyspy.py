"""py-spy on a running process (a gateway worker under load): sample it, summarise the stacks by function, or say
where the samples inside one call go (`python -m loadtest.pyspy RAW --inside FRAME`)."""

from __future__ import annotations

import collections
import gzip
import subprocess
from collections.abc import Iterator
from pathlib import Path


def profile(pid: int, seconds: float, raw: Path, top: int = 25) -> list[str]:
    """`py-spy record` of `pid` for `seconds` at 200 Hz into `raw` (collapsed stacks), summarised by `summary`;
    one line saying why when py-spy fails."""
    spy = subprocess.run(["py-spy", "record", "--pid", str(pid), "--duration", str(int(seconds)), "--rate", "200",
                          "--format", "raw", "--nonblocking", "-o", str(raw)], capture_output=True, text=True,
                         check=False)
    return summary(raw, top) if raw.exists() else [f"py-spy failed: {spy.stderr[-500:]}"]


def summary(raw: Path, top: int = 25) -> list[str]:
    """py-spy raw (collapsed) stacks (plain or .gz) -> lines 'self% total% function (file:line)', then by inclusive
    time."""
    self_c: collections.Counter[str] = collections.Counter()
    total_c: collections.Counter[str] = collections.Counter()
    samples = 0
    for frames, n in _stacks(raw):
        samples += n
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


def _named(frame: str) -> bool:
    return not frame.startswith("0x")  # a bare address: a native frame without symbols


def _stacks(raw: Path) -> Iterator[tuple[list[str], int]]:
    """(frames, outermost first; samples) of each line of a py-spy raw profile, plain or .gz."""
    text = gzip.decompress(raw.read_bytes()).decode() if raw.suffix == ".gz" else raw.read_text()
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            yield stack.split(";"), int(count)


def inside(raw: Path, frame: str, top: int = 25) -> list[str]:
    """Of py-spy raw stacks (plain or .gz; with --idle, the waits too): the share of samples whose stack has a frame
    containing `frame` (e.g. `TritonPythonModel.execute`); within those, the deepest frame with a name (native
    frames without symbols are skipped) by share, then each frame below `frame` by inclusive share. Where a call's
    time goes, waits included, when `frame` is the call."""
    within: collections.Counter[str] = collections.Counter()
    below: collections.Counter[str] = collections.Counter()
    samples = matched = 0
    for frames, n in _stacks(raw):
        samples += n
        first = next((i for i, f in enumerate(frames) if frame in f), None)
        if first is None:
            continue
        matched += n
        named = [f for f in frames if _named(f)]
        within[named[-1] if named else "(no named frame)"] += n
        for f in set(frames[first + 1:]):
            if _named(f):
                below[f] += n
    if not matched:
        return [f"{samples} samples, none inside {frame}"]
    out = [f"{samples} samples; {matched / samples:.1%} inside {frame}; deepest named frame, % of those:"]
    out += [f"{n / matched:6.1%}  {f}" for f, n in within.most_common(top)]
    out += ["", f"frames below {frame}, inclusive, % of those:"]
    out += [f"{n / matched:6.1%}  {f}" for f, n in below.most_common(top)]
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m loadtest.pyspy", description="Summarise a py-spy raw profile.")
    parser.add_argument("raw", type=Path, help="py-spy --format raw output (plain or .gz)")
    parser.add_argument("--inside", metavar="FRAME", help="where the samples inside FRAME go (else: self and inclusive)")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    lines = inside(args.raw, args.inside, args.top) if args.inside else summary(args.raw, args.top)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
