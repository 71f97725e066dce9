"""Every query of the Grafana dashboard, evaluated by a real Prometheus (Debian's `prometheus`, installed
by scripts/install-tools) that scrapes real gateways (`python -m gateway` processes) and a real
tritonserver (the builder's tiny `--runtime python` repository), as the Compose stack's Prometheus
does (monitoring/prometheus/prometheus.yml, its jobs and paths, with this machine's targets).

Traffic comes in two rounds, each scraped before the next, so that every counter the panels rate
has grown between two samples: /classify and /embed through the scheduler pipeline (the batching
panels), requests refused with a 4xx, and requests to a second gateway replica whose Triton is gone
(503: the 5xx panels). Then each panel must return data with a finite value, except the GPU panels:
the CPU tritonserver exports no nv_gpu_* metric (they come only from a Triton with a visible NVIDIA
GPU; check them there with `curl -s localhost:8002/metrics | grep ^nv_gpu_`, docs/deployment.md).
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from devstack.gateway import GatewayProcess
from devstack.tritonserver import TritonServer, free_port
from tests.fixtures.waiting import wait_until
from tests.stack.tools import REPO_ROOT

DASHBOARD = REPO_ROOT / "monitoring" / "grafana" / "dashboards" / "bert-serving.json"
PROMETHEUS_CONFIG = REPO_ROOT / "monitoring" / "prometheus" / "prometheus.yml"
# Panels that cannot have data on this machine, and why (each is checked to query only nv_gpu_* metrics).
GPU_PANELS = {
    "GPU utilisation": "nv_gpu_* comes only from a Triton that sees an NVIDIA GPU",
    "GPU memory": "nv_gpu_* comes only from a Triton that sees an NVIDIA GPU",
    "GPU power": "nv_gpu_* comes only from a Triton that sees an NVIDIA GPU",
}
RATE_WINDOW = "1m"  # for Grafana's $__rate_interval: wide enough to hold every sample of the test


@dataclass(frozen=True)
class Query:
    panel: str
    expr: str


def dashboard_queries() -> list[Query]:
    """Every target expression of every panel (rows have none), Grafana's interval variables filled in."""
    queries = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for variable in ("$__rate_interval", "$__interval", "$__range"):
                expr = expr.replace(variable, RATE_WINDOW)
            assert "$" not in expr, f"{panel['title']}: a dashboard variable this test does not fill: {expr}"
            queries.append(Query(panel["title"], expr))
    return queries


class Prometheus:
    """A real `prometheus` process scraping `targets` (job -> host:port list) every second."""

    def __init__(self, targets: dict[str, list[str]], workdir: Path) -> None:
        binary = shutil.which("prometheus")
        if binary is None:
            pytest.fail("prometheus is not installed (scripts/setup unpacks Debian's `prometheus` into .cache/bin)")
        config = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
        config["global"]["scrape_interval"] = config["global"]["evaluation_interval"] = "1s"
        jobs = {job["job_name"]: job for job in config["scrape_configs"]}
        assert set(jobs) == set(targets), f"the shipped config scrapes {sorted(jobs)}"
        for name, hosts in targets.items():
            jobs[name]["static_configs"][0]["targets"] = hosts
        (workdir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = workdir / "prometheus.log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [binary, f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'data'}",
                 f"--web.listen-address={self.url.removeprefix('http://')}"],
                stdout=log, stderr=subprocess.STDOUT)

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def ready(self) -> bool:
        assert self.process.poll() is None, self.log.read_text()[-3000:]
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def total(self, expr: str) -> float:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else 0.0

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


