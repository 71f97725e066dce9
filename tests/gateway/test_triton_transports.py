"""The gateway's Triton client's inference calls against a real tritonserver: each transport (a registered system
shm region over Triton's HTTP or gRPC endpoint, plain gRPC, and both in one call when an input outgrows its slot),
texts (BYTES) and token ids (INT32), answers checked against what the models compute by construction; and a failed
call's error type over either endpoint."""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as mc

from contract import CU_SEQLENS, INPUT_IDS, TOKEN_TYPE_IDS
from devstack.fake_repository import EMBED_DIM, fake_num_tokens, fake_vector, write_fake_repository
from devstack.tritonserver import TritonServer, free_port
from gateway.errors import ErrorType, GatewayError
from gateway.settings import GatewaySettings
from gateway.triton.client import TritonClient
from gateway.triton.tensors import Output
from tests.fixtures.triton import serving

pytestmark = pytest.mark.anyio

# A packed step that answers, per row of cu_seqlens: the sum of its ids, its length, the sum of its type ids.
ROW_SUMS_PY = '''
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            ids = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy()[0]
            types = pb_utils.get_input_tensor_by_name(request, "token_type_ids").as_numpy()[0]
            cu = pb_utils.get_input_tensor_by_name(request, "cu_seqlens").as_numpy()[0]
            rows = [[ids[a:b].sum(), b - a, types[a:b].sum()] for a, b in zip(cu[:-1], cu[1:])]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("sums", np.array(rows, np.float32))]))
        return responses
'''


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    root = tmp_path_factory.mktemp("wire")
    repository = write_fake_repository(root / "repo")
    config = mc.ModelConfig(name="rowsums", backend="python", max_batch_size=0)
    for name in (INPUT_IDS, TOKEN_TYPE_IDS, CU_SEQLENS):
        config.input.add(name=name, data_type=mc.TYPE_INT32, dims=[1, -1])
    config.output.add(name="sums", data_type=mc.TYPE_FP32, dims=[-1, 3])
    (repository / "rowsums" / "1").mkdir(parents=True)
    (repository / "rowsums" / "config.pbtxt").write_text(text_format.MessageToString(config))
    (repository / "rowsums" / "1" / "model.py").write_text(ROW_SUMS_PY)
    with serving(TritonServer(repository=repository, load_models=("fakeemb_onnx", "rowsums"))) as running:
        yield running


