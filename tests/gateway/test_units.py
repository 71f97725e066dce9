"""Settings, schemas, serialization and shm layout: the parts that need no Triton."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError
from tritonclient.utils import serialize_byte_tensor

from gateway.api.schemas import ClassifyRequest, OpenAIEmbeddingRequest
from gateway.api.tei_errors import openai_route
from gateway.service.classify import softmax
from gateway.service.embed import l2_normalize
import gateway.settings
from gateway.__main__ import tokenizer_environment
from gateway.settings import GatewaySettings
from gateway.triton.shm_pool import (
    Region,
    RegionLayout,
    ShmPool,
    region_maker,
    serialize_texts,
)
from tests.gateway.conftest import shm_segments

REPO = Path(__file__).resolve().parents[2]


def test_settings_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_API_KEYS", " k1, k2 ,")
    monkeypatch.setenv("GATEWAY_SHM", "none")
    monkeypatch.setenv("GATEWAY_WORKERS", "4")
    s = GatewaySettings()
    assert s.api_keys == ["k1", "k2"] and s.shm == "none" and s.workers == 4
    monkeypatch.setenv("GATEWAY_SHM", "gpu")
    with pytest.raises(ValidationError):
        GatewaySettings()


@pytest.mark.parametrize(("cpus", "quota", "workers", "threads"), [
    (16, None, 12, 4),  # a 16-core GPU host: three quarters of it, pools of 4
    (64, None, 12, 4),  # at most 12 workers, the most measured
    (2, None, 1, 1),  # the 2-core dev VM: one CPU of its own, no pool
    (4, None, 3, 1),  # below 8 CPUs of its own: one thread per worker (a pool costs where no core is spare)
    (16, 2, 2, 1),  # the Kubernetes base's CPU limit of 2
    (16, 4, 4, 1),  # a container limit: its CPUs are the gateway's own
    (16, 8, 8, 4),
    (16, 32, 12, 4),  # a quota above the CPUs it may run on counts those CPUs
])
def test_auto_workers_and_tokenizer_threads(monkeypatch: pytest.MonkeyPatch, cpus: int, quota: int | None,
                                            workers: int, threads: int) -> None:
    """GATEWAY_WORKERS=auto: the gateway's CPUs (its quota, else three quarters of the host's), 1 to 12;
    GATEWAY_TOKENIZER_THREADS=auto: the worker's share of those CPUs, at least 4 where they are 8 or more."""
    monkeypatch.setattr(gateway.settings.os, "sched_getaffinity", lambda _pid: set(range(cpus)))
    monkeypatch.setattr(gateway.settings, "cpu_quota", lambda: quota)
    assert GatewaySettings(workers="auto").worker_count == workers
    assert GatewaySettings(workers="auto").tokenizer_thread_count == threads


def test_tokenizer_pool_per_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    """auto: the worker's share of the gateway's CPUs (1 = no pool), at least 4 where they are 8 or more; or the
    number named."""
    monkeypatch.setattr(gateway.settings, "gateway_cpus", lambda: 8)
    off = {"TOKENIZERS_PARALLELISM": "false"}
    four = {"TOKENIZERS_PARALLELISM": "true", "RAYON_NUM_THREADS": "4"}
    assert GatewaySettings(workers="auto").tokenizer_thread_count == 4
    assert tokenizer_environment(GatewaySettings(workers=8)) == four
    assert tokenizer_environment(GatewaySettings(workers=16)) == four
    assert tokenizer_environment(GatewaySettings(workers=1))["RAYON_NUM_THREADS"] == "8"
    assert tokenizer_environment(GatewaySettings(workers=2, tokenizer_threads="1")) == off
    assert tokenizer_environment(GatewaySettings(workers=8, tokenizer_threads=3))["RAYON_NUM_THREADS"] == "3"
    monkeypatch.setattr(gateway.settings, "gateway_cpus", lambda: 7)
    assert tokenizer_environment(GatewaySettings(workers=7)) == off
    assert tokenizer_environment(GatewaySettings(workers=3))["RAYON_NUM_THREADS"] == "2"
    with pytest.raises(ValidationError):
        GatewaySettings(tokenizer_threads=0)


@pytest.mark.parametrize("inputs", [[], [1], ["a", None], 5, None])
def test_schema_rejects_bad_inputs(inputs: object) -> None:
    with pytest.raises(ValidationError):
        ClassifyRequest.model_validate({"inputs": inputs})


def test_schema_accepts_text_or_list() -> None:
    assert ClassifyRequest.model_validate({"inputs": "x"}).inputs == "x"
    assert OpenAIEmbeddingRequest.model_validate({"input": ["a", "b"], "model": "m"}).input == ["a", "b"]


