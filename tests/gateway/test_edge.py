"""The edge (api/edge.py) with routes of the test's own, through both of its transports: the ASGI layer (api/asgi.py,
driven as an ASGI server drives it) and the HTTP protocol (gateway/http_protocol.py, a real uvicorn connection over
TCP). What the whole-gateway tests cannot reach on purpose: a handler that raises, a client that leaves mid-request,
the pause of a refusal, the connection's bounds and timeouts, pipelining and shutdown.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import orjson
import pytest
import uvicorn
from fastapi import APIRouter, FastAPI, Request
from prometheus_client import REGISTRY
from pydantic import BaseModel
from starlette.responses import Response
from starlette.types import Message, Scope
from uvicorn.server import ServerState

from gateway.api.asgi import EdgeLayer
from gateway.api.edge import Edge
from gateway.api.errors import install_error_handlers
from gateway.api.responses import OrjsonResponse
from gateway.api.route_table import RouteTable, runs
from gateway.errors import ErrorType, GatewayError
from gateway.http_protocol import EDGE_KEY, LIMITS_KEY, ConnectionLimits, GatewayHttpProtocol
from gateway.settings import GatewaySettings
from tests.fixtures.waiting import until

pytestmark = pytest.mark.anyio
RID = "rid-1"


class Echo(BaseModel):
    text: str


class Probe:
    """The test's app: POST /hot echoes `text` ("wait" holds it until `release`, "fail" raises, "busy" is a 503),
    POST /tei/{model}/hot the same under TEI's prefix, GET /healthz a probe, and the edge in front of them."""

    def __init__(self, **settings: Any) -> None:
        self.release = asyncio.Event()
        self.started = asyncio.Event()
        self.cancelled = False
        self.settings = GatewaySettings(triton_url="localhost:1", **settings)
        router = APIRouter()

        @router.post("/hot")
        async def hot(body: Echo, request: Request) -> Response:
            request.state.model = "m"
            return await self.answer(body.text)

        @router.post("/tei/{model}/hot")
        async def tei_hot(model: str, body: Echo, request: Request) -> Response:
            request.state.model = model
            return await self.answer(body.text)

        @router.get("/healthz")
        async def healthz() -> Response:
            return OrjsonResponse({"status": "ok"})

        self.app = FastAPI()
        install_error_handlers(self.app)
        self.app.include_router(router)
        self.edge = Edge(self.app, RouteTable(router.routes), self.settings)
        self.app.add_middleware(EdgeLayer, edge=self.edge)

    async def answer(self, text: str) -> Response:
        if text == "wait":
            self.started.set()
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled = True
                raise
        if text == "fail":
            raise RuntimeError("a bug")
        if text == "busy":
            raise GatewayError(ErrorType.OVERLOADED, "busy", retry_after_s=2)
        return OrjsonResponse({"echo": text})


