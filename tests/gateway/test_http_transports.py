"""The edge's two transports (gateway/http_protocol.py and api/asgi.py) give the whole gateway the same answers.

The gateway against a real tritonserver, served by uvicorn in-process with GATEWAY_DIRECT_ROUTES on (the protocol
hands the edge the POSTs of its routes) and off (every request through the ASGI app): the same requests (the
gateway's own routes, and TEI's under /tei/{model} with every error kind in TEI's shape) get the same answers,
access-log lines and request metrics, and with it on, no POST of a route reaches the ASGI app. The edge's own
behaviour with small routes of a test's is tests/gateway/test_edge.py.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import orjson
import pytest
import uvicorn
from fastapi import FastAPI
from opentelemetry.sdk.trace import TracerProvider
from starlette.types import Receive, Scope, Send

from devstack.tritonserver import TritonServer
from gateway.api import tei
from gateway.api.edge import Edge
from gateway.app import create_app
from gateway.http_protocol import EDGE_KEY, GatewayHttpProtocol
from gateway.service.admission import MIN_CALLS, ServiceTime
from gateway.settings import GatewaySettings
from tests.fixtures.metrics import metric
from tests.fixtures.waiting import until

pytestmark = pytest.mark.anyio


# --- the whole gateway, direct routes on and off -----------------------------------------------------------------
class SeenByStack:
    """Wraps the app's ASGI stack: the (method, path) of every request that reaches it."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: list[tuple[str, str]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.seen.append((scope["method"], scope["path"]))
        await self.app(scope, receive, send)


@asynccontextmanager
async def uvicorn_gateway(triton: TritonServer, **settings: Any
                          ) -> AsyncIterator[tuple[httpx.AsyncClient, SeenByStack, FastAPI]]:
    """The gateway app under a real uvicorn in this process (the protocol `python -m gateway` serves with)."""
    app = create_app(GatewaySettings(triton_url=triton.grpc_url, triton_http_url=triton.http_address, **settings))
    stack = SeenByStack(app.build_middleware_stack())
    app.middleware_stack = stack  # type: ignore[assignment]
    config = uvicorn.Config(app=app, host="127.0.0.1", port=0, http=GatewayHttpProtocol, log_config=None,
                            lifespan="on")
    server = uvicorn.Server(config)
    task = asyncio.get_running_loop().create_task(server.serve())
    try:
        await until(lambda: server.started or task.done(), "uvicorn started")
        port = server.servers[0].sockets[0].getsockname()[1]
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            yield client, stack, app
    finally:
        server.should_exit = True
        await task


Battery = list[tuple[str, str, dict[str, Any]]]  # (name, path, httpx arguments)
Setup = Callable[[FastAPI], AbstractContextManager[None]]  # the gateway's state while a request of the battery is sent
Answer = tuple[int, list[tuple[str, str]], bytes]  # status, headers (`_headers`), body

KEY = {"authorization": "Bearer k1"}
JSON = {**KEY, "content-type": "application/json"}
REQUESTS: Battery = [
    ("embed", "/embed", {"json": {"inputs": ["hello world", "a second text"]}, "headers": KEY}),
    ("embed one, own id", "/embed", {"json": {"inputs": "hello", "normalize": False},
                                     "headers": {**KEY, "x-request-id": "mine-1"}}),
    ("classify", "/classify", {"json": {"inputs": ["good", "bad"]}, "headers": KEY}),
    ("openai", "/v1/embeddings", {"json": {"input": ["hello"], "model": "tinyemb"}, "headers": KEY}),
    ("tokenize", "/tokenize", {"json": {"inputs": "hello world", "model": "tinyemb"}, "headers": KEY}),
    ("no key", "/embed", {"json": {"inputs": "x"}}),
    ("text/plain", "/embed", {"content": b'{"inputs": "x"}', "headers": {**KEY, "content-type": "text/plain"}}),
    ("bad json", "/embed", {"content": b"{nope", "headers": JSON}),
    ("array body", "/embed", {"json": ["x"], "headers": KEY}),
    ("invalid field", "/embed", {"json": {"inputs": "x", "dimensions": 0}, "headers": KEY}),
    ("unknown model", "/embed", {"json": {"inputs": "x", "model": "nope"}, "headers": KEY}),
    ("too long", "/embed", {"json": {"inputs": "word " * 200, "truncate": False}, "headers": KEY}),
    ("body over the limit", "/embed", {"json": {"inputs": "y" * 5000}, "headers": KEY}),
    ("query string", "/embed?x=1", {"json": {"inputs": "x"}, "headers": KEY}),
    ("chunked", "/embed", {"content": [b'{"inputs": ', b'"x"}'], "headers": JSON}),
]


