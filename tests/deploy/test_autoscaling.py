"""The HPA's metric is the one the shipped prometheus-adapter rule produces, from series a real
tritonserver exports, and the rule's query answers one value per pod.

The tritonserver is the session's (tests/conftest.py `triton_server`, the builder's tiny
`--runtime python` repository), as in tests/stack/test_dashboard_metrics.py, with real traffic
through the gateway. Its counters, labelled `namespace` and `pod` as the Prometheus Operator
labels every target of the ServiceMonitor, become promtool unit-test series; promtool (Prometheus'
own PromQL engine) then evaluates the rule's metricsQuery, expanded as prometheus-adapter expands
it for a Pods metric, and must give exactly the average queue time per request of each pod."""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
import urllib.request
from collections import defaultdict
from pathlib import Path
from typing import Any, Literal

import httpx
import yaml

from devstack.tritonserver import TritonServer
from gateway.app import create_app
from gateway.settings import GatewaySettings
from tests.deploy.manifests import ADAPTER, DEPLOY, NAMESPACE, OVERLAYS, find, render
from tests.stack.tools import ensure_tools, promtool_binary

RULES = ADAPTER / "config.yaml"
WINDOW_SAMPLES = 4  # 15 s apart in the promtool series: a [1m] window holds 4 increments
Series = tuple[str, tuple[tuple[str, str], ...]]  # name, sorted labels


def hpa_metric() -> str:
    names = set()
    for name in OVERLAYS:
        hpa = find(render(DEPLOY / "overlays" / name), "HorizontalPodAutoscaler", "bert-triton")
        (metric,) = hpa["spec"]["metrics"]
        assert metric["type"] == "Pods"
        names.add(metric["pods"]["metric"]["name"])
    (only,) = names
    return str(only)


def adapter_name(rule: dict[str, Any]) -> str:
    """The metric name prometheus-adapter derives from a rule: `name.matches` applied to the series
    name of `seriesQuery`, replaced by `name.as` (`$1`... groups; empty = the first group or all)."""
    series = re.match(r"[a-zA-Z_:][a-zA-Z0-9_:]*", rule["seriesQuery"]).group(0)  # type: ignore[union-attr]
    pattern = re.compile(rule["name"]["matches"])
    assert pattern.search(series), f"{rule['name']['matches']} does not match {series}"
    template = rule["name"].get("as") or ("$1" if pattern.groups else "$0")
    return pattern.sub(re.sub(r"\$\{?(\d+)\}?", r"\\g<\1>", template), series)


def the_rule() -> dict[str, Any]:
    rules = yaml.safe_load(RULES.read_text())["rules"]
    (rule,) = [r for r in rules if adapter_name(r) == hpa_metric()]
    return dict(rule)


def series_names(query: str) -> set[str]:
    """Metric names a PromQL query reads (names before `{`)."""
    return set(re.findall(r"\b([a-z_][a-z0-9_]*)\{", query))


def expand(query: str, series: str, namespace: str, pods: list[str]) -> str:
    """The adapter's templating for a namespaced Pods metric."""
    return (query.replace("<<.Series>>", series)
            .replace("<<.LabelMatchers>>", f'namespace="{namespace}",pod=~"{"|".join(pods)}"')
            .replace("<<.GroupBy>>", "pod"))


def test_hpa_metric_is_served_by_the_adapter_rule() -> None:
    rule = the_rule()
    assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}
    assert series_names(rule["metricsQuery"]) == {"nv_inference_queue_duration_us", "nv_inference_request_success"}
    assert series_names(rule["seriesQuery"]) == {"nv_inference_queue_duration_us"}
    assert "<<.LabelMatchers>>" in rule["metricsQuery"] and "<<.GroupBy>>" in rule["metricsQuery"]


_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def scrape(url: str) -> dict[Series, float]:
    """The samples of a Prometheus text exposition, by name and label set."""
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and not line.startswith("#"):
            labels = tuple(sorted(_LABEL.findall(match.group(2) or "")))
            samples[(match.group(1), labels)] = float(match.group(3))
    return samples


