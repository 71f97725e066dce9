"""The load generators' lean HTTP client (loadtest/http_client.py) against small real servers: keep-alive, a server
that closes, a body in several reads, Retry-After, an answer that is not HTTP, a server that never answers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from devstack.tritonserver import free_port
from loadtest.http_client import Connection

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    return await reader.readexactly(length)


async def _serve(handler: Handler, work: Callable[[str], Awaitable[object]]) -> object:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    try:
        return await work(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
    finally:
        server.close()


def test_keep_alive_reconnects_after_close_and_reads_split_bodies() -> None:
    connections = 0

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        served = 0
        while True:
            try:
                body = await _read_request(reader)
            except asyncio.IncompleteReadError:
                return
            served += 1
            close = served == 2  # every connection serves two requests, then says so and closes
            answer = b"echo:" + body
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%s\r\n" % (
                len(answer), b"connection: close\r\n" if close else b""))
            await writer.drain()
            writer.write(answer[:3])  # the body in two writes: the parser joins them
            await writer.drain()
            writer.write(answer[3:])
            await writer.drain()
            if close:
                writer.close()
                return

    async def work(url: str) -> list[tuple[int, float | None, bytes]]:
        connection = Connection(url)
        try:
            return [await connection.post("/embed", b'{"n": %d}' % i) for i in range(5)]
        finally:
            await connection.close()

    answers = asyncio.run(_serve(handler, work))
    assert answers == [(200, None, b'echo:{"n": %d}' % i) for i in range(5)]
    assert connections == 3  # 2 + 2 + 1 requests: a new connection after each close


def test_headers_and_retry_after() -> None:
    heads: list[bytes] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                return
            heads.append(head)
            await reader.readexactly(2)
            retry = b"retry-after: 1.5\r\n" if len(heads) == 1 else b"Retry-After: Wed, 21 Oct 2026 07:28:00 GMT\r\n"
            writer.write(b"HTTP/1.1 503 Service Unavailable\r\n%scontent-length: 2\r\n\r\n{}" % retry)
            await writer.drain()

    async def work(url: str) -> list[tuple[int, float | None, bytes]]:
        connection = Connection(url, {"authorization": "Bearer k"})
        try:
            return [await connection.post("/embed", b"{}") for _ in range(2)]
        finally:
            await connection.close()

    assert asyncio.run(_serve(handler, work)) == [(503, 1.5, b"{}"), (503, None, b"{}")]
    assert b"authorization: Bearer k\r\n" in heads[0] and b"content-type: application/json\r\n" in heads[0]


@pytest.mark.parametrize("answer", [b"not http at all\r\n\r\n", b""])
def test_a_broken_answer_raises(answer: bytes) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(answer)
        await writer.drain()
        writer.close()

    async def work(url: str) -> object:
        return await Connection(url).post("/embed", b"{}")

    with pytest.raises(ConnectionError):
        asyncio.run(_serve(handler, work))


def test_no_server_is_a_connection_error() -> None:
    with pytest.raises(ConnectionError, match="cannot connect"):
        asyncio.run(Connection(f"http://127.0.0.1:{free_port()}").post("/embed", b"{}"))


def test_a_server_that_never_answers_times_out() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await reader.read()  # until the client gives up and closes

    async def work(url: str) -> object:
        return await Connection(url, timeout_s=0.2).post("/embed", b"{}")

    with pytest.raises(TimeoutError):
        asyncio.run(_serve(handler, work))
