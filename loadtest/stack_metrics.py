"""What bench7 (and ab-gateway) read of a running stack: the gateway's scheduler counters and Triton's per-model
statistics around each load step, the gateway's worker count, and the metrics kept for the logs."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

from devstack.tritonserver import TritonServer


def metric_sums(url: str, names: dict[str, tuple[str, dict[str, str]]]) -> dict[str, float]:
    """key -> the sum of the samples of a metric on one scrape of `url`/metrics whose labels include the given
    ones (names: key -> (metric sample name, labels))."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    totals = dict.fromkeys(names, 0.0)
    for line in text.splitlines():
        sample = line.split("{", 1)[0].split(" ", 1)[0]
        for key, (name, labels) in names.items():
            if sample == name and all(f'{k}="{v}"' in line for k, v in labels.items()):
                totals[key] += float(line.rsplit(" ", 1)[1])
    return totals


# What bench7 reads of the gateway's metrics before and after each step (the step's share is the difference)
SCHEDULER_COUNTERS = {
    "real": ("gateway_scheduled_tokens_total", {"kind": "real"}),
    "computed": ("gateway_scheduled_tokens_total", {"kind": "computed"}),
    "batches": ("gateway_batch_size_count", {}),
    "texts": ("gateway_batch_size_sum", {}),
    "triton_s": ("gateway_triton_request_duration_seconds_sum", {}),
    "triton_calls": ("gateway_triton_request_duration_seconds_count", {}),
    # where a request's time goes inside the gateway: from the app's first look at it to its answer written
    "request_s": ("gateway_request_duration_seconds_sum", {}),
    "requests": ("gateway_request_duration_seconds_count", {}),
    "tokenize_s": ("gateway_tokenize_seconds_sum", {}),
    "tokenized": ("gateway_tokenize_seconds_count", {}),
    "oldest_wait_s": ("gateway_batch_queue_seconds_sum", {}),
}


def scheduler_counters(url: str) -> dict[str, float]:
    return metric_sums(url, SCHEDULER_COUNTERS)


def batching_stats(delta: dict[str, float]) -> dict[str, float]:
    """A step's batching figures from the difference of two `scheduler_counters`."""
    def per(total: str, count: str, scale: float = 1.0) -> float:
        return scale * delta[total] / delta[count] if delta[count] else float("nan")

    return {
        "padding_ratio": per("computed", "real"),
        "mean_batch_texts": per("texts", "batches"),
        "batches": delta["batches"],
        "gateway_to_triton_ms": per("triton_s", "triton_calls", 1e3) if delta["triton_calls"] else 0.0,
        "gateway_request_ms": per("request_s", "requests", 1e3),
        "tokenize_ms": per("tokenize_s", "tokenized", 1e3),
        "oldest_queue_wait_ms": per("oldest_wait_s", "batches", 1e3),
    }


def step_stats(grpc_url: str, model: str) -> dict[str, float]:
    """Triton's cumulative statistics of one model: executions, requests, and ns summed over requests of each
    request's whole time in Triton (`success`) and of its queue and compute parts."""
    import tritonclient.grpc as grpcclient

    stats = grpcclient.InferenceServerClient(grpc_url).get_inference_statistics(model, as_json=True)
    entry = stats["model_stats"][0]
    inference = entry["inference_stats"]
    out = {"executions": float(entry.get("execution_count", 0)),
           "requests": float(inference.get("success", {}).get("count", 0)),
           "success": float(inference.get("success", {}).get("ns", 0))}
    for key in ("queue", "compute_input", "compute_infer", "compute_output"):  # zero fields are left out
        out[key] = float(inference.get(key, {}).get("ns", 0))
    return out


def triton_times(delta: dict[str, float]) -> dict[str, float]:
    """Per request, from the difference of two `step_stats`, in ms: Triton's whole time (from the request's arrival
    in Triton's core to its response), its queue and its compute; and the executions."""
    requests = delta["requests"] or 1.0
    return {
        "triton_executions": delta["executions"],
        "triton_request_ms_per_request": delta["success"] / requests / 1e6,
        "triton_queue_ms_per_request": delta["queue"] / requests / 1e6,
        "triton_compute_ms_per_request": (delta["compute_input"] + delta["compute_infer"] + delta["compute_output"])
        / requests / 1e6,
    }


def worker_count(pid: int) -> int:
    """Worker processes of a gateway (its children but multiprocessing's resource tracker, which uvicorn's spawned
    workers bring; 1 when it serves in-process)."""
    import psutil

    workers = 0
    for child in psutil.Process(pid).children():
        try:
            if "resource_tracker" not in " ".join(child.cmdline()):
                workers += 1
        except psutil.Error:  # gone meanwhile
            continue
    return max(1, workers)


def wait_until_served(url: str, timeout_s: float = 60.0) -> None:
    """Until the gateway's workers have discovered the model (every worker answers /v1/models with it)."""
    deadline = time.monotonic() + timeout_s
    seen = 0
    while time.monotonic() < deadline and seen < 16:  # 16 answers in a row, spread over the workers
        with urllib.request.urlopen(f"{url}/v1/models", timeout=5) as resp:
            seen = seen + 1 if b'"bench"' in resp.read() else 0
        time.sleep(0.05)


def save_diagnostics(work: Path, tag: str, gateway_url: str, triton: TritonServer) -> None:
    """The gateway's and Triton's /metrics and Triton's per-model statistics after a series (for the logs)."""
    import tritonclient.grpc as grpcclient

    for name, url in (("gateway", f"{gateway_url}/metrics"), ("triton", triton.metrics_url)):
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                (work / f"{name}-metrics-{tag}.txt").write_bytes(resp.read())
        except OSError as exc:
            (work / f"{name}-metrics-{tag}.txt").write_text(f"unavailable: {exc}\n")
    stats = grpcclient.InferenceServerClient(triton.grpc_url).get_inference_statistics(as_json=True)
    (work / f"triton-stats-{tag}.json").write_text(json.dumps(stats, indent=1))