# --- the ASGI transport ----------------------------------------------------------------------------------------
class Exchange:
    """One HTTP request as an ASGI server plays it: the body's messages, then `receive` waits until the client
    leaves (`leave()`) or the answer is complete, and reports `http.disconnect`, as uvicorn does."""

    def __init__(self, path: str = "/hot", chunks: tuple[bytes, ...] = (b'{"text": "a"}',),
                 headers: dict[str, str] | None = None, method: str = "POST") -> None:
        raw = {"x-request-id": RID, "content-type": "application/json", **(headers or {})}
        self.scope: Scope = {"type": "http", "method": method, "path": path, "query_string": b"",
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

    async def through(self, probe: Probe) -> None:
        await probe.app({**self.scope, "app": probe.app}, self.receive, self.send)

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


def access_log(caplog: pytest.LogCaptureFixture) -> list[tuple[str, int]]:
    return [(r.route, r.status) for r in caplog.records  # type: ignore[attr-defined]
            if r.name == "gateway.access" and r.getMessage() == "request"]


def counted(status: int) -> float:
    return REGISTRY.get_sample_value("gateway_requests_total", {"route": "/hot", "model": "m", "status": str(status)}) or 0.0


async def test_an_exception_in_a_handler_is_a_500_with_the_request_id(caplog: pytest.LogCaptureFixture) -> None:
    exchange = Exchange(chunks=(b'{"text": "fail"}',))
    with caplog.at_level(logging.INFO, logger="gateway.access"):
        await exchange.through(Probe())
    assert exchange.status == 500 and exchange.error() == {"type": "internal_error", "message": "internal error"}
    assert exchange.header("x-request-id") == RID
    logged = next(r for r in caplog.records if r.getMessage() == "unhandled error")
    assert logged.request_id == RID and logged.exc_info is not None  # type: ignore[attr-defined]
    assert str(logged.exc_info[1]) == "a bug"
    assert access_log(caplog) == [("/hot", 500)]


async def test_a_body_that_grows_past_the_limit_while_read_is_413() -> None:
    exchange = Exchange(chunks=(b"a" * 600, b"b" * 600, b"c"))  # no Content-Length
    await exchange.through(Probe(max_body_bytes=1024))
    assert exchange.status == 413 and exchange.header("connection") == "close"
    assert exchange.error() == {"type": "body_too_large", "message": "request body over the limit of 1024 bytes"}
    assert len(exchange.body) == 1  # the chunk after the one over the limit was never read


async def test_a_request_without_its_key_is_refused_before_the_body_limit_or_the_body() -> None:
    exchange = Exchange(headers={"content-length": str(10**9)})
    await exchange.through(Probe(api_keys=["k3y"], max_body_bytes=1024))
    assert exchange.status == 401 and exchange.error()["type"] == "authentication_error"
    assert len(exchange.body) == 1 and exchange.header("connection") == "close"  # its body was never read


async def test_a_client_that_leaves_has_its_work_cancelled_and_is_logged_499(caplog: pytest.LogCaptureFixture) -> None:
    probe, exchange = Probe(), Exchange(chunks=(b'{"text": "wait"}',))
    before = counted(499)
    with caplog.at_level(logging.INFO, logger="gateway.access"):
        request = asyncio.create_task(exchange.through(probe))
        await probe.started.wait()
        exchange.leave()
        await until(request.done, "the request ended")
        await request  # ended normally: nobody is left to answer
    assert probe.cancelled and exchange.sent == [] and probe.edge.in_flight.count == 0
    assert access_log(caplog) == [("/hot", 499)] and counted(499) - before == 1


async def test_the_disconnect_a_server_reports_after_a_complete_answer_cancels_nothing(
        caplog: pytest.LogCaptureFixture) -> None:
    exchange = Exchange()
    with caplog.at_level(logging.INFO, logger="gateway.access"):
        await exchange.through(Probe())
    assert exchange.status == 200 and access_log(caplog) == [("/hot", 200)]


async def test_a_cancel_that_is_not_a_disconnect_goes_on_unlogged(caplog: pytest.LogCaptureFixture) -> None:
    probe = Probe()
    with caplog.at_level(logging.INFO, logger="gateway.access"):
        request = asyncio.create_task(Exchange(chunks=(b'{"text": "wait"}',)).through(probe))
        await probe.started.wait()
        request.cancel()  # a server shutting down
        with pytest.raises(asyncio.CancelledError):
            await request
    assert access_log(caplog) == []


async def test_over_the_in_flight_bound_refusals_are_paced_429s_and_probes_pass() -> None:
    for pause_s in (0.0, 0.5):
        probe = Probe(max_in_flight=1, shed_pause_s=pause_s)
        holder = Exchange(chunks=(b'{"text": "wait"}',))
        holding = asyncio.create_task(holder.through(probe))
        await probe.started.wait()
        health = Exchange("/healthz", chunks=(b"",), method="GET")
        await health.through(probe)
        assert health.status == 200  # at the bound, a probe is still served
        refused = Exchange()
        refusal = asyncio.create_task(refused.through(probe))
        for _ in range(10):  # event-loop turns, no clock: the unpaced run below checks that they finish a refusal
            await asyncio.sleep(0)
        assert refusal.done() == (not pause_s)  # so a paced refusal is held by its pause's timer alone
        if pause_s:
            assert refused.sent == []  # paced: answered only after the pause
            refusal.cancel()
            with pytest.raises(asyncio.CancelledError):
                await refusal
        else:
            await refusal
            assert refused.status == 429 and refused.header("retry-after") == "1"
            assert refused.error() == {"type": "rate_limited", "message": "too many requests in flight"}
        probe.release.set()
        await holding
        assert holder.status == 200


async def test_errors_under_the_tei_prefix_take_teis_shape_and_are_logged_with_the_gateways_status(
        caplog: pytest.LogCaptureFixture) -> None:
    exchange = Exchange("/tei/x/hot", chunks=(b'{"text": "busy"}',))
    with caplog.at_level(logging.INFO, logger="gateway.access"):
        await exchange.through(Probe())
    body = b"".join(m.get("body", b"") for m in exchange.sent if m["type"] == "http.response.body")
    assert (exchange.status, orjson.loads(body)) == (429, {"error": "busy", "error_type": "Overloaded"})
    assert access_log(caplog) == [("/tei/{model}/hot", 503)]


def test_the_route_table_refuses_a_handler_it_cannot_serve() -> None:
    """No route is served another way: a POST handler whose parameters the edge cannot give fails at start."""
    router = APIRouter()

    @router.post("/q")
    async def with_query(body: Echo, request: Request, limit: int = 3) -> Response:
        return OrjsonResponse({})

    with pytest.raises(TypeError, match=r"POST /q .*parameter 'limit'"):
        RouteTable(router.routes)


def test_runs_marks_the_task_a_route_sheds_for() -> None:
    router = APIRouter()

    @router.post("/e")
    @runs("embed")
    async def embed(body: Echo, request: Request) -> Response:
        return OrjsonResponse({})

    @router.post("/t")
    async def tokenize(body: Echo, request: Request) -> Response:
        return OrjsonResponse({})

    table = RouteTable(router.routes)
    assert [(r.path, r.task) for r in (table.match("POST", "/e"), table.match("POST", "/t")) if r] == [
        ("/e", "embed"), ("/t", None)]
    assert table.match("GET", "/e") is None and table.match("POST", "/e/") is None


def test_new_request_ids_are_unique_within_a_process_and_across_a_fork() -> None:
    """Generated ids (a per-process prefix and a counter): 32 hex digits, no repeat within a worker, and a
    forked worker does not repeat its parent's (the prefix is drawn again in the child). The fork runs in a
    fresh interpreter of its own: forking this test process, with its gRPC threads, could hang the child."""
    import subprocess
    import sys

    from gateway.api.edge import request_id

    ids = [request_id([], b"x-request-id") for _ in range(1000)]
    assert len(set(ids)) == len(ids) and all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    code = (
        "import os\n"
        "from gateway.api.edge import request_id\n"
        "request_id([], b'x')\n"
        "read, write = os.pipe()\n"
        "if os.fork() == 0:\n"
        "    os.write(write, request_id([], b'x').encode()); os._exit(0)\n"
        "os.wait()\n"
        "print(os.read(read, 64).decode(), request_id([], b'x'))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    child, parent = done.stdout.split()
    assert re.fullmatch(r"[0-9a-f]{32}", child) and child[:16] != parent[:16], (child, parent)


def test_the_probe_paths_are_served_probes() -> None:
    from gateway.api.probes import PROBE_PATHS
    from gateway.api.routes import ops

    assert PROBE_PATHS <= {getattr(route, "path", "") for route in ops.routes}  # one constant, the routes' own paths


# --- the HTTP protocol -----------------------------------------------------------------------------------------
@asynccontextmanager
async def protocol_server(probe: Probe, direct: bool = True, **limits: Any) -> AsyncIterator[tuple[int, ServerState]]:
    """The gateway's protocol serving `probe` on 127.0.0.1 (the edge's routes itself with `direct`): its port and the
    server's state."""
    config = uvicorn.Config(app=probe.app, http=GatewayHttpProtocol, log_config=None, timeout_keep_alive=30)
    config.load()
    state = ServerState()
    app_state = {EDGE_KEY: probe.edge if direct else None, LIMITS_KEY: ConnectionLimits(**limits)}
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: GatewayHttpProtocol(config=config, server_state=state, app_state=app_state), "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], state
    finally:
        server.close()


def post(path: str, body: bytes, *, close: bool = False, headers: str = "", length: int | None = None) -> bytes:
    size = len(body) if length is None else length
    return (f"POST {path} HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: {size}\r\n"
            + headers + ("connection: close\r\n" if close else "") + "\r\n").encode() + body


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nhost: t\r\n\r\n".encode()


def answers(raw: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """The responses in `raw`, in order: (status, headers, body); bodies by their Content-Length."""
    out = []
    while raw:
        head, _, raw = raw.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = {name.lower(): value for name, value in (line.split(": ", 1) for line in lines[1:])}
        length = int(headers["content-length"])
        out.append((int(lines[0].split()[1]), headers, raw[:length]))
        raw = raw[length:]
    return out


async def until_closed(port: int, data: bytes) -> list[tuple[int, dict[str, str], bytes]]:
    """Send `data` at once (pipelined when it holds several requests); read until the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    raw = await asyncio.wait_for(reader.read(-1), 60)
    writer.close()
    return answers(raw)


@pytest.mark.parametrize("direct", [True, False], ids=["protocol", "asgi"])
async def test_both_transports_answer_and_log_alike(direct: bool, caplog: pytest.LogCaptureFixture) -> None:
    chunked = (b"POST /hot?x=1 HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ntransfer-encoding: chunked"
               b"\r\n\r\nf\r\n{\"text\": \"abc\"}\r\n0\r\n\r\n")
    probe = Probe(max_body_bytes=1024)
    with caplog.at_level(logging.INFO, logger="gateway.access"):
        async with protocol_server(probe, direct) as (port, _):
            got = await until_closed(port, b"".join([
                post("/hot", b'{"text": "a"}', headers="x-request-id: given-1\r\n"), get("/hot"), chunked,
                post("/tei/s%74/hot", b'{"text": "b"}'), post("/other", b"{}"), post("/hot", b'{"text": "fail"}'),
                post("/hot", b'{"text": "c"}', close=True)]))
    assert [(s, b) for s, _, b in got] == [
        (200, b'{"echo":"a"}'), (405, b'{"error":{"type":"method_not_allowed","message":"Method Not Allowed"}}'),
        (200, b'{"echo":"abc"}'), (200, b'{"echo":"b"}'),
        (404, b'{"error":{"type":"not_found","message":"Not Found"}}'),
        (500, b'{"error":{"type":"internal_error","message":"internal error"}}'), (200, b'{"echo":"c"}')]
    assert got[0][1]["x-request-id"] == "given-1" and re.fullmatch(r"[0-9a-f]{32}", got[6][1]["x-request-id"])
    assert sorted(got[0][1]) == ["content-length", "content-type", "x-request-id"]
    assert "connection" not in got[0][1] and got[6][1]["connection"] == "close"
    assert access_log(caplog) == [("/hot", 200), ("/hot", 405), ("/hot", 200), ("/tei/{model}/hot", 200),
                                  ("unmatched", 404), ("/hot", 500), ("/hot", 200)]


async def test_the_protocol_refuses_a_key_or_a_declared_size_on_the_head_and_closes() -> None:
    probe = Probe(api_keys=["k"], max_body_bytes=1024)
    async with protocol_server(probe) as (port, state):
        for head, status in ((post("/hot", b"", length=2 * 1024 * 1024), 401),  # no key, a body that never comes
                             (post("/hot", b"", length=4096, headers="authorization: Bearer k\r\n"), 413)):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(head)
            (answer,) = answers(await asyncio.wait_for(reader.read(-1), 60))  # answered, then closed
            writer.close()
            assert (answer[0], answer[1]["connection"]) == (status, "close")
        await until(lambda: not state.connections, "no connection is held")


async def test_a_client_that_leaves_is_cancelled_and_logged_499_by_the_protocol(
        caplog: pytest.LogCaptureFixture) -> None:
    probe = Probe()
    with caplog.at_level(logging.INFO, logger="gateway.access"):
        async with protocol_server(probe) as (port, _):
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(post("/hot", b'{"text": "wait"}'))
            await probe.started.wait()
            assert probe.edge.in_flight.count == 1
            writer.close()
            await until(lambda: access_log(caplog) == [("/hot", 499)], "the 499 is logged")
    assert probe.cancelled and probe.edge.in_flight.count == 0


async def test_pipelined_requests_are_answered_in_order_behind_a_direct_one() -> None:
    probe = Probe()
    async with protocol_server(probe) as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/hot", b'{"text": "wait"}') + get("/healthz") + post("/hot", b'{"text": "z"}', close=True))
        await probe.started.wait()
        probe.release.set()
        got = answers(await asyncio.wait_for(reader.read(-1), 60))
        writer.close()
    assert [(s, b) for s, _, b in got] == [(200, b'{"echo":"wait"}'), (200, b'{"status":"ok"}'), (200, b'{"echo":"z"}')]


async def test_a_graceful_shutdown_lets_the_request_finish_and_closes_the_connection() -> None:
    probe = Probe()
    async with protocol_server(probe) as (port, state):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(post("/hot", b'{"text": "wait"}'))
        await probe.started.wait()
        for connection in list(state.connections):
            connection.shutdown()  # what uvicorn does to every connection when it is asked to stop
        probe.release.set()
        got = answers(await asyncio.wait_for(reader.read(-1), 60))  # the server closes after the answer
        writer.close()
    assert [(s, h.get("connection"), b) for s, h, b in got] == [(200, "close", b'{"echo":"wait"}')]


@pytest.mark.parametrize("head", [
    b"POST /hot HTTP/1.1\r\nhost: t\r\nx-big: " + b"a" * 200_000 + b"\r\n\r\n",  # one endless header
    b"POST /hot HTTP/1.1\r\nhost: t\r\n" + b"".join(b"x-%d: 1\r\n" % i for i in range(150)) + b"\r\n",  # many
    b"GET /" + b"a" * 100_000 + b" HTTP/1.1\r\n\r\n",  # a long target
], ids=["header bytes", "header count", "target"])
async def test_a_head_past_its_bound_is_431_and_the_connection_closes(head: bytes) -> None:
    async with protocol_server(Probe(), max_header_bytes=16 * 1024, max_headers=100) as (port, _):
        (answer,) = await until_closed(port, head)
    assert answer[0] == 431 and answer[1]["connection"] == "close"
    assert orjson.loads(answer[2])["error"]["type"] == "headers_too_large"


async def test_slow_or_silent_clients_are_timed_out_and_their_connections_closed() -> None:
    """A connection that sends nothing is closed; a head sent slowly, a body that stops short and a chunked body that
    never ends are answered 408 and closed. (The timeouts are short here; the waits only bound a hang.)"""
    probe = Probe(body_timeout_s=0.3)
    async with protocol_server(probe, header_timeout_s=0.3) as (port, state):
        silent = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(silent[0].read(-1), 60) == b""  # closed without a word
        got = []
        for start in (b"POST /hot HTTP/1.1\r\nhost: t\r\ncontent-len",  # a head that stops
                      post("/hot", b'{"text": ', length=100),  # a body that stops short
                      b"POST /hot HTTP/1.1\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
                      b"5\r\n{\"tex\r\n"):  # a chunked body that never ends
            got += await until_closed(port, start)
        await until(lambda: not state.connections, "no connection is held")
    assert [(s, h["connection"], orjson.loads(b)["error"]["type"]) for s, h, b in got] == [
        (408, "close", "request_timeout")] * 3


async def test_a_connection_over_the_bound_is_refused() -> None:
    async with protocol_server(Probe(), max_connections=1) as (port, _):
        first = await asyncio.open_connection("127.0.0.1", port)
        (answer,) = await until_closed(port, get("/healthz"))
        first[1].write(get("/healthz"))
        assert (await first[0].readuntil(b'{"status":"ok"}')).startswith(b"HTTP/1.1 200")
        first[1].close()
    assert (answer[0], orjson.loads(answer[2])["error"]["type"]) == (503, "too_many_connections")
