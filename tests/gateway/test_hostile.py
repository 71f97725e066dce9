"""Hostile input against a real gateway process (`python -m gateway`: uvicorn, real sockets) in front
of a real tritonserver serving the fake-contract repository.

Every hostile request below (invalid Unicode and invalid UTF-8, a 40 MB body with and without
Content-Length, a 3-million-character text with `truncate: false`, JSON nested 100k deep, 10k
inputs, loosely typed fields, a missing or wrong Content-Type) must get a 4xx in the one JSON error
shape with a generated X-Request-ID, without the gateway waiting for what it will not read (a
withheld body is refused on the headers alone, a chunked one after little more than the limit),
while a stream of small valid /embed requests to the same gateway keeps answering 200 between any
two hostile requests. Requests are written on raw sockets, so that the body can be withheld,
streamed in chunks, or be bytes no HTTP client library would send. `test_hostile_table` prints
what was measured (input, status, type, seconds, the stream's latencies): a record, not asserted.

Also here: request-id sanitising, API-key protection of the inference and model routes (the
operational routes stay public), and the default body limit in front of a huge text.
"""

from __future__ import annotations

import asyncio
import json
import re
import select
import socket
import statistics
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import tritonclient.grpc as grpcclient

from devstack.gateway import GatewayProcess
from devstack.tritonserver import TritonServer
from gateway.settings import GatewaySettings
from tests.fixtures.waiting import until
from tests.gateway.conftest import running_gateway

MIB = 1024 * 1024
BODY_LIMIT = 8 * MIB  # the hostile gateway's GATEWAY_MAX_BODY_BYTES: a 3-million-character body fits, 40 MB not
HUGE = 40 * 1000 * 1000  # the "40 MB" body
GENERATED_ID = re.compile(r"[0-9a-f]{32}")
JSON = (("Content-Type", "application/json"),)
STREAM_WORKERS = 4
ROUNDS = 3  # each hostile request is sent this many times while the stream runs


@dataclass(frozen=True)
class Hostile:
    """One hostile request and the answer it must get."""

    name: str
    path: str
    body: bytes  # ignored by the "withheld" and "chunked" modes
    status: int
    type: str
    headers: tuple[tuple[str, str], ...] = JSON
    # plain: Content-Length and the body, written until the answer comes; withheld: Content-Length HUGE, no body
    # written; full: Content-Length HUGE and all of it written, answer or not; chunked: HUGE bytes in chunks
    mode: str = "plain"


def nested(depth: int, open_: bytes = b"[", close: bytes = b"]", inner: bytes = b"") -> bytes:
    return open_ * depth + inner + close * depth


