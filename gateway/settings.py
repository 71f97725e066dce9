"""Gateway settings, read from the environment (prefix `GATEWAY_`); all listed in .env.example."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class GatewaySettings(BaseSettings):
    """Every knob of the gateway. `GATEWAY_API_KEYS` is a comma-separated list."""

    # env_ignore_empty: compose passes every setting as `${GATEWAY_X:-}`; an empty one means "the default".
    model_config = SettingsConfigDict(env_prefix="GATEWAY_", extra="ignore", env_ignore_empty=True)

    triton_url: str = Field("localhost:8001", description="Triton gRPC endpoint host:port.")
    triton_http_url: str = Field(
        "localhost:8000", pattern=r"^(none|[^/\s]+:[0-9]+)$",
        description="Triton HTTP endpoint host:port, for inference calls whose tensors are all in shared memory "
        "(less latency and worker CPU per call than gRPC: gateway/triton/http_infer.py); `none`: every call over "
        "gRPC. While it refuses connections, calls go over gRPC.",
    )
    triton_repository_key_file: str = Field(
        "", description="A file holding the key Triton's model-repository API is restricted with (tritonserver "
        "`--grpc-restricted-protocol=model-repository:triton-repository-key=KEY`): the gateway sends it with its "
        "repository calls (discovery, admin load and unload), read anew for each; empty = no key is sent.",
    )
    shm: Literal["system", "cuda", "none"] = Field(
        "system", description="`system`: tensors through system shared memory (/dev/shm shared with Triton); "
        "`cuda`: through CUDA IPC regions on the GPU (the gateway needs the GPU: compose.cuda-shm.yaml; start-up "
        "fails when this process cannot use it); `none`: plain gRPC.",
    )
    shm_cuda_device: int = Field(
        0, ge=0, description="GATEWAY_SHM=cuda: the GPU (as this process numbers them) that holds the regions; "
        "Triton's model steps should run on the same GPU.",
    )
    shm_pool_size: int = Field(16, ge=1, le=256, description="Shared-memory regions per model and worker.")
    shm_prefix: str = Field("gateway", pattern=r"^[A-Za-z0-9_]+$", description="Name prefix of the regions.")
    shm_bytes_per_token: int = Field(
        8, ge=1, description="Input region size per token of max_seq_len (bigger texts go over plain gRPC)."
    )
    pipeline: Literal["scheduler", "ensemble"] = Field(
        "scheduler",
        description="`scheduler`: the gateway tokenizes, batches texts of similar length under a token budget and "
        "calls the model steps (NAME_trt_fp16 / NAME_onnx); `ensemble`: texts go to Triton's ensembles "
        "(tokenizer inside Triton). A model whose tokenizer.json is not readable here uses its ensemble.",
    )
    repository: str = Field(
        "", description="The model repository as mounted here (read-only), for tokenizer.json; empty = none."
    )
    max_batch_tokens: int = Field(
        16384, ge=1, description="Token budget of one batch (rows x padded width), scheduler pipeline."
    )
    max_batch_requests: int = Field(
        256, ge=1, description="Most texts in one batch (also capped by the model step's max_batch_size)."
    )
    token_output_max_tokens: int = Field(
        8192, ge=1, description="Token budget of one batch whose per-token outputs come back (/embed_all, "
        "/embed_sparse of bge-m3-style models, /encode; at least max_seq_len): the shm regions of such an output hold "
        "about 1.25 x this + max_seq_len tokens x floats per token x 4 bytes.",
    )
    max_batches_in_flight: int | Literal["auto"] = Field(
        "auto", description="Batches in flight to a model step per instance Triton runs of it (all its GPUs), "
        "shared by the workers: each worker keeps ceil(this x instances / workers), at least 1 (the ensemble "
        "pipeline: that many max-size chunks of texts); texts queue and batch behind them. `auto`: 2 on a GPU "
        "step, which keeps each instance a batch ready behind the one it runs and hides the hop to Triton; 1 on a "
        "CPU step, whose instance has no transfer to hide: a second batch would only wait in Triton's queue while "
        "the gateway's queue forms fuller batches.",
    )
    batch_call_cost_tokens: int | None = Field(
        None, ge=0, description="What one more model call costs, in tokens, when batches are cut by length "
        "(contract/batching.py), and how admission scales the measured cost of calls to larger ones it has not "
        "measured yet; empty = by the model step's device (GPU 1024, CPU 64).",
    )
    tokenize_inline_chars: int = Field(
        1024, ge=0, description="A request of at most this many characters that finds the tokenizer idle is "
        "tokenized inline; others are tokenized together with concurrent ones in a worker thread.",
    )
    max_queue_wait_s: float = Field(
        0.8, gt=0, description="Admit a request only when the work ahead of it is expected to be done within this "
        "many seconds (and within 80% of its remaining deadline); else 503 `overloaded` with Retry-After (the "
        "expected time until that work is done). A request's own size never counts.",
    )
    shed_pause_s: float = Field(
        1.0, ge=0, description="While a model sheds load, a request it would refuse is held up to this pause "
        "and admitted as soon as work leaving makes room for it; else refused then "
        "(Retry-After: the wait left). A 429 over GATEWAY_MAX_IN_FLIGHT is answered after the pause too (at most "
        "1 s). Clients retrying at once cannot take the CPU the admitted work needs; 0 = answer at once.",
    )
    cache: Literal["off", "local", "redis"] = Field(
        "off", description="The embedding result cache: the pooled vector of a text embedded before (same model "
        "version, backend, prompt and truncation) is answered from it without inference; `dimensions`, "
        "normalization and the output type are applied to it as to a fresh one. `local`: an LRU in each worker's "
        "memory (GATEWAY_CACHE_BYTES each; workers do not share it); `redis`: one cache at "
        "GATEWAY_CACHE_REDIS_URL that every worker and replica shares (bounded by Redis's maxmemory); `off`: none. "
        "Off by default: only traffic that repeats texts gains from it, and each entry costs memory.",
    )
    cache_bytes: int = Field(
        256 * 1024 * 1024, ge=1024, description="GATEWAY_CACHE=local: bytes of entries each worker keeps (a "
        "768-dimensional vector takes about 3.4 KB); the least recently used are evicted past it.",
    )
    cache_redis_url: str = Field(
        "redis://localhost:6379/0", description="GATEWAY_CACHE=redis: the Redis server (redis:// or rediss:// URL, "
        "password and database included).",
    )
    cache_redis_timeout_s: float = Field(
        0.05, gt=0, description="GATEWAY_CACHE=redis: a Redis call that takes longer fails; its texts are inferred "
        "(a cache miss, counted in gateway_cache_errors_total) and Redis is left alone for a second.",
    )
    triton_timeout_s: float = Field(10.0, gt=0, description="Deadline of each Triton gRPC call.")
    request_timeout_s: float = Field(
        30.0, gt=0, description="Deadline of a whole HTTP request (504 after) that does not say its own with "
        "X-Request-Timeout.")
    max_request_timeout_s: float = Field(
        300.0, gt=0, description="The longest deadline a request may ask for with X-Request-Timeout (a longer one is "
        "cut to it). A request with its own deadline is admitted while the work ahead fits 80% of it, instead of "
        "GATEWAY_MAX_QUEUE_WAIT_S.")
    startup_timeout_s: float = Field(5.0, gt=0, description="How long start-up waits for Triton before serving.")
    ready_probe_timeout_s: float = Field(
        2.0, gt=0, description="`/readyz?deep=1`: deadline of the one-token request through each served model."
    )
    refresh_interval_s: float = Field(2.0, ge=0, description="Least time between two model re-discoveries.")
    max_inputs: int = Field(2048, ge=1, description="Most input texts in one request (413 above).")
    max_body_bytes: int = Field(
        2 * 1024 * 1024, ge=1024, description="Largest request body in bytes (413 before the body is read)."
    )
    max_input_chars: int = Field(
        100_000, ge=1, description="Longest input text in characters (413 above; truncation happens in tokens)."
    )
    long_inputs: Literal["truncate", "chunk"] = Field(
        "truncate", description="What /embed and /v1/embeddings do with a text over the model's window when the "
        "request does not say (`truncate`): `truncate` cuts it; `chunk` embeds it in windows of the model's length "
        "and answers their token-weighted mean (a request's `truncate: \"chunk\"`).",
    )
    chunk_overlap_tokens: int = Field(
        0, ge=0, description="Chunked long inputs: tokens each window repeats of the one before (at most half a "
        "window).",
    )
    max_chunked_tokens: int = Field(
        65536, ge=1, description="Chunked long inputs: most tokens the texts of one request may hold (413 "
        "`input_too_long` above); every window is a row of the model's batches.",
    )
    max_token_values: int = Field(
        2**24, ge=1, description="Most floats one answer of per-token vectors may hold (/embed_all, "
        "/embed_multi_vector, /encode, TEI's /embed_all): the tokens of every input (after truncation) x the floats per "
        "token; 413 `answer_too_large` before inference above. The default holds what TEI's own default limits "
        "allow (32 inputs of 512 tokens) at 1,024 floats per token, about 180 MB of JSON.",
    )
    max_tokenize_tokens: int = Field(
        2**17, ge=1, description="Most tokens one /tokenize answer may hold (each becomes an object of id, text, "
        "special flag and offsets, about 65 bytes of JSON); 413 `answer_too_large` above. The default holds one "
        "text of GATEWAY_MAX_INPUT_CHARS characters at about a token per character.",
    )
    max_in_flight: int = Field(512, ge=1, description="Requests in flight per worker (429 above).")
    max_connections: int = Field(
        2048, ge=1, description="Open connections per worker; one more is answered 503 and closed.")
    max_header_bytes: int = Field(
        32 * 1024, ge=1024, description="Largest request head (request line and headers) in bytes: 431, and the "
        "connection is closed, past it (or past GATEWAY_MAX_HEADERS headers).")
    max_headers: int = Field(100, ge=8, description="Most headers in one request (431 above).")
    header_timeout_s: float = Field(
        10.0, gt=0, description="A request head must arrive within this many seconds of its first byte (or of the "
        "connection's opening): 408, and the connection is closed. Bounds what slow clients hold.")
    body_timeout_s: float = Field(
        30.0, gt=0, description="A request body must arrive within this many seconds of its head: 408, and the "
        "connection is closed.")
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Accepted bearer keys; empty list = no auth."
    )
    admin_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Bearer keys of the admin routes (/admin/models: load, unload, reload "
        "model families); empty list = the admin routes are off (404). Separate from GATEWAY_API_KEYS.",
    )
    admin_timeout_s: float = Field(
        600.0, gt=0, description="How long an admin load or unload waits for Triton (a TensorRT engine can take minutes).",
    )
    request_id_header: str = Field("X-Request-ID", description="Request id header, echoed back.")
    host: str = Field("0.0.0.0", description="Listen address.")
    port: int = Field(8080, ge=1, le=65535, description="Listen port.")
    workers: int | Literal["auto"] = Field(
        "auto", description="Worker processes: a number, or `auto` (1 to 12): the CPUs of the gateway's own "
        "CPU quota (a container limit), else three quarters of the host's CPUs (12 on a 16-core GPU host; the rest "
        "is left to Triton and its python stubs). Each worker batches its own requests; Triton merges the batches "
        "of all workers.",
    )
    tokenizer_threads: int | Literal["auto"] = Field(
        "auto", description="Threads of the Rust tokenizer's pool in each worker: a number (1 = no pool: the worker "
        "tokenizes on one thread), or `auto`: the worker's share of the gateway's CPUs (the quota, else three "
        "quarters of the host's), and at least 4 where the gateway has 8 CPUs or more (4 with the default 12 workers "
        "on a 16-core host; 1 on a 2-core host or with a CPU limit of 2): a pool shortens a many-text request's "
        "tokenizing where the gateway has spare cores, and takes throughput where it has none. Without the setting "
        "every worker would start a pool as large as the host.",
    )
    loop: Literal["asyncio", "uvloop", "auto"] = Field(
        "asyncio", description="Event loop; grpc.aio has no native uvloop support (it polls)."
    )
    direct_routes: bool = Field(
        True, description="Hand the POSTs of the API's routes to the edge straight from the HTTP protocol, without "
        "an ASGI cycle per request (gateway/http_protocol.py): the same steps and answers at less CPU per request. "
        "false = every request through the ASGI app. While tracing (OTEL_*) is on, every request takes the ASGI "
        "app, whose server span is FastAPI's.",
    )
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    docs: bool = Field(True, description="Serve /docs (Swagger UI, assets bundled: works offline) and /openapi.json.")
    metrics_dir: str = Field(
        "", description="PROMETHEUS_MULTIPROC_DIR for several workers; empty = a fresh temp dir."
    )

    @field_validator("workers", "tokenizer_threads", "max_batches_in_flight", mode="before")
    @classmethod
    def _count_or_auto(cls, value: object) -> object:
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        if isinstance(value, int) and value < 1:
            raise ValueError("must be at least 1 (or auto)")
        return value

    @property
    def worker_count(self) -> int:
        """`workers`, with `auto` resolved for this host."""
        return self.workers if isinstance(self.workers, int) else auto_workers()

    @property
    def tokenizer_thread_count(self) -> int:
        """`tokenizer_threads`, with `auto` resolved: the worker's share of the gateway's CPUs, at least 1, and at
        least AUTO_TOKENIZER_THREADS where the gateway has POOL_MIN_CPUS or more."""
        if isinstance(self.tokenizer_threads, int):
            return self.tokenizer_threads
        return auto_tokenizer_threads(self.worker_count)

    @field_validator("api_keys", "admin_keys", mode="before")
    @classmethod
    def _split_keys(cls, value: object) -> object:
        if isinstance(value, str):
            return [k.strip() for k in value.split(",") if k.strip()]
        return value


def cpu_quota() -> int | None:
    """CPUs of this process's cgroup v2 quota (a container's `cpus` limit), or None without one."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else max(1, int(int(quota) / int(period)))


