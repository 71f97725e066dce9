"""What the load generator calls: the gateway over HTTP, or a Triton model over gRPC.

Every target is opened once per client process with the number of `slots` (requests that
may be in flight at once) and then called with `(slot, texts)`; a call raises on any error.
"""

from __future__ import annotations

import uuid
from typing import Literal, Protocol

import numpy as np
import orjson
from pydantic import BaseModel, Field

Endpoint = Literal["classify", "embed", "openai"]
PATHS: dict[str, str] = {"classify": "/classify", "embed": "/embed", "openai": "/v1/embeddings"}


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


class TritonSpec(BaseModel):
    """A Triton model (usually NAME_onnx_ensemble) called with tritonclient's asyncio gRPC client."""

    kind: Literal["triton"] = "triton"
    url: str = "127.0.0.1:8001"
    model: str
    input: str = "text"
    shm: bool = Field(False, description="Input and outputs through system shared memory.")
    timeout_s: float = 60.0


class GatewayTarget:
    """POSTs JSON to the gateway with one aiohttp session (keep-alive, no connection limit)."""

    def __init__(self, spec: GatewaySpec) -> None:
        self.spec = spec
        self.session: object | None = None
        self.url = spec.url.rstrip("/") + PATHS[spec.endpoint]
        self.headers = {"content-type": "application/json"}
        if spec.api_key:
            self.headers["authorization"] = f"Bearer {spec.api_key}"

    async def open(self, slots: int, max_batch: int) -> None:
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
        if self.spec.model:
            payload["model"] = self.spec.model
        return orjson.dumps(payload)

    async def call(self, slot: int, texts: list[str]) -> None:
        assert self.session is not None, "open() first"
        async with self.session.post(self.url, data=self.body(texts), headers=self.headers) as resp:  # type: ignore[attr-defined]
            data = await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {data[:200]!r}")

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()  # type: ignore[attr-defined]


class _ShmSlot:
    """One in-flight request's input and output regions, registered with Triton once."""

    def __init__(self, prefix: str, in_bytes: int, out_bytes: dict[str, int]) -> None:
        import tritonclient.utils.shared_memory as shm

        self.regions: dict[str, tuple[object, int]] = {}
        for name, size in {"input": in_bytes, **out_bytes}.items():
            region = f"{prefix}_{name}"
            handle = shm.create_shared_memory_region(region, f"/{region}", size)
            self.regions[name] = (handle, size)


class TritonTarget:
    """tritonclient.grpc.aio infer on `spec.model`; text input as BYTES [batch, 1]."""

    def __init__(self, spec: TritonSpec) -> None:
        self.spec = spec
        self.client: object | None = None
        self.outputs: dict[str, tuple[int, np.dtype]] = {}  # name -> (bytes per item, dtype)
        self.slots: list[_ShmSlot] = []
        self.max_text_bytes = 0

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
        prefix = f"lt_{uuid.uuid4().hex[:8]}"
        in_bytes = max_batch * 4096  # 4 KiB of UTF-8 per text on average; bigger requests go in-band
        for i in range(slots):
            out_bytes = {name: max_batch * per for name, (per, _) in self.outputs.items()}
            slot = _ShmSlot(f"{prefix}_{i}", in_bytes, out_bytes)
            for name, (handle, size) in slot.regions.items():
                region = f"{prefix}_{i}_{name}"
                await self.client.register_system_shared_memory(region, f"/{region}", size)  # type: ignore[attr-defined]
            self.slots.append(slot)
        self.prefix = prefix

    def _inputs(self, slot: int, texts: list[str]) -> tuple[list[object], list[object]]:
        import tritonclient.grpc.aio as grpcclient
        import tritonclient.utils as tu

        arr = np.array([[t.encode("utf-8")] for t in texts], dtype=np.object_)
        inp = grpcclient.InferInput(self.spec.input, [len(texts), 1], "BYTES")
        outs = [grpcclient.InferRequestedOutput(name) for name in self.outputs]
        if not self.spec.shm:
            inp.set_data_from_numpy(arr)
            return [inp], outs
        import tritonclient.utils.shared_memory as shm

        regions = self.slots[slot].regions
        serialized = tu.serialize_byte_tensor(arr)
        size = tu.serialized_byte_size(serialized)
        handle, cap = regions["input"]
        if size > cap:  # too big for the region: send this one in-band
            inp.set_data_from_numpy(arr)
        else:
            shm.set_shared_memory_region(handle, [serialized])
            inp.set_shared_memory(f"{self.prefix}_{slot}_input", size)
        for out in outs:
            per, _ = self.outputs[out.name()]
            out.set_shared_memory(f"{self.prefix}_{slot}_{out.name()}", per * len(texts))
        return [inp], outs

    async def call(self, slot: int, texts: list[str]) -> None:
        inputs, outputs = self._inputs(slot, texts)
        result = await self.client.infer(  # type: ignore[attr-defined]
            self.spec.model, inputs, outputs=outputs, client_timeout=self.spec.timeout_s
        )
        if self.spec.shm:
            import tritonclient.utils.shared_memory as shm

            for name, (per, dtype) in self.outputs.items():
                handle, _ = self.slots[slot].regions[name]
                shm.get_contents_as_numpy(handle, dtype, [len(texts), per // dtype.itemsize])
        else:
            for name in self.outputs:
                result.as_numpy(name)

    async def close(self) -> None:
        if self.client is None:
            return
        if self.spec.shm:
            import tritonclient.utils.shared_memory as shm

            for i, slot in enumerate(self.slots):
                for name, (handle, _) in slot.regions.items():
                    try:
                        await self.client.unregister_system_shared_memory(f"{self.prefix}_{i}_{name}")  # type: ignore[attr-defined]
                    finally:
                        shm.destroy_shared_memory_region(handle)
        await self.client.close()  # type: ignore[attr-defined]


def make_target(spec: GatewaySpec | TritonSpec) -> Target:
    """The target object for a spec."""
    return GatewayTarget(spec) if isinstance(spec, GatewaySpec) else TritonTarget(spec)
