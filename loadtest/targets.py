"""What the load generator calls: the gateway over HTTP, or a Triton model over gRPC.

Every target is opened once per client process with the number of `slots` (requests that
may be in flight at once) and then called with `(slot, texts)`; a call raises on any error.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal, Protocol

import numpy as np
import orjson
from pydantic import BaseModel, Field

from loadtest.http_client import Connection

Endpoint = Literal["classify", "embed", "openai", "tei"]
# tei: the model's text-embeddings-inference /embed (the path names the model; the body does not)
PATHS: dict[str, str] = {"classify": "/classify", "embed": "/embed", "openai": "/v1/embeddings",
                         "tei": "/tei/{model}/embed"}


class Target(Protocol):
    """A callable service under load."""

    async def open(self, slots: int, max_batch: int) -> None: ...
    async def call(self, slot: int, texts: list[str]) -> None: ...
    async def close(self) -> None: ...


class GatewaySpec(BaseModel):
    """The gateway's HTTP API: `endpoint` on `url`, for served model `model` (optional)."""

    kind: Literal["gateway"] = "gateway"
    url: str = "http://127.0.0.1:8080"
    endpoint: Endpoint = "embed"
    model: str | None = None
    api_key: str | None = None
    timeout_s: float = 60.0
    client: Literal["aiohttp", "raw"] = Field(
        "aiohttp", description="aiohttp's session, or loadtest.http_client's Connection per slot (httptools): a "
                               "client that takes a quarter of aiohttp's CPU on the host it measures")


class TritonSpec(BaseModel):
    """A Triton model (usually NAME_onnx_ensemble) called with tritonclient's asyncio gRPC client."""

    kind: Literal["triton"] = "triton"
    url: str = "127.0.0.1:8001"
    model: str
    input: str = "text"
    shm: bool = Field(False, description="Input and outputs through system shared memory.")
    timeout_s: float = 60.0


class GatewayTarget:
    """POSTs JSON to the gateway with one aiohttp session (keep-alive, no connection limit), or with
    loadtest.http_client when the spec asks for the `raw` client."""

    def __init__(self, spec: GatewaySpec) -> None:
        self.spec = spec
        self.session: object | None = None
        self.connections: list[Connection] = []  # the raw client's, one per slot
        self.path = PATHS[spec.endpoint].format(model=spec.model)
        self.url = spec.url.rstrip("/") + self.path
        self.headers = {"content-type": "application/json"}
        if spec.api_key:
            self.headers["authorization"] = f"Bearer {spec.api_key}"

    async def open(self, slots: int, max_batch: int) -> None:
        if self.spec.client == "raw":
            self.connections = [Connection(self.spec.url, self.headers, self.spec.timeout_s) for _ in range(slots)]
            return
        import aiohttp

        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        self.session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=self.spec.timeout_s)
        )

    def body(self, texts: list[str]) -> bytes:
        payload: dict[str, object]
        inputs: str | list[str] = texts[0] if len(texts) == 1 else texts
        if self.spec.endpoint == "openai":
            payload = {"input": inputs}
        else:
            payload = {"inputs": inputs}
        if self.spec.model and self.spec.endpoint != "tei":
            payload["model"] = self.spec.model
        return orjson.dumps(payload)

    async def call(self, slot: int, texts: list[str]) -> None:
        if self.connections:
            status, _, data = await self.connections[slot].post(self.path, self.body(texts))
            if status != 200:
                raise RuntimeError(f"HTTP {status}: {data[:200]!r}")
            return
        assert self.session is not None, "open() first"
        async with self.session.post(self.url, data=self.body(texts), headers=self.headers) as resp:  # type: ignore[attr-defined]
            data = await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {data[:200]!r}")

    async def close(self) -> None:
        for connection in self.connections:
            await connection.close()
        if self.session is not None:
            await self.session.close()  # type: ignore[attr-defined]