async def traffic(triton_url: str, triton_http_url: str, repository: Path, pipeline: Literal["scheduler", "ensemble"]) -> None:
    """Requests through the gateway: the scheduler pipeline calls the model steps, the ensemble
    pipeline the ensembles (whose figures are the sum of their steps')."""
    app = create_app(GatewaySettings(triton_url=triton_url, triton_http_url=triton_http_url, repository=str(repository),
                                     pipeline=pipeline))
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app), httpx.AsyncClient(transport=transport, base_url="http://gateway", timeout=60) as client:
            for i in range(4):
                ok = await client.post("/embed", json={"inputs": [f"text number {i}", "another one"]})
                assert ok.status_code == 200, ok.text
            ok = await client.post("/classify", json={"inputs": ["good movie", "bad film"]})
            assert ok.status_code == 200, ok.text


def test_rule_reads_real_triton_series_and_answers_per_pod(
    triton_server: TritonServer, python_repository: Path, tmp_path: Path
) -> None:
    rule = the_rule()
    wanted = series_names(rule["metricsQuery"])
    before = scrape(triton_server.metrics_url)
    pipelines: tuple[Literal["scheduler", "ensemble"], ...] = ("scheduler", "ensemble")
    for pipeline in pipelines:
        asyncio.run(traffic(triton_server.grpc_url, triton_server.http_address, python_repository, pipeline))
    deadline = time.monotonic() + 10
    while True:
        after = scrape(triton_server.metrics_url)
        grown = {k for k in after if k[0] == "nv_inference_request_success" and after[k] > before.get(k, 0)}
        if grown or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    exported = {name for name, _ in after}
    assert wanted <= exported, f"not exported by tritonserver: {sorted(wanted - exported)}"
    counters = {k: (before.get(k, 0.0), after[k] - before.get(k, 0.0)) for k in after if k[0] in wanted}
    served = {dict(labels)["model"] for (name, labels), (_, delta) in counters.items() if name == "nv_inference_request_success" and delta}
    assert {m.endswith("_ensemble") for m in served} == {True, False}, f"traffic reached {sorted(served)}"

    # Three pods: two of this namespace (b queues three times as long as a), one elsewhere.
    pods = {("pod-a", NAMESPACE): 1, ("pod-b", NAMESPACE): 3, ("pod-c", "elsewhere"): 5}
    input_series = []
    expected: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    samples: list[dict[str, Any]]
    for (pod, namespace), factor in pods.items():
        for (name, labels), (start, delta) in counters.items():
            step = delta * factor if name == "nv_inference_queue_duration_us" else delta
            selector = ",".join(f'{k}="{v}"' for k, v in (*labels, ("namespace", namespace), ("pod", pod)))
            input_series.append({"series": f"{name}{{{selector}}}", "values": f"{start:g}+{step:g}x20"})
            if namespace == NAMESPACE and not dict(labels)["model"].endswith("_ensemble"):
                expected[pod][name == "nv_inference_request_success"] += WINDOW_SAMPLES * step
    samples = [{"labels": f'{{pod="{pod}"}}', "value": q / (1 + s)} for pod, (q, s) in sorted(expected.items())]
    assert all(s["value"] > 0 for s in samples), samples  # real queue time was measured
    queue_series = sum(1 for name, _ in counters if name == "nv_inference_queue_duration_us")
    tests = {
        "rule_files": [],
        "evaluation_interval": "15s",
        "tests": [{
            "interval": "15s",
            "input_series": input_series,
            "promql_expr_test": [
                {"expr": expand(rule["metricsQuery"], "nv_inference_queue_duration_us", NAMESPACE, ["pod-a", "pod-b"]),
                 "eval_time": "5m", "exp_samples": samples},
                # The series the adapter discovers: every pod's, in any namespace.
                {"expr": f"count by (pod) ({rule['seriesQuery']})", "eval_time": "5m",
                 "exp_samples": [{"labels": f'{{pod="{p}"}}', "value": queue_series} for p, _ in sorted(pods)]},
            ],
        }],
    }
    path = tmp_path / "adapter-rule.test.yml"
    path.write_text(yaml.safe_dump(tests, sort_keys=False))
    ensure_tools()
    out = subprocess.run([promtool_binary(), "test", "rules", str(path)], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
