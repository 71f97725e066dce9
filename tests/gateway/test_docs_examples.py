"""docs/api.md's error examples are real answers: each `curl` of the block between its `errors` markers is sent to a
gateway over the peer models (tests/gateway/conftest.py), and its status and body must be the ones the docs give."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import orjson
import pytest

from devstack.tritonserver import TritonServer
from tests.gateway.conftest import running_gateway

pytestmark = pytest.mark.anyio
DOCS = Path(__file__).resolve().parents[2] / "docs" / "api.md"
CURL = "application/x-www-form-urlencoded"  # curl's Content-Type for -d when none is given


def examples() -> list[tuple[str, dict[str, str], bytes, int, bytes]]:
    """(path, headers, body, status, answer) of each example."""
    block = DOCS.read_text().split("<!-- errors:begin -->", 1)[1].split("<!-- errors:end -->", 1)[0]
    lines = [line for line in block.splitlines() if line.startswith(("curl ", "# "))]
    found = []
    for command, answer in zip(lines[::2], lines[1::2]):
        args = shlex.split(command)
        path = re.sub(r"^localhost:8080", "", args[2])
        headers = dict(h.split(": ", 1) for h in args[args.index("-H") + 1:args.index("-H") + 2]) if "-H" in args else {}
        status, _, body = answer[2:].partition(" ")
        found.append((path, {"content-type": CURL, **{k.lower(): v for k, v in headers.items()}},
                      args[args.index("-d") + 1].encode(), int(status), body.encode()))
    return found


def test_the_block_has_examples() -> None:
    assert len(examples()) >= 5


async def test_the_error_examples_are_the_gateways_answers(peer_server: TritonServer, peer_repository: Path) -> None:
    async with running_gateway(peer_server.grpc_url, triton_http_url=peer_server.http_address,
                               repository=str(peer_repository), shm_prefix="gwdocs") as (_, client):
        for path, headers, body, status, answer in examples():
            response = await client.post(path, content=body, headers=headers)
            assert (response.status_code, orjson.loads(response.content)) == (status, orjson.loads(answer)), body
