"""gateway/triton/http_infer.py's connection handling against a local HTTP/1.1 server that behaves as a server may
between calls (the answers against a real tritonserver are in test_triton_transports.py): a kept connection the
server has since closed is retried once on a new one; a connection lost mid-answer, a refused connection and an
answer past the deadline are the errors the client translates."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from tritonclient.utils import InferenceServerException

from gateway.triton.http_infer import HttpUnreachable, TritonHttpInfer
from tests.fixtures.waiting import until

pytestmark = pytest.mark.anyio
ANSWER = b'{"model_name":"m","outputs":[{"name":"o","datatype":"FP32","shape":[1,4]}]}'


@asynccontextmanager
async def server(after_answer: str = "keep", before_answer: str = "", answer: bytes = ANSWER
                 ) -> AsyncIterator[tuple[str, list[int]]]:
    """A server answering every POST with `answer`; `after_answer`: keep the connection, or `close` it (without
    saying so, as an idle keep-alive timeout does); `before_answer`: `drop` the connection after half the answer,
    or `hang`. Yields its host:port and the requests each connection served."""
    served: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served.append(0)
        conn = len(served) - 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                                  if line.lower().startswith(b"content-length")))
                json.loads(await reader.readexactly(length))
                served[conn] += 1
                message = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(answer) + answer
                if before_answer == "drop":
                    writer.write(message[: len(message) // 2])
                    await writer.drain()
                    break
                if before_answer == "hang":
                    await asyncio.Event().wait()
                writer.write(message)
                await writer.drain()
                if after_answer == "close":
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    listener = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    try:
        yield f"127.0.0.1:{port}", served
    finally:
        listener.close()


async def test_a_kept_connection_the_server_closed_is_retried_on_a_new_one() -> None:
    async with server(after_answer="close") as (url, served):
        client = TritonHttpInfer(url)
        assert (await client.infer("m", {"inputs": []}, 5))["outputs"][0]["shape"] == [1, 4]
        assert client.idle == 1
        await until(lambda: client.idle == 0, "the server's close seen by the kept connection")
        assert (await client.infer("m", {"inputs": []}, 5))["model_name"] == "m"
        assert served == [1, 1]
        client.close()


async def test_kept_connections_serve_the_next_calls() -> None:
    async with server() as (url, served):
        client = TritonHttpInfer(url)
        await asyncio.gather(*(client.infer("m", {"inputs": []}, 5) for _ in range(3)))  # three at once
        for _ in range(6):
            await client.infer("m", {"inputs": []}, 5)
        assert sorted(served) == [1, 1, 7] and client.idle == 3
        client.close()


async def test_a_connection_lost_mid_answer_is_unavailable_and_not_retried() -> None:
    async with server(before_answer="drop") as (url, served):
        client = TritonHttpInfer(url)
        with pytest.raises(InferenceServerException) as lost:
            await client.infer("m", {"inputs": []}, 5)
        assert "UNAVAILABLE" in str(lost.value.status()) and not isinstance(lost.value, HttpUnreachable)
        assert served == [1] and client.idle == 0


async def test_no_answer_within_the_time_is_a_passed_deadline_and_the_connection_is_dropped() -> None:
    async with server(before_answer="hang") as (url, _):
        client = TritonHttpInfer(url)
        with pytest.raises(InferenceServerException) as late:
            await client.infer("m", {"inputs": []}, 0.05)
        assert "DEADLINE_EXCEEDED" in str(late.value.status()) and client.idle == 0


async def test_a_refused_connection_is_unreachable() -> None:
    async with server() as (url, _):
        pass  # closed: nothing listens there any more
    with pytest.raises(HttpUnreachable):
        await TritonHttpInfer(url).infer("m", {"inputs": []}, 5)


async def test_a_200_without_a_json_object_is_an_internal_error() -> None:
    for answer in (b"<html>proxy</html>", b"[1, 2]"):
        async with server(answer=answer) as (url, _):
            with pytest.raises(InferenceServerException) as odd:
                await TritonHttpInfer(url).infer("m", {"inputs": []}, 5)
            assert "INTERNAL" in str(odd.value.status()) and "no JSON object" in str(odd.value.message())
