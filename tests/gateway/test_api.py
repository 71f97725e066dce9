"""The gateway's HTTP API against a real tritonserver serving the fake-contract repository."""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from devstack.fake_repository import (
    EMBED_DIM,
    LABELS,
    MAX_SEQ_LEN,
    _ensemble,
    fake_num_tokens,
    fake_vector,
    write_fake_repository,
)
from devstack.tritonserver import TritonServer, free_port
from gateway.triton.shm_pool import serialize_texts
from tests.fixtures.metrics import delta
from tests.fixtures.triton import serving
from tests.gateway.conftest import running_gateway, shm_segments

pytestmark = pytest.mark.anyio


def texts(n: int) -> list[str]:
    return [f"text number {i} " + "w " * (i % 5) for i in range(n)]


def expected_scores(text: str) -> np.ndarray:
    logits = fake_vector(text, len(LABELS)).astype(np.float64)
    e = np.exp(logits - logits.max())
    return e / e.sum()




@pytest.mark.parametrize("shm", ["system", "none"])
@pytest.mark.parametrize("n", [1, 7, 300])
async def test_classify_order_and_values(fake_triton: TritonServer, shm: str, n: int) -> None:
    inputs = texts(n)
    async with running_gateway(fake_triton.grpc_url, triton_http_url=fake_triton.http_address, shm=shm, shm_prefix=f"gwcls{shm}{n}") as (_, client):
        r = await client.post("/classify", json={"model": "fakecls", "inputs": inputs if n > 1 else inputs[0]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "fakecls" and len(body["predictions"]) == n
    for text, pred in zip(inputs, body["predictions"]):
        want = expected_scores(text)
        got = np.array([pred["scores"][label] for label in LABELS])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        assert pred["label"] == LABELS[int(want.argmax())] and pred["score"] == pred["scores"][pred["label"]]
    assert body["usage"]["tokens"] == sum(min(fake_num_tokens(t), MAX_SEQ_LEN) for t in inputs)


@pytest.mark.parametrize("shm", ["system", "none"])
async def test_embed_order_values_and_normalize(fake_triton: TritonServer, shm: str) -> None:
    inputs = texts(300)
    async with running_gateway(fake_triton.grpc_url, triton_http_url=fake_triton.http_address, shm=shm, shm_prefix=f"gwemb{shm}") as (_, client):
        raw = (await client.post("/embed", json={"inputs": inputs, "normalize": False})).json()
        unit = (await client.post("/embed", json={"model": "fakeemb", "inputs": inputs})).json()
    want = np.stack([fake_vector(t, EMBED_DIM) for t in inputs])
    assert raw["dimensions"] == EMBED_DIM and raw["model"] == "fakeemb"
    np.testing.assert_allclose(np.array(raw["embeddings"]), want, rtol=1e-6)
    np.testing.assert_allclose(np.array(unit["embeddings"]), want / np.linalg.norm(want, axis=1, keepdims=True), rtol=1e-5)


async def test_shared_memory_really_carries_the_tensors(fake_triton: TritonServer) -> None:
    prefix = "gwproof"
    inputs = ["alpha beta", "gamma", "delta epsilon zeta"]
    async with running_gateway(fake_triton.grpc_url, triton_http_url=fake_triton.http_address, shm_prefix=prefix, shm_pool_size=1) as (app, client):
        status = grpcclient.InferenceServerClient(fake_triton.grpc_url).get_system_shared_memory_status(as_json=True)
        registered = {r["name"]: r for r in status.get("regions", {}).values() if r["name"].startswith(prefix)}
        pool = app.state.runtime.client.pools["fakeemb_onnx_ensemble"]
        region = pool.regions[0]
        assert set(registered) == {r.name for p in app.state.runtime.client.pools.values() for r in p.regions}
        assert registered[region.name]["key"] == region.key and region.name in shm_segments(prefix)
        body = {"model": "fakeemb", "inputs": inputs, "normalize": False, "backend": "onnx"}
        before = (await client.get("/metrics")).text
        r = await client.post("/embed", json=body)
        assert r.status_code == 200
        after = (await client.get("/metrics")).text
        # Read the region straight from /dev/shm, independently of the gateway's handle.
        with open(f"/dev/shm/{region.name}", "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mem:
            payload = serialize_texts([t.encode() for t in inputs])
            assert mem[: len(payload)] == payload  # the request's texts were written here
            lay = region.layout
            out = np.frombuffer(mem, np.float32, len(inputs) * EMBED_DIM, lay.offset("embeddings")).reshape(len(inputs), -1)
            np.testing.assert_array_equal(out, np.array(r.json()["embeddings"], dtype=np.float32))  # Triton wrote here
            toks = np.frombuffer(mem, np.int32, len(inputs), lay.offset("num_tokens"))
            assert toks.tolist() == [fake_num_tokens(t) for t in inputs]
            del out, toks
    calls = {t: delta(before, after, "gateway_triton_request_duration_seconds_count", model="fakeemb", transport=t)
             for t in ("shm", "grpc")}
    assert calls == {"shm": 1, "grpc": 0}, calls  # this request's one Triton call went through the region
    assert shm_segments(prefix) == []  # unlinked on shutdown
    status = grpcclient.InferenceServerClient(fake_triton.grpc_url).get_system_shared_memory_status(as_json=True)
    assert not [n for n in status.get("regions", {}) if n.startswith(prefix)]  # unregistered on shutdown


async def test_none_fallback_registers_nothing(fake_triton: TritonServer) -> None:
    async with running_gateway(fake_triton.grpc_url, triton_http_url=fake_triton.http_address, shm="none", shm_prefix="gwnone") as (app, client):
        before = (await client.get("/metrics")).text
        r = await client.post("/classify", json={"inputs": ["x y"]})
        after = (await client.get("/metrics")).text
    assert r.status_code == 200 and app.state.runtime.client.pools == {}
    assert shm_segments("gwnone") == []
    calls = {t: delta(before, after, "gateway_triton_request_duration_seconds_count", model="fakecls", transport=t)
             for t in ("shm", "grpc")}
    assert calls == {"shm": 0, "grpc": 1}, calls


async def test_models_health_ready_metrics_and_request_id(fake_triton: TritonServer) -> None:
    async with running_gateway(fake_triton.grpc_url, triton_http_url=fake_triton.http_address, shm_prefix="gwops") as (_, client):
        models = {m["id"]: m for m in (await client.get("/v1/models")).json()["data"]}
        assert models["fakecls"]["labels"] == LABELS and models["fakecls"]["task"] == "classify"
        assert models["fakeemb"]["dimensions"] == EMBED_DIM and models["fakeemb"]["max_tokens"] == MAX_SEQ_LEN
        assert models["fakeemb"]["backends"] == ["onnx", "trt"] and models["fakeemb"]["default_backend"] == "trt"
        assert models["fakecls"]["backends"] == ["onnx"] and models["fakecls"]["default_backend"] == "onnx"
        # the onnx ensemble's `onnx_accelerator` parameter; none without it (a repository built before it)
        assert (models["fakeemb"]["onnx_accelerator"], models["fakecls"]["onnx_accelerator"]) == ("tensorrt", "none")
        card = (await client.get("/v1/models/fakeemb")).json()
        assert card["onnx_accelerator"] == "tensorrt" and card["backends"] == ["onnx", "trt"]
        assert (await client.get("/healthz")).status_code == 200
        ready = await client.get("/readyz")
        assert ready.status_code == 200 and ready.json()["models"] == ["fakecls", "fakeemb"]
        before = (await client.get("/metrics")).text
        r = await client.post("/classify", json={"inputs": ["a", "b"]}, headers={"X-Request-ID": "req-42"})
        assert r.headers["x-request-id"] == "req-42"
        assert len((await client.post("/classify", json={"inputs": "a"})).headers["x-request-id"]) == 32
        body = (await client.get("/metrics")).text
    assert delta(before, body, "gateway_requests_total", model="fakecls", route="/classify", status="200") == 2
    assert delta(before, body, "gateway_inputs_per_request_sum", route="/classify") == 3
    assert delta(before, body, "gateway_tokens_total", model="fakecls", route="/classify") == 9  # 3 texts x (1 word + 2)
    assert "gateway_request_duration_seconds_bucket" in body and "gateway_shm_regions_in_use" in body


@pytest.mark.parametrize(
    ("path", "body", "status", "kind"),
    [
        ("/classify", {"inputs": []}, 422, "validation_error"),
        ("/classify", {"inputs": ["ok", 3]}, 422, "validation_error"),
        ("/classify", {"inputs": "ok", "unknown_field": 1}, 422, "validation_error"),
        ("/classify", {"inputs": ["a"] * 11}, 413, "too_many_inputs"),
        ("/v1/embeddings", {"input": [[1]] * 11}, 413, "too_many_inputs"),  # one limit for texts and token ids
        ("/decode", {"ids": [[1]] * 11}, 413, "too_many_inputs"),
        ("/classify", {"inputs": ["ok", "w " * 20], "truncate": False}, 413, "input_too_long"),
        ("/classify", {"model": "nope", "inputs": "a"}, 404, "model_not_found"),
        ("/classify", {"model": "fakeemb", "inputs": "a"}, 400, "wrong_task"),
        ("/embed", {"model": "fakecls", "inputs": "a"}, 400, "wrong_task"),
        ("/classify", {"inputs": "a", "backend": "trt"}, 400, "backend_not_available"),
        ("/v1/embeddings", {"input": "a", "dimensions": 3}, 400, "unsupported_dimensions"),
        ("/v1/embeddings", {"input": [[1, 2, 3]]}, 400, "token_input_unsupported"),  # ensemble pipeline: no tokenizer here
        ("/v1/embeddings", {"input": [[1, "a"]]}, 422, "validation_error"),
        ("/nowhere", {}, 404, "not_found"),
    ],
)
async def test_errors_have_one_shape(fake_triton: TritonServer, path: str, body: dict, status: int, kind: str) -> None:
    async with running_gateway(fake_triton.grpc_url, triton_http_url=fake_triton.http_address, shm_prefix="gwerr", max_inputs=10) as (_, client):
        r = await client.post(path, json=body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["type"] == kind and r.json()["error"]["message"]
    assert set(r.json()) == {"error"} and "Traceback" not in r.text


async def test_truncate_true_bills_at_most_max_seq_len(fake_triton: TritonServer) -> None:
    async with running_gateway(fake_triton.grpc_url, triton_http_url=fake_triton.http_address, shm_prefix="gwtrunc") as (_, client):
        r = await client.post("/classify", json={"inputs": ["w " * 20]})
    assert r.status_code == 200 and r.json()["usage"]["tokens"] == MAX_SEQ_LEN


async def test_invalid_json_is_400(fake_triton: TritonServer) -> None:
    async with running_gateway(fake_triton.grpc_url, triton_http_url=fake_triton.http_address, shm_prefix="gwjson") as (_, client):
        r = await client.post("/classify", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_json"


async def test_auth_on(fake_triton: TritonServer) -> None:
    async with running_gateway(fake_triton.grpc_url, triton_http_url=fake_triton.http_address, shm_prefix="gwauth", api_keys=["k1", "k2"]) as (_, client):
        missing = await client.post("/classify", json={"inputs": "a"})
        wrong = await client.post("/classify", json={"inputs": "a"}, headers={"Authorization": "Bearer nope"})
        good = await client.post("/classify", json={"inputs": "a"}, headers={"Authorization": "Bearer k2"})
        models = await client.get("/v1/models")
        health = await client.get("/healthz")
    assert missing.status_code == wrong.status_code == models.status_code == 401
    assert missing.json()["error"]["type"] == "authentication_error"
    assert missing.headers["www-authenticate"] == "Bearer"
    assert good.status_code == 200 and health.status_code == 200


async def test_auth_off_by_default(fake_triton: TritonServer) -> None:
    async with running_gateway(fake_triton.grpc_url, triton_http_url=fake_triton.http_address, shm_prefix="gwnoauth") as (_, client):
        r = await client.post("/classify", json={"inputs": "a"}, headers={"Authorization": "Bearer anything"})
    assert r.status_code == 200


async def test_in_flight_limit_is_429(fake_triton: TritonServer) -> None:
    import asyncio

    async with running_gateway(fake_triton.grpc_url, triton_http_url=fake_triton.http_address, shm_prefix="gw429", max_in_flight=1) as (_, client):
        results = await asyncio.gather(*(client.post("/embed", json={"inputs": texts(40)}) for _ in range(4)))
    codes = sorted(r.status_code for r in results)
    assert codes[0] == 200 and codes[-1] == 429, codes
    assert next(r for r in results if r.status_code == 429).json()["error"]["type"] == "rate_limited"


@pytest.mark.parametrize("setting", ["request_timeout_s", "triton_timeout_s"])
async def test_timeouts_are_504(fake_triton: TritonServer, setting: str) -> None:
    """The fake step sleeps 0.5 s on the first text, ten times the deadline: the call cannot beat it, however
    late a loaded machine's gRPC timer fires (a 0.5 ms deadline on a fast call once answered 200 in CI).
    `fakecls`, which no other test counts; a call queued behind the sleep returns once it is over."""
    async with running_gateway(fake_triton.grpc_url, triton_http_url=fake_triton.http_address, shm_prefix="gw504", **{setting: 0.05}) as (_, client):
        r = await client.post("/classify", json={"model": "fakecls", "inputs": ["sleep:0.5 a", *texts(20)]})
    assert r.status_code == 504, r.text
    assert r.json()["error"]["type"] == "timeout"
    text = grpcclient.InferInput("text", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"after"]], dtype=object))
    grpcclient.InferenceServerClient(fake_triton.grpc_url).infer("fakecls_onnx", [text])  # the step is free again


async def test_triton_absent_is_503() -> None:
    async with running_gateway(f"127.0.0.1:{free_port()}", triton_http_url=f"127.0.0.1:{free_port()}", shm_prefix="gw503", startup_timeout_s=0.5) as (_, client):
        r = await client.post("/classify", json={"inputs": "a"})
        ready = await client.get("/readyz")
    assert r.status_code == 503 and r.json()["error"]["type"] == "triton_unavailable"
    assert ready.status_code == 503


async def test_tensorrt_ensemble_preferred_and_backend_choosable(fake_triton: TritonServer) -> None:
    stats = grpcclient.InferenceServerClient(fake_triton.grpc_url)

    def count(ensemble: str) -> int:
        return int(stats.get_inference_statistics(ensemble).model_stats[0].inference_count)

    before = {e: count(e) for e in ("fakeemb_trt_fp16_ensemble", "fakeemb_onnx_ensemble")}
    async with running_gateway(fake_triton.grpc_url, triton_http_url=fake_triton.http_address, shm_prefix="gwbackend") as (_, client):
        assert (await client.post("/embed", json={"inputs": ["a", "b", "c"]})).status_code == 200
        assert (await client.post("/embed", json={"inputs": ["a"], "backend": "onnx"})).status_code == 200
        assert (await client.post("/embed", json={"inputs": ["a", "b"], "backend": "trt"})).status_code == 200
    assert count("fakeemb_trt_fp16_ensemble") - before["fakeemb_trt_fp16_ensemble"] == 5  # default: TensorRT
    assert count("fakeemb_onnx_ensemble") - before["fakeemb_onnx_ensemble"] == 1


async def test_docs_work_offline_and_can_be_switched_off(fake_triton: TritonServer) -> None:
    """/docs serves Swagger UI from the bundled assets (no CDN); GATEWAY_DOCS=false removes docs and schema."""
    async with running_gateway(fake_triton.grpc_url, triton_http_url=fake_triton.http_address, shm="none") as (_, client):
        page = await client.get("/docs")
        assert page.status_code == 200 and "/docs/assets/swagger-ui-bundle.js" in page.text
        assert "cdn" not in page.text.lower() and "http://" not in page.text and "https://" not in page.text
        script = await client.get("/docs/assets/swagger-ui-bundle.js")
        assert script.status_code == 200 and len(script.content) > 100_000
        assert (await client.get("/openapi.json")).status_code == 200
    async with running_gateway(fake_triton.grpc_url, triton_http_url=fake_triton.http_address, shm="none", docs=False) as (_, client):
        assert (await client.get("/docs")).status_code == 404
        assert (await client.get("/openapi.json")).status_code == 404


async def test_a_contract_mismatch_is_a_502_not_wrong_numbers(tmp_path: Path) -> None:
    """An ensemble whose `embedding_dim` parameter disagrees with what its step computes: the gateway
    answers 502 contract_mismatch, with shm (where the bytes alone look fine) and without."""
    repository = write_fake_repository(tmp_path / "repo")
    _ensemble(repository, "wideemb", "fakeemb_onnx", "embeddings", EMBED_DIM,
              {"task": "embed", "embedding_dim": str(EMBED_DIM + 1), "pooling": "mean"})
    with serving(TritonServer(repository=repository, log_path=tmp_path / "triton.log")) as server:
        for shm in ("system", "none"):
            async with running_gateway(server.grpc_url, triton_http_url=server.http_address, shm=shm, shm_prefix="gwmismatch") as (_, client):
                r = await client.post("/embed", json={"model": "wideemb", "inputs": ["a b"]})
                assert r.status_code == 502 and r.json()["error"]["type"] == "contract_mismatch", (shm, r.text)
                ok = await client.post("/embed", json={"model": "fakeemb", "inputs": ["a b"]})
                assert ok.status_code == 200


async def test_refusals_before_routing_are_counted_on_their_route(fake_triton: TritonServer) -> None:
    """A 401 (no key) is answered before routing; it is still counted on the route template the path names
    (so failed auth shows on that route's panel), never as `unmatched`."""
    calls = {("POST", "/rerank"): "/rerank", ("POST", "/v1/rerank"): "/v1/rerank", ("POST", "/tokenize"): "/tokenize",
             ("POST", "/decode"): "/decode", ("GET", "/v1/models/fakeemb"): "/v1/models/{model_id}",
             ("POST", "/v2/embed"): "/v2/embed", ("POST", "/v2/rerank"): "/v2/rerank",
             ("POST", "/tei/fakeemb/embed"): "/tei/{model}/embed", ("GET", "/tei/fakeemb/info"): "/tei/{model}/info",
             ("POST", "/admin/models/fakeemb/reload"): "/admin/models/{name}/reload",
             ("GET", "/admin/models"): "/admin/models"}
    async with running_gateway(fake_triton.grpc_url, triton_http_url=fake_triton.http_address, shm="none", api_keys=["k3y"], admin_keys=["adm1n"]) as (_, client):
        before = (await client.get("/metrics")).text
        for method, path in calls:
            r = await client.request(method, path, json={"inputs": "a"})
            assert r.status_code == 401, (path, r.text)  # (in TEI's error shape under /tei/)
        after = (await client.get("/metrics")).text
    counted = {route: delta(before, after, "gateway_requests_total", route=route, status="401")
               for route in [*calls.values(), "unmatched"]}
    assert counted == {**{route: 1 for route in calls.values()}, "unmatched": 0}, counted


async def test_the_docs_routes_are_counted_on_their_own_paths(fake_triton: TritonServer) -> None:
    """FastAPI's own routes (the OpenAPI document, Swagger UI) are routes too, not `unmatched`."""
    async with running_gateway(fake_triton.grpc_url, triton_http_url=fake_triton.http_address, shm="none") as (_, client):
        before = (await client.get("/metrics")).text
        assert (await client.get("/openapi.json")).status_code == 200
        assert (await client.get("/docs")).status_code == 200
        after = (await client.get("/metrics")).text
    assert [delta(before, after, "gateway_requests_total", route=route, status="200")
            for route in ("/openapi.json", "/docs", "unmatched")] == [1, 1, 0]