async def _chunks(parts: list[bytes]) -> AsyncIterator[bytes]:
    for part in parts:  # a body of no declared size: httpx sends it chunked
        yield part


def _headers(response: httpx.Response) -> list[tuple[str, str]]:
    """The answer's headers in order, with what differs between two servers masked: the date, a generated request id,
    the length of a body (compared itself), the port in a redirect's location."""
    def value(name: str, value: str) -> str:
        generated = name == "x-request-id" and re.fullmatch("[0-9a-f]{32}", value)
        return "*" if name in ("date", "content-length") or generated else re.sub(r":\d+/", ":*/", value)
    return [(name, value(name, v)) for name, v in response.headers.multi_items()]


@contextmanager
def _as_is(_: FastAPI) -> Iterator[None]:
    yield


async def _battery(client: httpx.AsyncClient, app: FastAPI, requests: Battery, setups: dict[str, Setup]
                   ) -> dict[str, Answer]:
    out = {}
    for name, path, kwargs in requests:
        if isinstance(kwargs.get("content"), list):
            kwargs = {**kwargs, "content": _chunks(kwargs["content"])}
        with setups.get(name, _as_is)(app):
            response = await client.post(path, **kwargs)
        out[name] = (response.status_code, _headers(response), response.content)
    return out


def _close(a: Any, b: Any) -> bool:
    """Equal JSON, floats to 1e-6 (both servers share one Triton, but not its batches)."""
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) <= 1e-6
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k]) for k in a)
    return bool(a == b)


async def _scrape(client: httpx.AsyncClient) -> str:
    return (await client.get("/metrics")).text


COUNTED = ("gateway_requests_total{", "gateway_errors_total{", "gateway_tokens_total{",
           "gateway_request_duration_seconds_count{", "gateway_inputs_per_request_count{",
           "gateway_inputs_per_request_sum{")


def _growth(before: str, after: str) -> dict[str, float]:
    """The request, error and token series that grew from one scrape to the next, and by how much."""
    def samples(text: str) -> dict[str, float]:
        return {head: float(value) for head, _, value in (line.rpartition(" ") for line in text.splitlines())
                if head.startswith(COUNTED)}
    old, new = samples(before), samples(after)
    return {series: value - old.get(series, 0.0) for series, value in new.items() if value != old.get(series, 0.0)}


def _total(growth: dict[str, float], name: str, **labels: str) -> float:
    return metric("\n".join(f"{series} {value}" for series, value in growth.items()), name, **labels)


class Run(NamedTuple):
    answers: dict[str, Answer]
    logs: list[tuple[Any, ...]]  # access-log lines: (method, path, route, model, status, the request id given)
    failures: list[str]  # the request ids of logged unhandled errors
    growth: dict[str, float]  # `_growth` over the battery
    seen: list[str]  # the paths of the POSTs that reached the ASGI stack


async def _on_and_off(triton: TritonServer, caplog: pytest.LogCaptureFixture, requests: Battery,
                      setups: dict[str, Setup] | None = None, **settings: Any) -> dict[bool, Run]:
    """The battery sent to a gateway with the direct routes on, then to one with them off."""
    runs = {}
    for direct in (True, False):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="gateway.access"):
            async with uvicorn_gateway(triton, direct_routes=direct, **settings) as (client, stack, app):
                before = await _scrape(client)
                answers = await _battery(client, app, requests, setups or {})
                after = await _scrape(client)
        records: list[Any] = [r for r in caplog.records if r.name == "gateway.access"]
        logs = [(r.method, r.path, r.route, r.model, r.status, r.request_id if "-" in r.request_id else "*")
                for r in records if r.getMessage() == "request" and r.route != "/metrics"]
        failures = [r.request_id for r in records if r.getMessage() == "unhandled error"]
        runs[direct] = Run(answers, logs, failures, _growth(before, after), [p for m, p in stack.seen if m == "POST"])
    return runs


