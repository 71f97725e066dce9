"""Every metric the Grafana dashboard queries is really exported: by the gateway (served
in-process against a real tritonserver, scheduler pipeline) and by that tritonserver (the builder's tiny
`--runtime python` repository), after real /classify, /embed and error traffic.

The CPU tritonserver here exports the nv_inference_* family but no nv_gpu_* metrics (those come
only from a Triton with a visible NVIDIA GPU); the dashboard's GPU panels use exactly the names
in GPU_ONLY_METRICS, which this machine cannot produce. On a GPU host check them with
`curl -s localhost:8002/metrics | grep ^nv_gpu_` (docs/deployment.md)."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from pathlib import Path

import httpx

from devstack.tritonserver import TritonServer
from gateway.app import create_app
from gateway.settings import GatewaySettings

DASHBOARD = Path(__file__).resolve().parents[2] / "monitoring" / "grafana" / "dashboards" / "bert-serving.json"
GPU_ONLY_METRICS = {"nv_gpu_utilization", "nv_gpu_memory_used_bytes", "nv_gpu_memory_total_bytes", "nv_gpu_power_usage"}
_METRIC = re.compile(r"\b((?:gateway|nv)_[a-z0-9_]+)\b")


def dashboard_metrics() -> set[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return {m for p in panels for t in p.get("targets", []) for m in _METRIC.findall(t["expr"])}


def sample_names(exposition: str) -> set[str]:
    """Names of the samples in a Prometheus text exposition (not just HELP/TYPE lines)."""
    return {line.split("{", 1)[0].split(" ", 1)[0] for line in exposition.splitlines() if line and not line.startswith("#")}


async def gateway_exposition_after_traffic(triton_url: str, repository: Path) -> str:
    """The scheduler pipeline (it exports the batching metrics too), after real traffic."""
    app = create_app(GatewaySettings(triton_url=triton_url, repository=str(repository)))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway", timeout=60) as client:
            ok = await client.post("/classify", json={"inputs": ["good movie", "bad film"]})
            assert ok.status_code == 200, ok.text
            ok = await client.post("/embed", json={"inputs": ["hello world"]})
            assert ok.status_code == 200, ok.text
            bad = await client.post("/embed", json={"inputs": []})
            assert bad.status_code >= 400
            metrics = await client.get("/metrics")
            assert metrics.status_code == 200
            return metrics.text


def test_dashboard_metrics_are_exported(triton_server: TritonServer, python_repository: Path) -> None:
    gateway = sample_names(asyncio.run(gateway_exposition_after_traffic(triton_server.grpc_url, python_repository)))
    with urllib.request.urlopen(triton_server.metrics_url, timeout=10) as response:
        triton = sample_names(response.read().decode())

    wanted = dashboard_metrics()
    assert GPU_ONLY_METRICS <= wanted, "the dashboard lost its GPU panels"
    assert any(m.startswith("gateway_") for m in wanted) and any(m.startswith("nv_inference_") for m in wanted)
    missing = wanted - gateway - triton
    assert missing == GPU_ONLY_METRICS, f"queried but not exported: {sorted(missing - GPU_ONLY_METRICS)}"
    # The CPU server really has none of them (so the list above is the truth, not a shortcut).
    assert not {m for m in triton if m.startswith("nv_gpu_")}
