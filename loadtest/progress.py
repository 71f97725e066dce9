"""A live progress line for long sweeps (rich), silent when stderr is not a terminal unless forced."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from loadtest.runner import Progress as Callback


@contextmanager
def sweep_progress(
    total_s: float, enabled: bool | None = None
) -> Iterator[tuple[Callback, Callable[[str, float], None]]]:
    """Yield (callback for the runner, function that names the current step)."""
    console = Console(stderr=True)
    on = sys.stderr.isatty() if enabled is None else enabled
    bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"),
                   TimeElapsedColumn(), console=console, disable=not on, transient=False)
    task = bar.add_task("load", total=total_s, info="")
    state = {"base": 0.0, "step_s": 0.0}

    def callback(done: int, elapsed: float) -> None:
        info = f"{done} requests" if done >= 0 else ""
        bar.update(task, completed=state["base"] + min(elapsed, state["step_s"]), info=info)

    def name_step(label: str, step_s: float) -> None:
        state["base"] += state["step_s"]
        state["step_s"] = step_s
        bar.update(task, description=label)

    with bar:
        yield callback, name_step