def _assert_the_same(runs: dict[bool, Run]) -> None:
    on, off = runs[True], runs[False]
    for name, (status, headers, body) in on.answers.items():
        assert (status, headers) == off.answers[name][:2], name
        assert body == off.answers[name][2] or status == 200 and _close(orjson.loads(body),
                                                                         orjson.loads(off.answers[name][2])), name
    assert on.logs == off.logs and len(on.logs) == len(on.answers)
    assert on.failures == off.failures
    assert on.growth == off.growth


async def test_the_gateway_answers_logs_and_counts_the_same_through_either_transport(
        triton_server: TritonServer, python_repository: Path, caplog: pytest.LogCaptureFixture) -> None:
    runs = await _on_and_off(triton_server, caplog, REQUESTS, api_keys=["k1"], max_body_bytes=4096,
                             repository=str(python_repository), shm_prefix="gwdirect")
    _assert_the_same(runs)
    on = runs[True].answers
    assert on["embed"][0] == 200 and on["no key"][0] == 401 and on["body over the limit"][0] == 413
    assert on["chunked"][0] == 200
    assert _total(runs[True].growth, "gateway_requests_total", route="/embed", status="200") == 4
    # With it on, no POST of a route reaches the ASGI app (a query string, a chunked body and one over the limit
    # included). Off, every POST does.
    assert runs[True].seen == []
    assert len(runs[False].seen) == len(REQUESTS)