HOSTILE = [
    Hostile("lone high surrogate a\\ud800b", "/embed", b'{"inputs": "a\\ud800b"}', 400, "invalid_unicode"),
    Hostile("lone low surrogate \\udfff", "/classify", b'{"inputs": "\\udfff"}', 400, "invalid_unicode"),
    Hostile("reversed surrogate pair in a list", "/v1/embeddings", b'{"input": ["ok", "\\udc00\\ud800"]}', 400,
            "invalid_unicode"),
    Hostile("lone surrogate as a field name", "/classify", b'{"inputs": "a", "\\ud800": 1}', 400, "invalid_unicode"),
    Hostile("surrogate as UTF-8 bytes ED A0 80", "/embed", b'{"inputs": "a\xed\xa0\x80b"}', 400, "invalid_unicode"),
    Hostile("lone surrogate as model name", "/embed", b'{"inputs": "a", "model": "\\ud800"}', 404,
            "model_not_found"),
    Hostile("invalid UTF-8 bytes FF FE", "/embed", b'{"inputs": "a\xff\xfeb"}', 400, "invalid_json"),
    Hostile("overlong UTF-8 C0 AF", "/classify", b'{"inputs": "\xc0\xaf"}', 400, "invalid_json"),
    Hostile("truncated UTF-8 sequence E2 82", "/embed", b'{"inputs": "\xe2\x82"}', 400, "invalid_json"),
    Hostile("Latin-1 body", "/v1/embeddings", '{"input": "café"}'.encode("latin-1"), 400, "invalid_json"),
    Hostile("40 MB body, Content-Length, body withheld", "/embed", b"", 413, "body_too_large", mode="withheld"),
    Hostile("40 MB body, Content-Length, body written", "/embed", b"", 413, "body_too_large", mode="full"),
    Hostile("40 MB body, chunked, no Content-Length", "/embed", b"", 413, "body_too_large", mode="chunked"),
    Hostile("3,000,000-character text, truncate false", "/embed",
            b'{"inputs": "' + b"a" * 3_000_000 + b'", "truncate": false}', 413, "input_too_long"),
    Hostile("100k nested arrays", "/embed", nested(100_000), 400, "invalid_json"),
    Hostile("100k nested objects", "/classify", nested(100_000, b'{"a":', b"}", b"1"), 400, "invalid_json"),
    Hostile("100k nested arrays as inputs", "/embed", b'{"inputs": ' + nested(100_000) + b"}", 400, "invalid_json"),
    Hostile("900 nested arrays as inputs", "/embed", b'{"inputs": ' + nested(900) + b"}", 422, "validation_error"),
    Hostile("5000-digit integer", "/v1/embeddings", b'{"input": "a", "dimensions": ' + b"9" * 5000 + b"}", 400,
            "invalid_json"),
    Hostile("10k inputs", "/embed", json.dumps({"inputs": ["a"] * 10_000}).encode(), 413, "too_many_inputs"),
    Hostile("10k inputs, OpenAI route", "/v1/embeddings", json.dumps({"input": ["a"] * 10_000}).encode(), 413,
            "too_many_inputs"),
    Hostile('normalize: "yes"', "/embed", b'{"inputs": "a", "normalize": "yes"}', 422, "validation_error"),
    Hostile("truncate: 0", "/classify", b'{"inputs": "a", "truncate": 0}', 422, "validation_error"),
    Hostile('dimensions: "128"', "/v1/embeddings", b'{"input": "a", "dimensions": "128"}', 422, "validation_error"),
    Hostile('empty string input ""', "/embed", b'{"inputs": ""}', 422, "validation_error"),
    Hostile('empty string in a list ["ok", ""]', "/classify", b'{"inputs": ["ok", ""]}', 422, "validation_error"),
    Hostile("no Content-Type", "/embed", b'{"inputs": "a"}', 415, "unsupported_media_type", headers=()),
    Hostile("Content-Type text/plain", "/embed", b'{"inputs": "a"}', 415, "unsupported_media_type",
            headers=(("Content-Type", "text/plain"),)),
    Hostile("form-encoded body", "/classify", b"inputs=a", 415, "unsupported_media_type",
            headers=(("Content-Type", "application/x-www-form-urlencoded"),)),
]


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes
    seconds: float  # from connecting to the whole answer read
    sent: int  # body bytes written before the answer came (all of them in the "full" mode)

    def json(self) -> Any:
        return json.loads(self.body)


