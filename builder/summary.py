"""The build's last lines: what each model was built for, a warning when this machine cannot serve it, and the
whole command's time."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

from builder.machine import LOCAL_BUILD
from builder.settings import ResolvedSettings

if TYPE_CHECKING:  # builder.build imports torch: this module does not need it
    from builder.build import BuildOutcome


def target(settings: ResolvedSettings) -> str:
    return f"runtime {settings.runtime}, device {settings.device}, formats {','.join(settings.formats)}"


def outcome_line(outcome: BuildOutcome) -> str:
    built_for = f" for {target(outcome.settings)}" if outcome.settings else ""
    if outcome.skipped:
        return f"{outcome.name}: up to date, nothing to do ({', '.join(outcome.entries)}){built_for}"
    return f"{outcome.name}: built {', '.join(outcome.entries)} as version {outcome.version}{built_for}"


def warnings(outcomes: list[BuildOutcome], gpus: int) -> list[str]:
    """A warning for each model built for a GPU when this machine has none (`gpus`): no Triton here can load it."""
    on_gpu = [o.name for o in outcomes if o.settings and o.settings.device == "gpu"]
    if not on_gpu or gpus:
        return []
    return [f"warning: {', '.join(on_gpu)} built for a GPU (--device gpu, the default) and this machine has none: "
            f"no Triton here can load it. To serve it on this machine, build with {LOCAL_BUILD} (python -m devstack), "
            "or --device cpu for the Compose CPU stack (compose.cpu.yaml)"]


def last_line(outcomes: list[BuildOutcome], repository: Path, seconds: float) -> str:
    """The whole command's time (`command_seconds`), and what it did to `repository`."""
    built = sum(not o.skipped for o in outcomes)
    what = f"built {built} model{'s' * (built != 1)} into" if built else "nothing to build in"
    return f"done in {seconds:.1f}s: {what} {repository}"


def command_seconds(main_started: float) -> float:
    """How long this process has run, interpreter start and imports included (Linux /proc); elsewhere, since
    `main_started` (a time.monotonic())."""
    try:
        started_ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return time.monotonic() - main_started
    return uptime - started_ticks / os.sysconf("SC_CLK_TCK")