# --- TEI's routes (/tei/{model}/...), direct routes on and off ------------------------------------------------------
BOOM = "a text the handler fails on"
TEI_REQUESTS: Battery = [
    ("embed", "/tei/st/embed", {"json": {"inputs": "hello world"}, "headers": KEY}),
    ("embed two, own id", "/tei/st/embed", {"json": {"inputs": ["hello", "a second text"], "normalize": False,
                                                     "prompt_name": "query"},
                                            "headers": {**KEY, "x-request-id": "mine-1"}}),
    ("predict", "/tei/nli/predict", {"json": {"inputs": ["a premise", "a hypothesis"]}, "headers": KEY}),
    ("predict a batch", "/tei/nli/predict", {"json": {"inputs": [["a", "b"], ["c", "d"]], "raw_scores": True},
                                             "headers": KEY}),
    ("rerank", "/tei/reranker/rerank", {"json": {"query": "what is it", "texts": ["a thing", "this"],
                                                 "return_text": True}, "headers": KEY}),
    ("compat embed", "/tei/st", {"json": {"inputs": "hello"}, "headers": KEY}),
    ("vertex", "/tei/st/vertex", {"json": {"instances": [{"inputs": "hello"}, {"inputs": ["a", "b"]}]},
                                  "headers": KEY}),
    ("vertex wrong task", "/tei/st/vertex", {"json": {"instances": [{"query": "q", "texts": ["t"]}]}, "headers": KEY}),
    ("similarity", "/tei/st/similarity", {"json": {"inputs": {"source_sentence": "q", "sentences": ["a", "b"]}},
                                          "headers": KEY}),
    ("compat similarity", "/tei/st", {"json": {"inputs": {"source_sentence": "q", "sentences": ["a"]}},
                                      "headers": KEY}),
    ("compat predict, the hub's parameters", "/tei/nli", {"json": {"inputs": ["a", "b"], "parameters": {}},
                                                          "headers": KEY}),
    ("compat rerank", "/tei/reranker", {"json": {"query": "q", "texts": ["a", "b"]}, "headers": KEY}),
    ("tokenize", "/tei/st/tokenize", {"json": {"inputs": "hello world"}, "headers": KEY}),
    ("decode", "/tei/st/decode", {"json": {"ids": [5, 6, 7]}, "headers": KEY}),
    ("openai", "/tei/st/v1/embeddings", {"json": {"input": ["hello", "world"], "model": "x"}, "headers": KEY}),
    ("openai, no v1", "/tei/st/embeddings", {"json": {"input": "hello", "encoding_format": "base64"},
                                             "headers": KEY}),
    # errors: in TEI's shape
    ("no key", "/tei/st/embed", {"json": {"inputs": "x"}}),
    ("wrong key", "/tei/st/tokenize", {"json": {"inputs": "x"}, "headers": {"authorization": "Bearer k2"}}),
    ("unknown model", "/tei/nope/embed", {"json": {"inputs": "x"}, "headers": KEY}),
    ("compat unknown model", "/tei/nope", {"json": {"inputs": "x"}, "headers": KEY}),
    ("wrong task", "/tei/st/rerank", {"json": {"query": "q", "texts": ["a"]}, "headers": KEY}),
    ("openai wrong task", "/tei/nli/v1/embeddings", {"json": {"input": "x"}, "headers": KEY}),
    ("openai unknown model", "/tei/nope/embeddings", {"json": {"input": "x"}, "headers": KEY}),
    ("openai invalid field", "/tei/st/v1/embeddings", {"json": {"input": []}, "headers": KEY}),
    ("openai no key", "/tei/st/v1/embeddings", {"json": {"input": "x"}}),
    ("no sparse output", "/tei/st/embed_sparse", {"json": {"inputs": "x"}, "headers": KEY}),
    ("no per-token output", "/tei/nli/embed_all", {"json": {"inputs": "x"}, "headers": KEY}),
    ("empty sentences", "/tei/st/similarity", {"json": {"inputs": {"source_sentence": "q", "sentences": []}},
                                               "headers": KEY}),
    ("bad json", "/tei/st/embed", {"content": b"{nope", "headers": JSON}),
    ("compat bad json", "/tei/st", {"content": b"{nope", "headers": JSON}),
    ("invalid field", "/tei/st/embed", {"json": {"inputs": "x", "normalize": "yes"}, "headers": KEY}),
    ("compat invalid field", "/tei/reranker", {"json": {"query": "q"}, "headers": KEY}),
    ("text/plain", "/tei/st/embed", {"content": b'{"inputs": "x"}', "headers": {**KEY, "content-type": "text/plain"}}),
    ("compat text/plain", "/tei/st", {"content": b'{"inputs": "x"}', "headers": {**KEY, "content-type": "text/plain"}}),
    ("no content type", "/tei/st/embed", {"content": b'{"inputs": "x"}', "headers": KEY}),
    ("empty inputs", "/tei/st/embed", {"json": {"inputs": []}, "headers": KEY}),
    ("empty text", "/tei/nli/predict", {"json": {"inputs": ""}, "headers": KEY}),
    ("empty texts", "/tei/reranker/rerank", {"json": {"query": "q", "texts": []}, "headers": KEY}),
    ("empty ids", "/tei/st/decode", {"json": {"ids": []}, "headers": KEY}),
    ("unknown prompt", "/tei/st/embed", {"json": {"inputs": "x", "prompt_name": "nope"}, "headers": KEY}),
    ("too long", "/tei/st/embed", {"json": {"inputs": "word " * 100, "truncate": False}, "headers": KEY}),
    ("unexpected exception", "/tei/st/embed", {"json": {"inputs": BOOM}, "headers": {**KEY, "x-request-id": "boom-1"}}),
    ("too many in flight", "/tei/st/embed", {"json": {"inputs": "x"}, "headers": KEY}),
    # a query string, a chunked body, one over the limit, a percent-encoded target; paths that are no route
    ("body over the limit", "/tei/st/embed", {"json": {"inputs": "y" * 5000}, "headers": KEY}),
    ("query string", "/tei/st/embed?x=1", {"json": {"inputs": "x"}, "headers": KEY}),
    ("chunked", "/tei/st/embed", {"content": [b'{"inputs": ', b'"x"}'], "headers": JSON}),
    ("percent-encoded name", "/tei/s%74/embed", {"json": {"inputs": "x"}, "headers": KEY}),
    ("trailing slash", "/tei/st/embed/", {"json": {"inputs": "x"}, "headers": KEY}),
    ("no such route", "/tei/st/nothing", {"json": {"inputs": "x"}, "headers": KEY}),
    # while the model sheds load
    ("shedding", "/tei/st/embed", {"json": {"inputs": "x"}, "headers": KEY}),
    ("compat shedding", "/tei/st", {"json": {"inputs": "x"}, "headers": KEY}),
    ("tokenize while shedding", "/tei/st/tokenize", {"json": {"inputs": "x"}, "headers": KEY}),
]
TEI_STATUS = {"no key": 401, "wrong key": 401, "unknown model": 404, "compat unknown model": 404, "wrong task": 424,
              "openai wrong task": 424, "openai unknown model": 404, "openai invalid field": 422, "openai no key": 401,
              "no sparse output": 424, "no per-token output": 424, "empty sentences": 400,
              "bad json": 400, "compat bad json": 400, "invalid field": 422, "compat invalid field": 422,
              "text/plain": 415, "compat text/plain": 415, "no content type": 415, "empty inputs": 400,
              "empty text": 400, "empty texts": 400, "empty ids": 400, "unknown prompt": 422, "too long": 422,
              "unexpected exception": 500, "too many in flight": 429, "body over the limit": 413, "query string": 200,
              "chunked": 200, "percent-encoded name": 200, "trailing slash": 307, "no such route": 404,
              "shedding": 429, "compat shedding": 429, "tokenize while shedding": 200, "vertex wrong task": 424}


