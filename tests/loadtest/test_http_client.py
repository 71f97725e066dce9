"""The load generator's lean HTTP client (loadtest/http_client.py) against small real servers: keep-alive, a server
that closes, a body in several reads, an answer that is not HTTP, a server that never answers."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from loadtest.http_client import HttpClient

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    return await reader.readexactly(length)


async def _serve(handler: Handler, work: Callable[[HttpClient], Awaitable[object]], timeout_s: float = 5.0) -> object:
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = HttpClient(f"http://127.0.0.1:{port}", {"content-type": "application/json"}, timeout_s)
    try:
        return await work(client)
    finally:
        await client.close()
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

    async def work(client: HttpClient) -> list[tuple[int, bytes]]:
        return [await client.post(0, "/embed", b'{"n": %d}' % i) for i in range(5)]

    answers = asyncio.run(_serve(handler, work))
    assert answers == [(200, b'echo:{"n": %d}' % i) for i in range(5)]
    assert connections == 3  # 2 + 2 + 1 requests: the client opened a new connection after each close


def test_slots_have_their_own_connections() -> None:
    peers: set[int] = set()

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peers.add(writer.get_extra_info("peername")[1])
        while True:
            try:
                await _read_request(reader)
            except asyncio.IncompleteReadError:
                return
            writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 2\r\n\r\n{}")
            await writer.drain()

    async def work(client: HttpClient) -> list[tuple[int, bytes]]:
        return list(await asyncio.gather(*(client.post(slot, "/embed", b"{}") for slot in range(3) for _ in range(1))))

    assert asyncio.run(_serve(handler, work)) == [(404, b"{}")] * 3
    assert len(peers) == 3


@pytest.mark.parametrize("answer", [b"not http at all\r\n\r\n", b""])
def test_a_broken_answer_raises(answer: bytes) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        writer.write(answer)
        await writer.drain()
        writer.close()

    async def work(client: HttpClient) -> object:
        return await client.post(0, "/embed", b"{}")

    with pytest.raises(ConnectionError):
        asyncio.run(_serve(handler, work))


def test_a_server_that_never_answers_times_out() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _read_request(reader)
        await reader.read()  # until the client gives up and closes

    async def work(client: HttpClient) -> object:
        return await client.post(0, "/embed", b"{}")

    with pytest.raises(TimeoutError):
        asyncio.run(_serve(handler, work, timeout_s=0.2))