def gateway_cpus() -> int:
    """The CPUs the gateway counts as its own, at least 1: those of this process's quota (a gateway container
    with a CPU limit has them to itself); without one, three quarters of the CPUs it may run on (the rest is left
    to Triton and its python stubs on the same host, which take a few cores at the most single-text load)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    quota = cpu_quota()
    return max(1, min(quota, cpus) if quota is not None else cpus * 3 // 4)


MAX_AUTO_WORKERS = 12  # the largest worker count the benchmarks showed to pay (docs/benchmarks.md)


def auto_workers() -> int:
    """GATEWAY_WORKERS=auto, 1 to MAX_AUTO_WORKERS: the gateway's CPUs (`gateway_cpus`: 12 on a 16-core GPU host)."""
    return min(MAX_AUTO_WORKERS, gateway_cpus())


# A pool of 4 per worker pays where the gateway has cores to spare and costs throughput where it has none: it starts
# at POOL_MIN_CPUS of the gateway's CPUs.
AUTO_TOKENIZER_THREADS = 4
POOL_MIN_CPUS = 8


def auto_tokenizer_threads(workers: int) -> int:
    """GATEWAY_TOKENIZER_THREADS=auto for `workers` workers: each one's share of the gateway's CPUs, at least 1, and
    at least AUTO_TOKENIZER_THREADS where the gateway has POOL_MIN_CPUS or more."""
    cpus = gateway_cpus()
    share = max(1, cpus // workers)
    return max(share, AUTO_TOKENIZER_THREADS) if cpus >= POOL_MIN_CPUS else share


@lru_cache(maxsize=1)
def get_settings() -> GatewaySettings:
    """The process-wide settings, read once from the environment."""
    return GatewaySettings()
