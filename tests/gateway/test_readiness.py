"""Readiness that tells the truth, with a real tritonserver (the fake-contract repository): the gateway checks at
start and on /readyz each path its calls take, and says what is wrong with one.

- GATEWAY_TRITON_HTTP_URL at Triton's gRPC port (a port that does not speak HTTP/1.1): one warning at start that
  names the setting, correct answers over gRPC (no HTTP connection is ever kept, no warning per call), and /readyz
  ready, saying that the HTTP endpoint is not Triton's and inference goes over gRPC;
- every path right: each `ok`;
- GATEWAY_TRITON_URL where nothing listens: not ready, the reason names the setting.
"""

from __future__ import annotations

import logging
import secrets

import numpy as np
import pytest

from devstack.fake_repository import EMBED_DIM, fake_vector
from devstack.tritonserver import TritonServer, free_port
from tests.gateway.conftest import running_gateway

pytestmark = pytest.mark.anyio


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.WARNING and "GATEWAY_TRITON_HTTP_URL" in r.getMessage()]


async def test_an_http_url_at_the_grpc_port_leaves_inference_on_grpc_with_one_warning(
        fake_triton: TritonServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    async with running_gateway(fake_triton.grpc_url, triton_http_url=fake_triton.grpc_url, shm="system",
                               shm_prefix=f"gwready{secrets.token_hex(3)}") as (app, client):
        (warning,) = _warnings(caplog)
        assert fake_triton.grpc_url in warning and "gRPC" in warning, warning
        for round_ in range(3):
            texts = [f"round {round_} a", f"round {round_} b c"]
            r = await client.post("/embed", json={"model": "fakeemb", "inputs": texts, "normalize": False})
            assert r.status_code == 200, r.text
            want = np.stack([fake_vector(t, EMBED_DIM) for t in texts])
            np.testing.assert_allclose(np.array(r.json()["embeddings"]), want, rtol=1e-6)
        ready = await client.get("/readyz")
        assert ready.status_code == 200, ready.text
        body = ready.json()
        assert body["triton"]["grpc"] == body["triton"]["repository"] == body["triton"]["shm"] == "ok", body
        assert "GATEWAY_TRITON_HTTP_URL" in body["triton"]["http"] and "gRPC" in body["triton"]["http"], body
        assert fake_triton.grpc_url not in ready.text  # public: the setting is named, not the address
        client_ = app.state.runtime.client
        assert client_.http is not None and client_.http.idle == 0  # no call was answered over HTTP
        assert len(_warnings(caplog)) == 1  # the calls and the second check said nothing more


async def test_every_path_right_is_ok(fake_triton: TritonServer) -> None:
    async with running_gateway(fake_triton.grpc_url, triton_http_url=fake_triton.http_address, shm="system",
                               shm_prefix=f"gwready{secrets.token_hex(3)}") as (_, client):
        ready = await client.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert ready.json()["triton"] == {"grpc": "ok", "repository": "ok", "http": "ok", "shm": "ok"}
        assert "reason" not in ready.json()


async def test_no_triton_at_the_grpc_url_is_not_ready_and_says_which_setting() -> None:
    async with running_gateway(f"127.0.0.1:{free_port()}", triton_http_url="none", shm="none",
                               startup_timeout_s=1) as (_, client):
        ready = await client.get("/readyz")
        assert ready.status_code == 503, ready.text
        body = ready.json()
        assert "GATEWAY_TRITON_URL" in body["reason"] and body["triton"]["http"] == body["triton"]["shm"] == "off"
