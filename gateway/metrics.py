"""Prometheus metrics of the gateway (Triton exposes its own on its metrics port).

Final names (the Grafana dashboard is built from them; all prefixed `gateway_`):

| name | type | labels |
| --- | --- | --- |
| gateway_requests_total | counter | route, model, status |
| gateway_request_duration_seconds | histogram | route, model |
| gateway_triton_request_duration_seconds | histogram | model, transport (shm, grpc) |
| gateway_inputs_per_request | histogram | route |
| gateway_tokens_total | counter | route, model |
| gateway_shm_regions_in_use | gauge | (none) |
| gateway_shm_regions | gauge | (none): size of the pool |
| gateway_in_flight_requests | gauge | (none) |
| gateway_errors_total | counter | type (the error `type` of the JSON error body) |
| gateway_batch_size | histogram | model: texts per batch the scheduler formed |
| gateway_batch_tokens | histogram | model: tokens computed per batch (rows x padded width; the real tokens of a packed batch) |
| gateway_scheduled_tokens_total | counter | model, kind (`real`: the texts' own tokens; `computed`: rows x padded width, or the real tokens of a packed batch) |
| gateway_batch_queue_seconds | histogram | model: how long the oldest text of a batch waited in the queue |
| gateway_lane_wait_seconds | histogram | model, lane: the same per lane (`interactive`, `batch`: X-Priority) |
| gateway_tokenize_seconds | histogram | model: tokenization time of one request in the gateway |
| gateway_queued_texts | gauge | (none): texts waiting in the schedulers' queues |
| gateway_cache_lookups_total | counter | model, result (`hit`, `miss`): texts looked up in the result cache |
| gateway_cache_evictions_total | counter | (none): entries the per-worker cache evicted for room |
| gateway_cache_bytes | gauge | (none): bytes the per-worker caches hold (all workers) |
| gateway_cache_errors_total | counter | operation (`get`, `put`, `invalidate`): Redis calls that failed |

The padding ratio is `gateway_scheduled_tokens_total{kind="computed"} / gateway_scheduled_tokens_total{kind="real"}`
(1.0 = no padding).

`model` is the served model NAME (or "" when the request failed before one was chosen);
`route` is the route template ("/classify", "/embed", "/v1/embeddings").

Several uvicorn workers: prometheus-client's multiprocess mode. `python -m gateway`
sets `PROMETHEUS_MULTIPROC_DIR` (an empty temporary directory, or the one given) BEFORE
prometheus_client is imported, whenever it runs more than one worker; every worker then
writes its values to mmap files in that directory, and `/metrics`, answered by whichever
worker gets the scrape, aggregates all of them with `MultiProcessCollector`. Counters and
histograms are summed across workers; the gauges use `livesum` (sum over live workers),
and a worker that exits is marked dead (`mark_process_dead`) so its gauges drop out.
With one worker and no `PROMETHEUS_MULTIPROC_DIR`, the default in-process registry is used.
"""

from __future__ import annotations

import os

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"

_LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.025, 0.05, 0.075,
    0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0,
)
_INPUT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)