@pytest.fixture(scope="module")
def scraped(triton_server: TritonServer, python_repository: Path,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Prometheus]:
    """Prometheus after two scraped rounds of traffic (see the module's docstring)."""
    root = tmp_path_factory.mktemp("dashboard")
    triton_metrics = triton_server.metrics_url.removeprefix("http://").removesuffix("/metrics")
    # the scheduler pipeline (the gateway reads the repository's tokenizers): the batching panels
    gateway = GatewayProcess(triton_server.grpc_url, triton_http_url=triton_server.http_address, settings={"repository": str(python_repository),
                                                               "shm_prefix": "gwdash"}, log_path=root / "gateway.log")
    # a replica whose Triton is gone: its requests answer 503 (the 5xx panels)
    lost = GatewayProcess(f"127.0.0.1:{free_port()}", settings={"startup_timeout_s": "1", "shm_prefix": "gwdashlost"},
                          log_path=root / "lost.log")
    prometheus = Prometheus({"gateway": [f"127.0.0.1:{gateway.port}", f"127.0.0.1:{lost.port}"],
                             "triton": [triton_metrics]}, root)
    try:
        with ExitStack() as stack, ThreadPoolExecutor(2) as pool:
            list(pool.map(stack.enter_context, (gateway, lost)))  # both start at once, Prometheus meanwhile
            wait_until(prometheus.ready, "prometheus ready")
            wait_until(lambda: prometheus.total("count(up == 1)") == 3, "all three targets scraped and up")
            sent = 0
            with httpx.Client(timeout=60) as http:
                for _ in range(2):
                    for body in ({"model": "tinycls", "inputs": ["good movie", "bad film", "okay"]},
                                 {"model": "tinycls", "inputs": ["a much longer text about the food and the place"]}):
                        assert http.post(f"{gateway.url}/classify", json=body).status_code == 200
                    for texts in (["hello world"], ["the quick brown fox"] * 5):
                        assert http.post(f"{gateway.url}/embed", json={"model": "tinyemb", "inputs": texts}).status_code == 200
                    assert http.post(f"{gateway.url}/embed", json={"model": "tinyemb", "inputs": []}).status_code == 422
                    assert http.post(f"{gateway.url}/embed", json={"model": "nosuch", "inputs": ["x"]}).status_code == 404
                    assert http.post(f"{lost.url}/embed", json={"inputs": ["x"]}).status_code == 503
                    sent += 7
                    # this round is in Prometheus (the gateways count every request but /metrics and probes)
                    wait_until(lambda: prometheus.total("sum(gateway_requests_total)") == sent,
                               f"{sent} requests scraped", within_s=60)
            yield prometheus
    finally:
        prometheus.stop()


def has_data(result: list[dict[str, Any]]) -> bool:
    """At least one series with a finite value (a histogram_quantile over counters that never moved is NaN)."""
    return any(math.isfinite(float(series["value"][1])) for series in result)


@pytest.mark.slow  # a stack under load scraped by a real Prometheus: `scripts/test -m slow`
def test_every_dashboard_query_has_data_on_cpu(scraped: Prometheus) -> None:
    queries = dashboard_queries()
    assert len(queries) >= 40 and {q.panel for q in queries} >= set(GPU_PANELS)
    empty = {}
    for query in queries:
        result = scraped.query(query.expr)
        if not has_data(result):
            empty.setdefault(query.panel, []).append((query.expr, result))
    for panel, reason in GPU_PANELS.items():  # excused, and only for the reason given
        assert all(expr.startswith("nv_gpu_") for q in queries if q.panel == panel for expr in [q.expr]), panel
        assert panel in empty, f"{panel} has data on a CPU machine: {reason} is no longer true"
    missing = {panel: found for panel, found in empty.items() if panel not in GPU_PANELS}
    assert not missing, f"panels without data: {json.dumps(missing, indent=1)[:3000]}"


def test_the_cpu_triton_exports_no_gpu_metric(scraped: Prometheus) -> None:
    """The GPU panels' excuse is the truth: no nv_gpu_* series at all (not merely a renamed one)."""
    assert scraped.query('count({__name__=~"nv_gpu_.*"})') == []
    assert scraped.query('count({__name__=~"nv_inference_.*", job="triton"})') != []
