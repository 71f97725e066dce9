"""The gateway's ASGI layers (api/middleware.py), stacked as the app factory stacks them, around small
ASGI apps: the behaviour the whole-gateway tests cannot reach on purpose (an exception in a route, a
client that leaves mid-request, the pause of a refusal)."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
import pytest
from prometheus_client import REGISTRY
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.api.hot import HotRoutes
from gateway.api.middleware import InFlight
from gateway.api.shedding import SheddingGate
from gateway.app import request_layers
from gateway.settings import GatewaySettings
from tests.fixtures.waiting import until

pytestmark = pytest.mark.anyio
RID = "rid-1"


def layer_args(settings: GatewaySettings) -> tuple[GatewaySettings, InFlight, dict[str, Any]]:
    return settings, InFlight(settings.max_in_flight), {}


def stack(inner: ASGIApp, **settings: Any) -> ASGIApp:
    """`inner` inside the gateway's own layers, in the app factory's order."""
    app = inner
    for cls, args, kwargs in reversed(request_layers(*layer_args(GatewaySettings(triton_url="localhost:1", **settings)))):
        if cls not in (SheddingGate, HotRoutes):
            app = cls(app, *args, **kwargs)
    return app


class Exchange:
    """One HTTP request as an ASGI server plays it: the body's messages, then `receive` waits until the client
    leaves (`leave()`) or the answer is complete, and reports `http.disconnect`, as uvicorn does."""

    def __init__(self, path: str = "/embed", chunks: tuple[bytes, ...] = (b"{}",), headers: dict[str, str] | None = None,
                 method: str = "POST") -> None:
        raw = {"x-request-id": RID, **(headers or {})}
        self.scope: Scope = {"type": "http", "method": method, "path": path,
                             "headers": [(k.encode(), v.encode()) for k, v in raw.items()]}
        self.body = [{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1} for i, c in enumerate(chunks)]
        self.gone = asyncio.Event()
        self.sent: list[Message] = []
        self.disconnects = 0

    def leave(self) -> None:
        self.gone.set()

    async def receive(self) -> Message:
        if self.body:
            return self.body.pop(0)
        await self.gone.wait()
        self.disconnects += 1
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        self.sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self.gone.set()  # the answer is complete: the server reports a disconnect from now on

    async def through(self, app: ASGIApp) -> None:
        await app(self.scope, self.receive, self.send)

    @property
    def status(self) -> int:
        starts = [m for m in self.sent if m["type"] == "http.response.start"]
        assert len(starts) == 1, self.sent
        return int(starts[0]["status"])

    def header(self, name: str) -> str | None:
        start = next(m for m in self.sent if m["type"] == "http.response.start")
        return next((v.decode() for k, v in start["headers"] if k.decode().lower() == name), None)

    def error(self) -> dict[str, str]:
        body = b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")
        return dict(orjson.loads(body)["error"])


async def read_body(receive: Receive) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body", False):
            return body


async def answer(send: Send, status: int = 200) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})


def access_log(caplog: pytest.LogCaptureFixture) -> list[int]:
    return [r.status for r in caplog.records if r.name == "gateway.access" and r.getMessage() == "request"]


def counted(status: int) -> float:
    return REGISTRY.get_sample_value("gateway_requests_total", {"route": "/embed", "model": "", "status": str(status)}) or 0.0


async def test_an_exception_before_the_answer_is_a_500_with_the_request_id(caplog: pytest.LogCaptureFixture) -> None:
    async def failing(scope: Scope, receive: Receive, send: Send) -> None:
        await read_body(receive)
        raise RuntimeError("a bug")

    exchange = Exchange()
    with caplog.at_level(logging.INFO, logger="gateway.access"):
        await exchange.through(stack(failing))
    assert exchange.status == 500 and exchange.error() == {"type": "internal_error", "message": "internal error"}
    assert exchange.header("x-request-id") == RID
    logged = next(r for r in caplog.records if r.getMessage() == "unhandled error")
    assert logged.request_id == RID and logged.exc_info is not None  # type: ignore[attr-defined]
    assert str(logged.exc_info[1]) == "a bug"
    assert access_log(caplog) == [500]


async def test_an_exception_after_the_answer_started_sends_nothing_more(caplog: pytest.LogCaptureFixture) -> None:
    async def failing_late(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        raise RuntimeError("a bug while streaming")

    exchange = Exchange()
    with caplog.at_level(logging.INFO, logger="gateway.access"):
        await exchange.through(stack(failing_late))
    assert exchange.status == 200 and len(exchange.sent) == 1 and exchange.header("x-request-id") == RID
    assert access_log(caplog) == [200]


async def test_a_body_that_grows_past_the_limit_while_read_is_413() -> None:
    seen: list[bytes] = []

    async def reader(scope: Scope, receive: Receive, send: Send) -> None:
        while True:  # as api/hot.py reads a body
            message = await receive()
            seen.append(message["body"])
            if not message.get("more_body", False):
                break
        await answer(send)

    exchange = Exchange(chunks=(b"a" * 600, b"b" * 600, b"c"))  # no Content-Length
    await exchange.through(stack(reader, max_body_bytes=1024))
    assert exchange.status == 413
    assert exchange.error() == {"type": "body_too_large", "message": "request body over the limit of 1024 bytes"}
    assert seen == [b"a" * 600]  # the chunk over the limit never reached the app


async def test_a_request_without_its_key_is_refused_before_the_body_limit_or_the_body() -> None:
    async def unreachable(scope: Scope, receive: Receive, send: Send) -> None:
        raise AssertionError("the app was called")

    exchange = Exchange(headers={"content-length": str(10**9)})
    await exchange.through(stack(unreachable, api_keys=["k3y"], max_body_bytes=1024))
    assert exchange.status == 401 and exchange.error()["type"] == "authentication_error"
    assert len(exchange.body) == 1  # its body was never read


async def test_a_client_that_leaves_has_its_work_cancelled_and_is_logged_499(caplog: pytest.LogCaptureFixture) -> None:
    working, cancelled = asyncio.Event(), asyncio.Event()

    async def slow(scope: Scope, receive: Receive, send: Send) -> None:
        await read_body(receive)
        working.set()
        try:
            await asyncio.Event().wait()  # a Triton call that never ends
        except asyncio.CancelledError:
            cancelled.set()
            raise

    exchange = Exchange()
    before = counted(499)
    with caplog.at_level(logging.INFO, logger="gateway.access"):
        request = asyncio.create_task(exchange.through(stack(slow)))
        await working.wait()
        exchange.leave()
        await until(request.done, "the request ended")
        await request  # ended normally: nobody is left to answer
    assert cancelled.is_set() and exchange.sent == []
    assert access_log(caplog) == [499] and counted(499) - before == 1


async def test_the_disconnect_a_server_reports_after_a_complete_answer_cancels_nothing(
        caplog: pytest.LogCaptureFixture) -> None:
    after_answer: list[str] = []
    exchange = Exchange()

    async def answers_then_tidies(scope: Scope, receive: Receive, send: Send) -> None:
        await read_body(receive)
        await answer(send)
        await until(lambda: exchange.disconnects == 1, "the watcher told the client is gone")
        await asyncio.sleep(0)  # a cancel, had one been asked, would land here
        after_answer.append("tidied")

    with caplog.at_level(logging.INFO, logger="gateway.access"):
        await exchange.through(stack(answers_then_tidies))
    assert exchange.status == 200 and after_answer == ["tidied"]
    assert access_log(caplog) == [200]


async def test_a_cancel_that_is_not_a_disconnect_goes_on_unlogged(caplog: pytest.LogCaptureFixture) -> None:
    working = asyncio.Event()

    async def slow(scope: Scope, receive: Receive, send: Send) -> None:
        await read_body(receive)
        working.set()
        await asyncio.Event().wait()

    with caplog.at_level(logging.INFO, logger="gateway.access"):
        request = asyncio.create_task(Exchange().through(stack(slow)))
        await working.wait()
        request.cancel()  # a server shutting down
        with pytest.raises(asyncio.CancelledError):
            await request
    assert access_log(caplog) == []


async def test_over_the_in_flight_bound_refusals_are_paced_429s_and_probes_pass() -> None:
    release = asyncio.Event()

    async def held(scope: Scope, receive: Receive, send: Send) -> None:
        await read_body(receive)
        if scope["path"] == "/embed":
            await release.wait()
        await answer(send)

    for pause_s in (0.0, 0.5):
        app = stack(held, max_in_flight=1, shed_pause_s=pause_s)
        holder = Exchange()
        holding = asyncio.create_task(holder.through(app))
        await until(lambda: not holder.body, "the holder's body read: it holds the one place")
        probe = Exchange("/healthz", method="GET")
        await probe.through(app)
        assert probe.status == 200  # at the bound, a probe is still served
        refused = Exchange()
        refusal = asyncio.create_task(refused.through(app))
        for _ in range(10):  # event-loop turns, no clock: the unpaced run below checks that they finish a refusal
            await asyncio.sleep(0)
        assert refusal.done() == (not pause_s)  # so a paced refusal is held by its pause's timer alone
        if pause_s:
            assert not refusal.done() and refused.sent == []  # paced: answered only after the pause
            refusal.cancel()
            with pytest.raises(asyncio.CancelledError):
                await refusal
        else:
            await refusal
            assert refused.status == 429 and refused.header("retry-after") == "1"
            assert refused.error() == {"type": "rate_limited", "message": "too many requests in flight"}
        release.set()
        await holding
        release.clear()
        assert holder.status == 200


def test_the_probe_paths_are_served_probes() -> None:
    from gateway.api.probes import PROBE_PATHS
    from gateway.api.routes import ops

    assert PROBE_PATHS <= {getattr(route, "path", "") for route in ops.routes}  # one constant, the routes' own paths


def test_new_request_ids_are_unique_within_a_process_and_across_a_fork() -> None:
    """Generated ids (a per-process prefix and a counter): 32 hex digits, no repeat within a worker, and a
    forked worker does not repeat its parent's (the prefix is drawn again in the child). The fork runs in a
    fresh interpreter of its own: forking this test process, with its gRPC threads, could hang the child."""
    import re
    import subprocess
    import sys

    from gateway.api.middleware import request_id

    scope: Scope = {"headers": []}
    ids = [request_id(scope, b"x-request-id") for _ in range(1000)]
    assert len(set(ids)) == len(ids) and all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    code = (
        "import os\n"
        "from gateway.api.middleware import request_id\n"
        "request_id({'headers': []}, b'x')\n"
        "read, write = os.pipe()\n"
        "if os.fork() == 0:\n"
        "    os.write(write, request_id({'headers': []}, b'x').encode()); os._exit(0)\n"
        "os.wait()\n"
        "print(os.read(read, 64).decode(), request_id({'headers': []}, b'x'))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    child, parent = done.stdout.split()
    assert re.fullmatch(r"[0-9a-f]{32}", child) and child[:16] != parent[:16], (child, parent)