REQUESTS = Counter(
    "gateway_requests_total",
    "HTTP requests answered, by route template, model and HTTP status.",
    ("route", "model", "status"),
)
REQUEST_LATENCY = Histogram(
    "gateway_request_duration_seconds",
    "Whole HTTP request latency inside the gateway.",
    ("route", "model"),
    buckets=_LATENCY_BUCKETS,
)
TRITON_LATENCY = Histogram(
    "gateway_triton_request_duration_seconds",
    "Latency of one Triton gRPC infer call (one batch chunk).",
    ("model", "transport"),
    buckets=_LATENCY_BUCKETS,
)
INPUTS_PER_REQUEST = Histogram(
    "gateway_inputs_per_request",
    "Number of input texts in one HTTP request.",
    ("route",),
    buckets=_INPUT_BUCKETS,
)
TOKENS = Counter(
    "gateway_tokens_total",
    "Tokens processed (min(num_tokens, max_seq_len) per input).",
    ("route", "model"),
)
SHM_IN_USE = Gauge(
    "gateway_shm_regions_in_use",
    "Shared-memory regions currently leased by requests.",
    multiprocess_mode="livesum",
)
SHM_REGIONS = Gauge(
    "gateway_shm_regions",
    "Shared-memory regions in the pool (all workers).",
    multiprocess_mode="livesum",
)
SHM_RETIRED = Gauge(
    "gateway_shm_regions_retired",
    "Regions of abandoned calls waiting for Triton to release them before reuse.",
    multiprocess_mode="livesum",
)
IN_FLIGHT = Gauge(
    "gateway_in_flight_requests",
    "Requests being processed (all workers).",
    multiprocess_mode="livesum",
)
BATCH_SIZE = Histogram(
    "gateway_batch_size",
    "Texts per batch the gateway's scheduler formed.",
    ("model",),
    buckets=_INPUT_BUCKETS,
)
BATCH_TOKENS = Histogram(
    "gateway_batch_tokens",
    "Tokens computed per batch the gateway formed (rows x padded width; a packed batch's real tokens).",
    ("model",),
    buckets=(64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536),
)
BATCH_TOKENS_TOTAL = Counter(
    "gateway_scheduled_tokens_total",
    "Tokens in the batches the gateway formed: kind=real (the texts' own) or computed (rows x padded width; "
    "a packed step computes the real ones only).",
    ("model", "kind"),
)
QUEUE_WAIT = Histogram(
    "gateway_batch_queue_seconds",
    "How long the oldest text of a batch waited in the gateway's queue before the batch was sent.",
    ("model",),
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)
LANE_WAIT = Histogram(
    "gateway_lane_wait_seconds",
    "How long the oldest text of each lane (X-Priority: interactive, batch) in a batch waited in the gateway's "
    "queue before the batch was sent.",
    ("model", "lane"),
    buckets=(0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0),
)
TOKENIZE = Histogram(
    "gateway_tokenize_seconds",
    "Tokenization time of one request in the gateway.",
    ("model",),
    buckets=(0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5),
)
QUEUED = Gauge(
    "gateway_queued_texts",
    "Texts waiting in the gateway's batch queues (all workers).",
    multiprocess_mode="livesum",
)
CACHE_LOOKUPS = Counter(
    "gateway_cache_lookups_total",
    "Texts looked up in the embedding result cache, by model and result (hit, miss).",
    ("model", "result"),
)
CACHE_EVICTIONS = Counter(
    "gateway_cache_evictions_total",
    "Entries the per-worker result cache evicted to stay within GATEWAY_CACHE_BYTES.",
)
CACHE_BYTES = Gauge(
    "gateway_cache_bytes",
    "Bytes held by the per-worker result caches (all workers).",
    multiprocess_mode="livesum",
)
CACHE_ERRORS = Counter(
    "gateway_cache_errors_total",
    "Calls to the shared result cache (Redis) that failed or timed out; the texts were inferred instead.",
    ("operation",),
)
ERRORS = Counter(
    "gateway_errors_total",
    "Error responses by error type (the `type` field of the JSON error body).",
    ("type",),
)


class BatchMetrics:
    """The batching metrics of one served model, with their label children looked up once."""

    def __init__(self, model: str) -> None:
        self._size = BATCH_SIZE.labels(model)
        self._tokens = BATCH_TOKENS.labels(model)
        self._real = BATCH_TOKENS_TOTAL.labels(model, "real")
        self._computed = BATCH_TOKENS_TOTAL.labels(model, "computed")
        self._wait = QUEUE_WAIT.labels(model)
        self._lane_wait = {lane: LANE_WAIT.labels(model, lane) for lane in ("interactive", "batch")}
        self.tokenize = TOKENIZE.labels(model)

    def observe(self, rows: int, computed: int, real: int, waited: float) -> None:
        """One batch formed: `rows` texts, `computed` tokens the step computes for them (rows x padded width,
        or the real ones of a packed batch), `real` tokens of their own, the oldest waited `waited` s."""
        self._size.observe(rows)
        self._tokens.observe(computed)
        self._real.inc(real)
        self._computed.inc(computed)
        self._wait.observe(waited)

    def lane_waited(self, lane: str, waited: float) -> None:
        """The oldest text of `lane` in a batch waited `waited` s."""
        self._lane_wait[lane].observe(waited)

    @staticmethod
    def queued(delta: int) -> None:
        """Texts entered (+) or left (-) a batch queue."""
        QUEUED.inc(delta)


def multiprocess_enabled() -> bool:
    """True when values live in PROMETHEUS_MULTIPROC_DIR files (several workers)."""
    return bool(os.environ.get(MULTIPROC_ENV))


def render_latest() -> tuple[bytes, str]:
    """The exposition text of all gateway metrics (aggregated over workers) and its content type."""
    if multiprocess_enabled():
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry), CONTENT_TYPE_LATEST
    from prometheus_client import REGISTRY

    return generate_latest(REGISTRY), CONTENT_TYPE_LATEST


def mark_worker_dead(pid: int) -> None:
    """Drop a dead worker's live gauges (call from the parent or at worker exit)."""
    if multiprocess_enabled():
        multiprocess.mark_process_dead(pid)