@pytest.mark.parametrize(("shm", "http"), [("system", True), ("system", False), ("none", True)])
async def test_texts_and_token_ids_come_back_as_the_models_computed_them(server: TritonServer, shm: str,
                                                                         http: bool) -> None:
    client = TritonClient(GatewaySettings(triton_url=server.grpc_url, shm=shm, shm_prefix="gwwire",
                                          triton_http_url=server.http_address if http else "none"))
    try:
        await client.pools.ensure("fakeemb_onnx", {"text": 1024, "embeddings": 4 * EMBED_DIM * 8, "num_tokens": 32}, 1)
        await client.pools.ensure("rowsums", {INPUT_IDS: 1024, TOKEN_TYPE_IDS: 4096, CU_SEQLENS: 2048,
                                             "sums": 4 * 3 * 400}, 1)
        assert bool(client.pools) == (shm == "system")
        texts = ["a b", "", "héllo wörld 🙂", "x " * 50]
        deadline = time.monotonic() + 30
        vectors, num_tokens = await client.infer_ensemble(
            "fakeemb_onnx", [t.encode() for t in texts], Output("embeddings", EMBED_DIM, "e"), deadline,
            direction="left")
        np.testing.assert_array_equal(vectors, np.stack([fake_vector(t, EMBED_DIM) for t in texts]))
        assert num_tokens.tolist() == [fake_num_tokens(t) for t in texts]

        rows = [np.array([101, 7, 102], np.int32), np.array([101, 2**20, 3, 102], np.int32), np.array([5], np.int32)]
        ids = np.concatenate(rows)[None]
        types = np.concatenate([np.zeros(3, np.int32), np.ones(4, np.int32), np.zeros(1, np.int32)])[None]
        cu = np.array([[0, 3, 7, 8]], np.int32)
        # the ids of 300 rows do not fit their 1 KiB slot: with a region, they go in the request and the rest in shm
        for tensors in ({INPUT_IDS: ids, TOKEN_TYPE_IDS: types, CU_SEQLENS: cu},
                        {INPUT_IDS: np.tile(ids, 100), TOKEN_TYPE_IDS: np.tile(types, 100),
                         CU_SEQLENS: np.concatenate([[[0]], (cu[:, 1:] + 8 * np.arange(100)[:, None]).reshape(1, -1)],
                                                    axis=1).astype(np.int32)}):
            n = tensors[CU_SEQLENS].shape[1] - 1
            sums = await client.infer_step("rowsums", tensors, (n, 3), Output("sums", 3, "s"), deadline)
            expected = [[float(r.astype(np.int64).sum()), len(r), 0 if k % 3 != 1 else len(r)]
                        for k, r in enumerate(rows * (n // 3))]
            np.testing.assert_array_equal(sums, np.array(expected, np.float32))
        # the calls whose tensors were all in the region went over HTTP, and left their connection open
        assert (client.http.idle if client.http is not None else 0) == (1 if shm == "system" and http else 0)
    finally:
        await client.close()


async def test_a_failed_call_is_an_unavailable_model_an_unreachable_triton_or_a_contract_mismatch(server: TritonServer) -> None:
    client = TritonClient(GatewaySettings(triton_url=server.grpc_url, triton_http_url=server.http_address, shm="none"))
    nobody = TritonClient(GatewaySettings(triton_url=f"127.0.0.1:{free_port()}", shm="none"))
    output = Output("embeddings", EMBED_DIM, "e")
    try:
        with pytest.raises(GatewayError) as unknown:
            await client.infer_ensemble("nosuchmodel", [b"a"], output, time.monotonic() + 30)
        assert unknown.value.type is ErrorType.MODEL_UNAVAILABLE and "nosuchmodel" not in unknown.value.message  # no Triton names
        with pytest.raises(GatewayError) as unreachable:
            await nobody.infer_ensemble("fakeemb_onnx", [b"a"], output, time.monotonic() + 5)
        assert unreachable.value.type is ErrorType.TRITON_UNAVAILABLE
        with pytest.raises(GatewayError) as narrower:  # the answer's width is not the one asked for
            await client.infer_ensemble("fakeemb_onnx", [b"a"], Output("embeddings", EMBED_DIM + 1, "e"),
                                        time.monotonic() + 30)
        assert narrower.value.type is ErrorType.CONTRACT_MISMATCH
    finally:
        await client.close()
        await nobody.close()



async def test_over_http_a_failed_call_is_translated_as_over_grpc(server: TritonServer) -> None:
    """Every tensor in shm (the HTTP path): Triton's HTTP errors become the same gateway errors as its gRPC ones."""
    client = TritonClient(GatewaySettings(triton_url=server.grpc_url, triton_http_url=server.http_address,
                                          shm="system", shm_prefix="gwhttperr"))
    output = Output("embeddings", EMBED_DIM, "e")
    sizes = {"text": 1024, "embeddings": 4 * (EMBED_DIM + 1), "num_tokens": 32}
    try:
        for model in ("nosuchmodel", "fakeemb_onnx"):
            await client.pools.ensure(model, sizes, 1)
        with pytest.raises(GatewayError) as unknown:
            await client.infer_ensemble("nosuchmodel", [b"a"], output, time.monotonic() + 30)
        assert unknown.value.type is ErrorType.MODEL_UNAVAILABLE and "nosuchmodel" not in unknown.value.message  # no Triton names
        with pytest.raises(GatewayError) as narrower:  # the answer's width is not the one asked for
            await client.infer_ensemble("fakeemb_onnx", [b"a"], Output("embeddings", EMBED_DIM + 1, "e"),
                                        time.monotonic() + 30)
        assert narrower.value.type is ErrorType.CONTRACT_MISMATCH
        with pytest.raises(GatewayError) as refused:  # Triton refuses an input of the wrong type
            await client.infer_step("fakeemb_onnx", {"text": np.zeros((1, 1), np.int32)}, (1, EMBED_DIM), output,
                                    time.monotonic() + 30)
        assert refused.value.type is ErrorType.TRITON_ERROR and "log" in refused.value.message
        vectors, _ = await client.infer_ensemble("fakeemb_onnx", [b"a b"], output, time.monotonic() + 30)
        np.testing.assert_array_equal(vectors[0], fake_vector("a b", EMBED_DIM))  # the connection still serves
        assert client.http is not None and client.http.idle == 1
    finally:
        await client.close()


async def test_an_http_endpoint_that_refuses_connections_leaves_the_calls_on_grpc(
        server: TritonServer, caplog: pytest.LogCaptureFixture) -> None:
    client = TritonClient(GatewaySettings(triton_url=server.grpc_url, triton_http_url=f"127.0.0.1:{free_port()}",
                                          shm="system", shm_prefix="gwhttpoff"))
    output = Output("embeddings", EMBED_DIM, "e")
    try:
        await client.pools.ensure("fakeemb_onnx", {"text": 1024, "embeddings": 4 * EMBED_DIM, "num_tokens": 32}, 1)
        for text in ("a", "b c"):  # the second call goes straight to gRPC: one warning
            vectors, _ = await client.infer_ensemble("fakeemb_onnx", [text.encode()], output, time.monotonic() + 30)
            np.testing.assert_array_equal(vectors[0], fake_vector(text, EMBED_DIM))
        warnings = [r.getMessage() for r in caplog.records if "HTTP endpoint" in r.getMessage()]
        assert len(warnings) == 1 and "over gRPC" in warnings[0], warnings
    finally:
        await client.close()