class TritonTarget:
    """tritonclient.grpc.aio infer on `spec.model`; text input as BYTES [batch, 1].

    With `spec.shm`, each slot owns one system shared-memory region laid out like the gateway's
    (gateway.triton.shm_pool: the input, then every output), registered with Triton once.
    """

    def __init__(self, spec: TritonSpec) -> None:
        self.spec = spec
        self.client: Any = None
        self.outputs: dict[str, tuple[int, np.dtype]] = {}  # name -> (bytes per item, dtype)
        self.slots: list[Any] = []  # gateway.triton.shm_pool.Region, one per slot

    async def open(self, slots: int, max_batch: int) -> None:
        import tritonclient.grpc.aio as grpcclient

        self.client = grpcclient.InferenceServerClient(self.spec.url)
        config = (await self.client.get_model_config(self.spec.model, as_json=True))["config"]
        dtypes = {"TYPE_FP32": np.float32, "TYPE_INT32": np.int32, "TYPE_INT64": np.int64, "TYPE_FP16": np.float16}
        for out in config["output"]:
            dtype = np.dtype(dtypes[out["data_type"]])
            per_item = int(np.prod([int(d) for d in out["dims"]])) * dtype.itemsize
            self.outputs[out["name"]] = (per_item, dtype)
        if self.spec.shm:
            await self._register(slots, max_batch)

    async def _register(self, slots: int, max_batch: int) -> None:
        from gateway.triton.shm_pool import RegionLayout, SystemRegion

        prefix = f"lt_{uuid.uuid4().hex[:8]}"
        sizes = {self.spec.input: max_batch * 4096}  # 4 KiB of UTF-8 per text on average; bigger go in-band
        sizes.update({name: max_batch * per for name, (per, _) in self.outputs.items()})
        layout = RegionLayout.of(sizes)
        for _ in range(slots):
            region = SystemRegion(prefix, layout)
            self.slots.append(region)
            await self.client.register_system_shared_memory(region.name, region.key, layout.byte_size)

    def _inputs(self, slot: int, texts: list[str]) -> tuple[list[Any], list[Any]]:
        import tritonclient.grpc.aio as grpcclient
        import tritonclient.utils as tu

        arr = np.array([[t.encode("utf-8")] for t in texts], dtype=np.object_)
        inp = grpcclient.InferInput(self.spec.input, [len(texts), 1], "BYTES")
        outs = [grpcclient.InferRequestedOutput(name) for name in self.outputs]
        if not self.spec.shm:
            inp.set_data_from_numpy(arr)
            return [inp], outs
        region = self.slots[slot]
        serialized = tu.serialize_byte_tensor(arr).item()
        if len(serialized) > region.layout.size(self.spec.input):  # too big for the region: send it in-band
            inp.set_data_from_numpy(arr)
        else:
            size = region.write(self.spec.input, serialized)
            inp.set_shared_memory(region.name, size, region.layout.offset(self.spec.input))
        for out in outs:
            per, _ = self.outputs[out.name()]
            out.set_shared_memory(region.name, per * len(texts), region.layout.offset(out.name()))
        return [inp], outs

    async def call(self, slot: int, texts: list[str]) -> None:
        inputs, outputs = self._inputs(slot, texts)
        result = await self.client.infer(self.spec.model, inputs, outputs=outputs, client_timeout=self.spec.timeout_s)
        if self.spec.shm:
            region = self.slots[slot]
            for name, (per, dtype) in self.outputs.items():
                region.read(name, dtype, (len(texts), per // dtype.itemsize))
        else:
            for name in self.outputs:
                result.as_numpy(name)

    async def close(self) -> None:
        if self.client is None:
            return
        for region in self.slots:
            try:
                await self.client.unregister_system_shared_memory(region.name)
            finally:
                region.destroy()
        await self.client.close()


def make_target(spec: GatewaySpec | TritonSpec) -> Target:
    """The target object for a spec."""
    return GatewayTarget(spec) if isinstance(spec, GatewaySpec) else TritonTarget(spec)