def read_answer(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before an answer: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed in the middle of the answer"
        body += chunk
    return status, headers, body


def exchange(port: int, head: bytes, body: Iterable[bytes], *, until_answer: bool = True, timeout: float = 10.0) -> Reply:
    """Write `head`, then the body's pieces (until the gateway answers, if `until_answer`); read the answer."""
    start = time.perf_counter()
    deadline = start + timeout
    sent = 0
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(head)
        sock.setblocking(False)
        pieces: Iterator[bytes] = iter(body)
        pending = next(pieces, b"")
        while pending:
            assert time.perf_counter() < deadline, f"the gateway stopped reading after {sent} bytes, unanswered"
            readable, writable, _ = select.select([sock] if until_answer else [], [sock], [], 1.0)
            if readable:
                break  # answered before the whole body was written
            if writable:
                try:
                    n = sock.send(pending[:MIB])
                except (BrokenPipeError, ConnectionResetError):
                    break
                sent += n
                pending = pending[n:] or next(pieces, b"")
        sock.settimeout(timeout)
        status, headers, answer = read_answer(sock)
    return Reply(status, headers, answer, time.perf_counter() - start, sent)


def chunked(total: int, size: int = 256 * 1024) -> Iterator[bytes]:
    """`total` bytes of a JSON text that never ends, in chunks of the chunked transfer coding."""
    yield b'c\r\n{"inputs": "\r\n'
    frame = b"%x\r\n" % size + b"a" * size + b"\r\n"
    for _ in range(total // size):
        yield frame
    yield b"0\r\n\r\n"


def send_hostile(port: int, case: Hostile) -> Reply:
    head = [f"POST {case.path} HTTP/1.1", f"Host: 127.0.0.1:{port}", *(f"{k}: {v}" for k, v in case.headers)]
    body: Iterable[bytes]
    if case.mode in ("withheld", "full"):
        head.append(f"Content-Length: {HUGE}")
        body = [] if case.mode == "withheld" else [b"a" * MIB] * (HUGE // MIB) + [b"a" * (HUGE % MIB)]
    elif case.mode == "chunked":
        head.append("Transfer-Encoding: chunked")
        body = chunked(HUGE)
    else:
        head.append(f"Content-Length: {len(case.body)}")
        body = [case.body]
    return exchange(port, ("\r\n".join(head) + "\r\n\r\n").encode(), body, until_answer=case.mode != "full")


@dataclass
class Run:
    """What the hostile phase measured: each case's replies, and the stream's latencies before and during it."""

    replies: dict[str, list[Reply]] = field(default_factory=dict)
    quiet: list[float] = field(default_factory=list)
    during: list[float] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    between: list[int] = field(default_factory=list)  # stream calls answered after each hostile request


def p(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]


async def measure(port: int) -> Run:
    run = Run()
    phase = {"latencies": run.quiet}
    stop = asyncio.Event()

    async def stream(worker: int) -> None:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            i = 0
            while not stop.is_set():
                latencies = phase["latencies"]
                start = time.perf_counter()
                r = await client.post("/embed", json={"inputs": [f"small valid text {worker} {i}"]})
                latencies.append(time.perf_counter() - start)
                run.statuses.append(r.status_code)
                i += 1

    workers = [asyncio.create_task(stream(w)) for w in range(STREAM_WORKERS)]
    try:
        await until(lambda: len(run.quiet) >= 10 * STREAM_WORKERS, "the stream alone answering")
        phase["latencies"] = run.during
        for _ in range(ROUNDS):
            for case in HOSTILE:
                reply = await asyncio.to_thread(send_hostile, port, case)
                run.replies.setdefault(case.name, []).append(reply)
                answered = len(run.statuses)
                # the stream goes on: a valid call is answered before the next hostile request (a gateway
                # stuck on the hostile one would fail this wait)
                await until(lambda: len(run.statuses) > answered, f"a valid call answered after {case.name!r}")
                run.between.append(len(run.statuses) - answered)
    finally:
        stop.set()
        await asyncio.gather(*workers)
    return run


@pytest.fixture(scope="module")
def hostile_gateway(fake_triton: TritonServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    log = tmp_path_factory.mktemp("hostile") / "gateway.log"
    settings = {"shm_prefix": "gwhostile", "max_body_bytes": str(BODY_LIMIT)}
    with GatewayProcess(fake_triton.grpc_url, triton_http_url=fake_triton.http_address, settings=settings, log_path=log) as process:
        yield process


@pytest.fixture(scope="module")
def hostile_run(hostile_gateway: GatewayProcess) -> Run:
    return asyncio.run(measure(hostile_gateway.port))


@pytest.mark.parametrize("case", HOSTILE, ids=[c.name for c in HOSTILE])
def test_hostile_input_gets_a_clear_4xx_at_once(hostile_run: Run, case: Hostile) -> None:
    for reply in hostile_run.replies[case.name]:
        assert reply.status == case.status, (reply.status, reply.body[:300])
        assert set(reply.json()) == {"error"}, reply.body[:300]
        error = reply.json()["error"]
        assert set(error) == {"type", "message"} and error["type"] == case.type and error["message"], error
        assert reply.headers["content-type"] == "application/json"
        assert GENERATED_ID.fullmatch(reply.headers["x-request-id"]), reply.headers
        # "withheld": no body byte was written, so an answer at all is an answer on the headers alone
        # (`exchange` fails after its timeout when none comes)
        if case.mode == "chunked":
            assert reply.sent < HUGE // 2, reply.sent  # the gateway stopped reading soon after its limit


def test_valid_traffic_keeps_flowing_meanwhile(hostile_run: Run) -> None:
    """Every valid call of the stream is answered 200, and calls were answered between any two hostile
    requests (`measure` waits for one after each)."""
    assert hostile_run.statuses and set(hostile_run.statuses) == {200}, set(hostile_run.statuses)
    assert len(hostile_run.between) == ROUNDS * len(HOSTILE) and min(hostile_run.between) >= 1


def test_gateway_logged_no_error(hostile_run: Run, hostile_gateway: GatewayProcess) -> None:
    assert hostile_gateway.log_path is not None
    lines = hostile_gateway.log_path.read_text().splitlines()
    assert sum('"status":413' in line for line in lines) >= 3 * ROUNDS  # the access log saw the hostile requests
    bad = [line for line in lines if '"level":"error"' in line or "Traceback" in line]
    assert not bad, bad[:5]


def test_hostile_table(hostile_run: Run, capsys: pytest.CaptureFixture[str]) -> None:
    """Print what was measured, for the record (worst time of the rounds)."""
    rows = []
    for case in HOSTILE:
        replies = hostile_run.replies[case.name]
        worst = max(r.seconds for r in replies)
        kinds = {(r.status, r.json()["error"]["type"]) for r in replies}
        rows.append((case.name, "/".join(f"{s} {t}" for s, t in sorted(kinds)), f"{worst:.4f}"))
    q, d = hostile_run.quiet, hostile_run.during
    with capsys.disabled():
        print(f"\nhostile inputs ({ROUNDS} rounds, worst time; gateway body limit {BODY_LIMIT} bytes):")
        for name, outcome, seconds in rows:
            print(f"  {name:<45} {outcome:<28} {seconds} s")
        print(
            f"  valid /embed stream, {STREAM_WORKERS} clients: alone {len(q)} calls p50 {p(q, 50) * 1000:.1f} ms "
            f"p99 {p(q, 99) * 1000:.1f} ms; during the hostile requests {len(d)} calls p50 {p(d, 50) * 1000:.1f} ms "
            f"p99 {p(d, 99) * 1000:.1f} ms max {max(d) * 1000:.1f} ms; statuses {sorted(set(hostile_run.statuses))}"
        )
    assert len(rows) == len(HOSTILE)


def inferences(triton: TritonServer, model: str) -> int:
    """Triton's count of the requests `model` executed (successfully)."""
    stats = grpcclient.InferenceServerClient(triton.grpc_url).get_inference_statistics(model, as_json=True)
    return int(stats["model_stats"][0]["inference_stats"]["success"].get("count", 0))


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("pipeline", "local_tokenizer"),
    [("scheduler", True), ("ensemble", True), ("ensemble", False)],
    ids=["scheduler", "ensemble", "ensemble-remote-triton"],
)
async def test_longest_text_with_truncate_false_on_a_real_tokenizer(
    triton_server: TritonServer,
    python_repository: Path,
    pipeline: str,
    local_tokenizer: bool,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The longest text the gateway takes (GATEWAY_MAX_INPUT_CHARS, real words) with `truncate: false` on
    the tiny BERT repository: 413 input_too_long, while small requests keep being served. Where the gateway
    can read the repository's tokenizer it refuses before any inference (neither Triton's tokenizer nor the
    model step sees the text); without it (a remote Triton) the ensemble runs it once (its tokenizer counts
    the tokens, the model step gets them cut to max_seq_len) and the gateway refuses it from that count.
    Proved from Triton's statistics; the time is printed, not asserted (0.1-0.6 s on the 2-core machine)."""
    settings = GatewaySettings()
    text = ("the quick brown fox jumps over the lazy dog " * (settings.max_input_chars // 44 + 1))[
        : settings.max_input_chars
    ]
    repository = str(python_repository) if local_tokenizer else ""
    async with running_gateway(
        triton_server.grpc_url, triton_http_url=triton_server.http_address, shm_prefix="gwhostbert",
        pipeline=pipeline, repository=repository
    ) as (_, client):
        small = {"model": "tinyemb", "inputs": ["a short text"]}
        assert (await client.post("/embed", json=small)).status_code == 200
        steps = {m: inferences(triton_server, m) for m in ("tinyemb_tokenizer", "tinyemb_onnx")}
        start = time.perf_counter()
        big = asyncio.ensure_future(client.post("/embed", json={"model": "tinyemb", "inputs": text, "truncate": False}))
        latencies = []
        while not big.done() or not latencies:  # at least one small call after the big one was sent
            t = time.perf_counter()
            r = await client.post("/embed", json=small)
            latencies.append(time.perf_counter() - t)
            assert r.status_code == 200
        refused = await big
        seconds = time.perf_counter() - start
        smalls, big_ran = len(latencies), 0 if local_tokenizer else 1
        # the scheduler tokenizes in the gateway; the ensemble's tokenizer runs each text it is sent
        expected = {"tinyemb_tokenizer": {"scheduler": 0, "ensemble": smalls}[pipeline] + big_ran,
                    "tinyemb_onnx": smalls + big_ran}
        # Triton counts a request when it releases it, which can come after the response: wait for the counts
        await until(lambda: all(inferences(triton_server, m) - steps[m] >= n for m, n in expected.items()),
                    "Triton's statistics", within_s=30)
        ran = {m: inferences(triton_server, m) - n for m, n in steps.items()}
    with capsys.disabled():
        where = "gateway tokenizer" if local_tokenizer else "no gateway tokenizer"
        print(f"\n{pipeline} ({where}): {len(text)}-character text, truncate false on tinyemb: {refused.status_code} "
              f"{refused.json()['error']['type']} in {seconds:.3f} s; {len(latencies)} small calls meanwhile, "
              f"max {max(latencies, default=0) * 1000:.1f} ms")
    assert refused.status_code == 413 and refused.json()["error"]["type"] == "input_too_long", refused.text
    assert ran == expected, ran


@pytest.mark.anyio
async def test_default_body_limit_refuses_a_huge_text_before_reading_it(fake_triton: TritonServer) -> None:
    """With the default GATEWAY_MAX_BODY_BYTES (2 MiB), the 3-million-character text never reaches the parser
    (the body limit answers, not the input length check)."""
    body = {"inputs": "a" * 3_000_000, "truncate": False}
    async with running_gateway(fake_triton.grpc_url, triton_http_url=fake_triton.http_address, shm_prefix="gwhostdef") as (_, client):
        r = await client.post("/embed", json=body)
    assert r.status_code == 413 and r.json()["error"]["type"] == "body_too_large", r.text
    assert GENERATED_ID.fullmatch(r.headers["x-request-id"])


@pytest.mark.parametrize(
    ("sent", "echoed"),
    [
        (b"req-42", True),
        (b"trace.id:0A-b_c", True),
        (b"x" * 128, True),
        (b"x" * 300, False),  # too long
        (b"has spaces in it", False),
        ("r\u00e9q-\u00fcn\u00efcode".encode(), False),  # non-ASCII (UTF-8 bytes on the wire)
        (b"semi;colon", False),
        (b"", False),
    ],
    ids=["plain", "dotted", "128-chars", "300-chars", "spaces", "non-ascii", "semicolon", "empty"],
)
def test_request_id_is_echoed_only_when_plain(hostile_gateway: GatewayProcess, sent: bytes, echoed: bool) -> None:
    for method, path, body in (("GET", "/healthz", b""), ("POST", "/embed", b'{"inputs": "a"}'),
                               ("POST", "/embed", b'{"inputs": ""}'), ("GET", "/nowhere", b"")):
        head = (f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n").encode() + b"X-Request-ID: " + sent + b"\r\n\r\n"
        reply = exchange(hostile_gateway.port, head, [body])
        assert reply.status in (200, 404, 422), reply
        rid = reply.headers["x-request-id"]
        assert (rid == sent.decode()) if echoed else GENERATED_ID.fullmatch(rid), (sent, rid)


def test_api_keys_protect_inference_and_models_not_operations(
    fake_triton: TritonServer, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """GATEWAY_API_KEYS (a comma-separated list, as an operator sets it): inference and /v1/models need one of
    the keys (401 with WWW-Authenticate otherwise); /healthz, /readyz and /metrics stay public; no key is logged."""
    log = tmp_path_factory.mktemp("hostile_auth") / "gateway.log"
    keys = "first-k3y-1bd0c6, second-k3y-77e2a9"
    settings = {"shm_prefix": "gwhostauth", "api_keys": keys}
    protected = [("POST", "/classify", {"inputs": "a"}), ("POST", "/embed", {"inputs": "a"}),
                 ("POST", "/v1/embeddings", {"input": "a"}), ("GET", "/v1/models", None)]
    with (
        GatewayProcess(fake_triton.grpc_url, triton_http_url=fake_triton.http_address, settings=settings, log_path=log) as gateway,
        httpx.Client(base_url=gateway.url, timeout=30) as client,
    ):
        for method, path, body in protected:
            for auth in (None, "Bearer wrong-key", "Basic c2Vjb25kLWszeS03N2UyYTk=", "Bearer", "second-k3y-77e2a9"):
                headers = {"Authorization": auth} if auth is not None else {}
                r = client.request(method, path, json=body, headers=headers)
                assert r.status_code == 401, (path, auth, r.text)
                assert r.json()["error"]["type"] == "authentication_error" and set(r.json()) == {"error"}
                assert r.headers["www-authenticate"] == "Bearer" and r.headers["x-request-id"]
                assert "k3y" not in r.text
            for key in ("first-k3y-1bd0c6", "second-k3y-77e2a9"):
                r = client.request(method, path, json=body, headers={"Authorization": f"Bearer {key}"})
                assert r.status_code == 200, (path, r.text)
        for path in ("/healthz", "/readyz", "/metrics"):
            r = client.get(path)
            assert r.status_code == 200 and r.headers["x-request-id"], (path, r.text)
        # every refusal is counted on its own route (this gateway process's own registry), none as unmatched
        refused = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in client.get("/metrics").text.splitlines()
                   if line.startswith("gateway_requests_total{") and 'status="401"' in line}
        assert {k.split('route="')[1].split('"')[0]: v for k, v in refused.items()} == {
            path: 5.0 for _, path, _ in protected}, refused
    assert "k3y" not in log.read_text()
