"""The count of a client's calls to Triton, for a close() that waits only when gRPC may still report on one."""

from __future__ import annotations

from collections.abc import Awaitable
from types import TracebackType
from typing import TypeVar

T = TypeVar("T")


class CallLedger:
    """The client's calls to Triton, counted: those in flight and those that ended in an exception (cancelled,
    past their deadline, failed). gRPC reports the end of such a call later, through its poller thread; close()
    waits for those reports only when there can be any."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.unclean = 0

    def __enter__(self) -> None:
        self.in_flight += 1

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.in_flight -= 1
        if exc_type is not None:
            self.unclean += 1

    async def track(self, call: Awaitable[T]) -> T:
        """Await `call`, counted (`with ledger:` around an await does the same without a coroutine more)."""
        with self:
            return await call

    @property
    def may_report_late(self) -> bool:
        return self.in_flight > 0 or self.unclean > 0