def test_serialize_texts_matches_tritonclient() -> None:
    texts = ["", "héllo", "a" * 300]
    expected = serialize_byte_tensor(np.array([t.encode() for t in texts], dtype=np.object_)).item()
    assert serialize_texts([t.encode() for t in texts]) == expected


def test_softmax_and_normalize() -> None:
    logits = np.array([[1.0, 2.0, 3.0], [1000.0, 0.0, -1000.0]], dtype=np.float32)
    probs = softmax(logits)
    np.testing.assert_allclose(probs.sum(axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(probs[0], np.exp([1, 2, 3]) / np.exp([1, 2, 3]).sum(), rtol=1e-5)
    vecs = l2_normalize(np.array([[3.0, 4.0], [0.0, 0.0]], dtype=np.float32))
    np.testing.assert_allclose(vecs, [[0.6, 0.8], [0.0, 0.0]])


def test_layout_is_aligned_and_disjoint() -> None:
    layout = RegionLayout.of({"text": 8 * (4 + 64 * 8), "logits": 8 * 3 * 4, "num_tokens": 8 * 4})
    assert layout.offset("text") == 0 and layout.size("text") >= 8 * (4 + 64 * 8)
    assert layout.offset("logits") >= layout.size("text")
    assert layout.offset("num_tokens") >= layout.offset("logits") + 8 * 3 * 4
    assert all(offset % 64 == 0 and size % 64 == 0 for offset, size in layout.slots.values())
    assert layout.byte_size == layout.offset("num_tokens") + layout.size("num_tokens")


@pytest.mark.anyio
async def test_pool_leases_never_waits_holds_back_abandoned_regions_and_unlinks() -> None:
    prefix = "gwunitpool"
    pool = ShmPool(region_maker("system", prefix), RegionLayout.of({"text": 64, "logits": 16, "num_tokens": 8}), size=2)
    abandoned: list[Region] = []
    pool.on_abandoned = abandoned.append  # the client unregisters it until Triton lets go, then gives it back
    assert len(shm_segments(prefix)) == 2
    async with pool.lease() as region, pool.lease() as other:
        assert region is not None and other is not None and pool.free == 0
        async with pool.lease() as busy:
            assert busy is None  # every region is leased: the caller goes over plain gRPC
    assert pool.free == 2
    with pytest.raises(asyncio.CancelledError):
        async with pool.lease() as gone:
            raise asyncio.CancelledError  # abandoned call: Triton may still read and write the region
    assert abandoned == [gone] and pool.free == 1
    with pytest.raises(ValueError, match="not fit"):
        gone.write("logits", b"x" * 65)  # every write and read is bound-checked against its slot
    with pytest.raises(ValueError, match="not fit"):
        gone.read("num_tokens", np.float32, (17,))
    pool.give_back(gone)
    assert pool.free == 2
    async with pool.lease() as leased:
        assert pool.close() and pool.free == 0  # closed: the free region is handed out for unlinking
        async with pool.lease() as none:
            assert none is None
    assert leased not in pool.regions  # unlinked when its call returned
    pool.destroy(list(pool.regions))
    assert shm_segments(prefix) == []


def test_stale_segment_of_a_crashed_gateway_is_replaced() -> None:
    from multiprocessing import shared_memory

    from gateway.triton import shm_pool

    prefix = "gwunitstale"
    layout = RegionLayout.of({"text": 64, "logits": 16, "num_tokens": 8})
    before = next(shm_pool._counter)
    stale = shared_memory.SharedMemory(f"{prefix}_{os.getpid()}_{before + 1}", create=True, size=8)
    try:
        pool = ShmPool(region_maker("system", prefix), layout, size=1)
        assert pool.regions[0].name == stale.name
        assert len(pool.regions[0].buffer) >= layout.byte_size  # a new, full-size segment
        pool.destroy(list(pool.regions))
    finally:
        stale.close()
    assert shm_segments(prefix) == []


def test_system_region_is_the_memory_tritonclient_made() -> None:
    """The region's own mapping and tritonclient's public shm calls (with offsets) see the same bytes."""
    import tritonclient.utils.shared_memory as tshm

    layout = RegionLayout.of({"input_ids": 24, "embeddings": 32})
    region = region_maker("system", "gwunitmap")(layout)
    try:
        ids = np.arange(6, dtype=np.int32).reshape(2, 3)
        region.write("input_ids", ids)
        seen = tshm.get_contents_as_numpy(region.handle, np.int32, (2, 3), offset=layout.offset("input_ids"))
        np.testing.assert_array_equal(seen, ids)
        vectors = np.linspace(0, 1, 8, dtype=np.float32).reshape(2, 4)
        tshm.set_shared_memory_region(region.handle, [vectors], offset=layout.offset("embeddings"))
        np.testing.assert_array_equal(region.read("embeddings", np.float32, (2, 4)), vectors)
    finally:
        region.destroy()
    assert shm_segments("gwunitmap") == []


def test_cuda_device_pointer_comes_from_tritonclients_region(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one read of a tritonclient private attribute (a CUDA region's device pointer): fails here, loudly,
    when an upgrade of tritonclient renames it, not on a GPU host at start-up."""
    cudashm = pytest.importorskip("tritonclient.utils.cuda_shared_memory")
    from gateway.triton.shm_pool import ShmUnavailable, device_pointer

    monkeypatch.setattr(cudashm.CudaSharedMemoryRegion, "__del__", lambda self: None)  # nothing was allocated
    handle = cudashm.CudaSharedMemoryRegion("gwunit", None, 0x7F00_0000_1000, 4096, 0)
    assert device_pointer(handle) == 0x7F00_0000_1000
    with pytest.raises(ShmUnavailable, match="no longer keeps a CUDA region's device pointer"):
        device_pointer(object())


def test_env_example_lists_every_setting_with_its_default() -> None:
    import re

    text = (Path(__file__).resolve().parents[2] / ".env.example").read_text()
    section = text.split("# --- gateway ---", 1)[1]
    listed = dict(re.findall(r"^GATEWAY_(\w+)=(.*)$", section, re.M))
    defaults = GatewaySettings.model_construct()  # the declared defaults, without reading the environment
    for name in GatewaySettings.model_fields:
        assert name.upper() in listed, name
        value = getattr(defaults, name)
        shown = ",".join(value) if isinstance(value, list) else "" if value is None else str(value)
        shown = shown.lower() if isinstance(value, bool) else shown
        assert listed[name.upper()] == shown, name


def test_shm_transport_selects_the_region_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    from gateway.triton import shm_pool

    made: list[tuple[str, int]] = []

    class Recorded:
        def __init__(self, prefix: str, layout: RegionLayout, device: int) -> None:
            made.append((prefix, device))

    monkeypatch.setattr(shm_pool, "CudaRegion", Recorded)
    layout = RegionLayout.of({"text": 64})
    assert isinstance(region_maker("cuda", "gwsel", 3)(layout), Recorded) and made == [("gwsel", 3)]
    system = region_maker("system", "gwunitsel")(layout)
    try:
        assert isinstance(system, shm_pool.SystemRegion) and made == [("gwsel", 3)]
    finally:
        system.destroy()
    assert GatewaySettings(shm="cuda").shm == "cuda"
    with pytest.raises(ValueError):
        GatewaySettings(shm="gpu")


def test_cuda_transport_without_the_cuda_package_names_the_missing_package(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from gateway.triton.shm_pool import ShmUnavailable, probe_cuda

    monkeypatch.setitem(sys.modules, "cuda.bindings.runtime", None)  # as if cuda-bindings were not installed
    monkeypatch.setitem(sys.modules, "tritonclient.utils.cuda_shared_memory", None)
    with pytest.raises(ShmUnavailable, match="cannot be imported .*install cuda-bindings"):
        probe_cuda(0)


def test_cuda_transport_without_a_usable_gpu_fails_start_up_with_the_reason() -> None:
    """A real gateway process with GATEWAY_SHM=cuda that sees no GPU (none here; hidden where there is one):
    exit 2 with one line naming the cause and the way out, no worker started, no fallback."""
    import subprocess
    import sys

    env = {**os.environ, "GATEWAY_SHM": "cuda", "CUDA_VISIBLE_DEVICES": "", "GATEWAY_PORT": "1"}
    done = subprocess.run([sys.executable, "-m", "gateway"], env=env, capture_output=True, text=True, timeout=60,
                          cwd=REPO)
    assert done.returncode == 2, done.stderr
    assert "GATEWAY_SHM=cuda, but CUDA is not usable in this process" in done.stderr
    assert "compose.cuda-shm.yaml" in done.stderr and "GATEWAY_SHM=system" in done.stderr
    assert "Uvicorn running" not in done.stderr and "Started server process" not in done.stderr
    # the same check guards the client itself (an app made by create_app in another server, tests)
    code = "from gateway.settings import GatewaySettings as S; from gateway.triton.client import TritonClient as T; T(S())"
    client = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert client.returncode == 1 and "ShmUnavailable: CUDA is not usable in this process" in client.stderr


@pytest.mark.parametrize(("path", "openai"), [
    ("/tei/st/v1/embeddings", True), ("/tei/st/embeddings", True), ("/tei/{model}/v1/embeddings", True),
    ("/tei/v1/embeddings", True),  # a model named v1: its /embeddings
    ("/v1/embeddings", False), ("/embeddings", False),  # the gateway's own routes keep the gateway's shape
    ("/tei/st/embed", False), ("/tei/st/x/embeddings", False), ("/tei/st", False),
])
def test_tei_openai_route(path: str, openai: bool) -> None:
    """Which error answers under /tei/ take TEI's OpenAI shape."""
    assert openai_route(path) is openai
