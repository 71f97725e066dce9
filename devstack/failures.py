"""How devstack fails: a check refused the start (nothing was started), or a child process failed.

Either way the user gets one `error:` line naming the cause and the fix; a child's failure adds the last error
lines of its log, where the reason is."""

from __future__ import annotations

import contextlib
import json
import re
import signal
from dataclasses import dataclass
from pathlib import Path

# tritonserver's error lines (glog: `E1129 05:16:27.1 ...`), the gateway's JSON error records, any other line
# that says error, failed or exception (a traceback's last line names its exception)
_ERROR_LINE = re.compile(r'^E\d{4} |"level":\s*"(error|critical)"|error|fail|exception', re.IGNORECASE)
LOG_LINES = 5
LINE_CHARS = 300


class StackError(Exception):
    """A failure devstack reports as one `error:` line (the message) and exits with `exit_code`."""

    exit_code = 1

    def report(self) -> list[str]:
        """The lines to print: the `error:` line, then any detail lines."""
        return [f"error: {self}"]


class CheckFailed(StackError):
    """A check before the start refused it (the repository, a port, a setting): nothing was started."""

    exit_code = 2


def _readable(line: str) -> str:
    """A JSON log record's message (the gateway's logs), else the line; shortened."""
    if line.startswith("{"):
        with contextlib.suppress(ValueError, AttributeError):
            line = str(json.loads(line).get("msg", line))
    return line if len(line) <= LINE_CHARS else line[:LINE_CHARS] + " ..."


def log_size(log_path: Path | None) -> int:
    """Where a child's run starts in its log (logs are appended to across runs)."""
    return log_path.stat().st_size if log_path is not None and log_path.is_file() else 0


def error_lines(log_path: Path | None, start: int = 0, count: int = LOG_LINES) -> list[str]:
    """The last `count` lines of a log from `start` on that report an error (its last lines when none does)."""
    if log_path is None or not log_path.is_file():
        return []
    with open(log_path, "rb") as log:
        log.seek(start)
        text = log.read().decode(errors="replace")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if _ERROR_LINE.search(line)] or lines
    return [_readable(line) for line in errors[-count:]]


@dataclass(frozen=True)
class ExitedChild:
    """A child process of the stack that exited: which one, its exit code, its log file (this run's part of it
    from `log_start` on)."""

    name: str
    code: int
    log_path: Path | None
    log_start: int = 0

    @property
    def how(self) -> str:
        if self.code < 0:
            return f"was killed by {signal.Signals(-self.code).name} (exit code {self.code})"
        return f"exited with code {self.code}"

    def __str__(self) -> str:
        return f"{self.name} {self.how}; log: {self.log_path or 'none'}"


class ChildFailed(StackError, RuntimeError):
    """A child process (tritonserver, the gateway) that exited, or did not get ready in time."""

    def __init__(self, message: str, log_path: Path | None, log_start: int = 0) -> None:
        super().__init__(message)
        self.log_path, self.log_start = log_path, log_start

    def report(self) -> list[str]:
        lines = error_lines(self.log_path, self.log_start)
        if not lines:
            return super().report()
        return [f"error: {self}; the last error lines of its log:", *(f"  {line}" for line in lines)]