@contextmanager
def in_flight_full(app: FastAPI) -> Iterator[None]:
    """The worker's in-flight bound reached, as if by requests in flight elsewhere."""
    in_flight = app.state.edge.in_flight
    in_flight.count += in_flight.limit
    try:
        yield
    finally:
        in_flight.count -= in_flight.limit


@contextmanager
def st_shedding(app: FastAPI) -> Iterator[None]:
    """`st` shedding load: its last admission check refused, minutes of work ahead (test_overload.py's way), at a cost
    per token of its own (the refusal's message says how long the work takes)."""
    backlog = app.state.runtime.inference.backlog_of(app.state.runtime.registry.resolve("st", "embed"))
    measured, backlog.service = backlog.service, ServiceTime()
    for _ in range(MIN_CALLS):
        backlog.service.observe(1000, 1.0)  # as if measured: 1 ms a token
    backlog.add(10**6, 10**4)
    backlog.shedding = True
    try:
        yield
    finally:
        backlog.done(10**6, 10**4)
        backlog.shedding = False
        backlog.service = measured


async def test_tei_routes_answer_log_and_count_the_same_through_either_transport(
        peer_server: TritonServer, peer_repository: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    not_empty = tei._not_empty

    def failing(texts: list[str], field: str) -> None:
        if texts == [BOOM]:
            raise RuntimeError("a bug")
        not_empty(texts, field)

    monkeypatch.setattr(tei, "_not_empty", failing)
    setups: dict[str, Setup] = {"too many in flight": in_flight_full, "shedding": st_shedding,
                                "compat shedding": st_shedding, "tokenize while shedding": st_shedding}
    runs = await _on_and_off(peer_server, caplog, TEI_REQUESTS, setups, api_keys=["k1"], max_body_bytes=4096,
                             shed_pause_s=0, repository=str(peer_repository), shm_prefix="gwdirecttei")
    _assert_the_same(runs)
    on = runs[True]
    assert {name: status for name, (status, _, _) in on.answers.items()} == {
        name: TEI_STATUS.get(name, 200) for name, _, _ in TEI_REQUESTS}
    for name, (status, _, body) in on.answers.items():
        if status >= 400:
            shape = {"message", "code", "type"} if name.startswith("openai") else {"error", "error_type"}
            assert orjson.loads(body).keys() == shape, name
    assert on.failures == ["boom-1"]
    logged = {name: line for (name, _, _), line in zip(TEI_REQUESTS, on.logs)}
    assert logged["shedding"][2:5] == ("/tei/{model}/embed", "st", 503)  # the gateway's own status, TEI's answer
    assert logged["compat embed"][2:5] == ("/tei/{model}", "st", 200)
    assert logged["no key"][2:5] == ("/tei/{model}/embed", "", 401)
    assert _total(on.growth, "gateway_tokens_total", route="/tei/{model}/embed", model="st") > 0
    assert _total(on.growth, "gateway_tokens_total", route="/tei/{model}/v1/embeddings", model="st") > 0
    # With it on, only paths that are no POST route of /tei/{model} reach the ASGI app.
    assert logged["vertex"][2:5] == ("/tei/{model}/vertex", "st", 200)
    assert _total(on.growth, "gateway_inputs_per_request_sum", route="/tei/{model}/vertex") == 3  # both instances
    assert on.seen == ["/tei/st/embed/", "/tei/st/nothing"]
    assert len(runs[False].seen) == len(TEI_REQUESTS)


@pytest.mark.parametrize("setting, traced, served", [(True, False, True), (False, False, False), (True, True, False)])
async def test_the_setting_and_tracing_decide_whether_the_protocol_gets_them(
        triton_server: TritonServer, setting: bool, traced: bool, served: bool) -> None:
    provider = TracerProvider() if traced else None  # tracing on: FastAPI makes each request's server span
    app = create_app(GatewaySettings(triton_url=triton_server.grpc_url, triton_http_url=triton_server.http_address, direct_routes=setting), tracer_provider=provider)
    async with app.router.lifespan_context(app) as state:
        assert isinstance(state[EDGE_KEY], Edge) is served
