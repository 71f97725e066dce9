"""Static checks of the stack files with the real tools: Compose v2 `config` (GPU stack, CPU
variant, all-local variant), hadolint on every Dockerfile, promtool on the Prometheus config and
on every dashboard query, and .env.example against the variables the Compose files use."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.stack.tools import (
    COMPOSE_FILES,
    REPO_ROOT,
    clean_environment,
    compose_command,
    ensure_tools,
    hadolint_binary,
    promtool_binary,
)

ENV_EXAMPLE = REPO_ROOT / ".env.example"
DASHBOARD = REPO_ROOT / "monitoring" / "grafana" / "dashboards" / "bert-serving.json"
PROMETHEUS_CONFIG = REPO_ROOT / "monitoring" / "prometheus" / "prometheus.yml"
DOCKERFILES = sorted((REPO_ROOT / "docker").glob("*/Dockerfile*"))
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}")


@pytest.fixture(scope="module", autouse=True)
def tools() -> None:
    ensure_tools()


def env_example() -> dict[str, str]:
    """KEY=value lines of .env.example (comments and commented-out lines skipped)."""
    values: dict[str, str] = {}
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            values[key.strip()] = value.strip()
    return values


def compose_config(variant: str, env_file: Path) -> dict[str, Any]:
    """The model Compose resolves for a variant (raises with Compose's message when invalid)."""
    out = subprocess.run(
        compose_command(variant, "config", "--format", "json", env_file=env_file),
        capture_output=True,
        text=True,
        env=clean_environment(),
        cwd=REPO_ROOT,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def gpu_devices(service: dict[str, Any]) -> list[dict[str, Any]]:
    return service.get("deploy", {}).get("resources", {}).get("reservations", {}).get("devices", [])


@pytest.mark.parametrize("env_file", [ENV_EXAMPLE, Path("/dev/null")], ids=["env-example", "no-env"])
def test_gpu_stack_config(env_file: Path) -> None:
    services = compose_config("gpu", env_file)["services"]
    assert set(services) == {"builder", "triton", "gateway", "prometheus", "grafana"}
    for name in ("builder", "triton"):
        (device,) = gpu_devices(services[name])
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
    # the builder builds on one GPU; Triton takes every GPU of the host (Docker's count -1 = all)
    assert gpu_devices(services["builder"])[0]["device_ids"] == ["0"]
    assert gpu_devices(services["triton"])[0]["count"] == -1 and "device_ids" not in gpu_devices(services["triton"])[0]
    pinned = compose_config("gpu-ids", env_file)["services"]["triton"]
    assert gpu_devices(pinned) == [{"driver": "nvidia", "device_ids": ["0"], "capabilities": ["gpu"]}]
    assert services["builder"]["build"]["args"]["BASE_IMAGE"] == "nvcr.io/nvidia/tensorrt:24.12-py3"
    # Same NGC release for the engine builder and the server that loads the engines.
    assert services["triton"]["build"]["args"]["BASE_IMAGE"] == "nvcr.io/nvidia/tritonserver:24.12-py3"
    assert services["triton"]["depends_on"]["builder"]["condition"] == "service_completed_successfully"
    assert services["gateway"]["depends_on"]["triton"]["condition"] == "service_healthy"
    assert services["triton"]["ipc"] == "shareable" and services["gateway"]["ipc"] == "service:triton"
    # live: endpoints open once the start-up loads are done; ready turns false during any admin (un)load
    assert "/v2/health/live" in (REPO_ROOT / "docker/triton/healthcheck.py").read_text()
    command = services["triton"]["command"]
    assert "--model-control-mode=explicit" in command and "--load-model=*" in command
    assert "/readyz" in (REPO_ROOT / "docker/gateway/healthcheck.py").read_text()
    assert services["triton"]["shm_size"] and services["gateway"]["healthcheck"]["test"]
    # the host folder ./model_repository: the builder writes it, Triton and the gateway (tokenizer.json
    # for the scheduler pipeline) read it
    repository = str(REPO_ROOT / "model_repository")
    for name, read_only in (("builder", False), ("triton", True), ("gateway", True)):
        mount = {v["target"]: v for v in services[name]["volumes"]}["/model_repository"]
        assert (mount["type"], mount["source"], bool(mount.get("read_only"))) == ("bind", repository, read_only), name
    assert (REPO_ROOT / "model_repository" / "README.md").is_file()
    assert services["gateway"]["environment"]["GATEWAY_REPOSITORY"] == "/model_repository/models"
    assert "--model-repository=/model_repository/models" in services["triton"]["command"]
    assert {v["target"] for v in services["builder"]["volumes"]} >= {"/model_repository", "/cache/huggingface", "/cache/tensorrt"}
    builder_cmd = (REPO_ROOT / "docker/builder/Dockerfile").read_text()
    assert '"--repository", "/model_repository/models"' in builder_cmd
    for service in services.values():
        for port in service.get("ports", []):
            assert port["host_ip"] == "127.0.0.1", f"{port} is not published on 127.0.0.1 only"
    assert services["builder"]["environment"]["MODEL_FORMATS"] == "onnx,trt"


@pytest.mark.parametrize("variant", ["cpu", "local"])
def test_cpu_variants_config(variant: str) -> None:
    services = compose_config(variant, ENV_EXAMPLE)["services"]
    for name, service in services.items():
        assert not gpu_devices(service), f"{variant}: {name} still reserves a GPU"
    env = services["builder"]["environment"]
    assert env["MODEL_DEVICE"] == "cpu" and env["MODEL_FORMATS"] == "onnx"
    assert "--allow-gpu-metrics=false" in services["triton"]["command"]
    if variant == "local":
        assert env["MODEL_RUNTIME"] == "python"  # the wheel's tritonserver has only the python backend
        assert services["triton"]["build"]["dockerfile"] == "docker/triton/Dockerfile.pytriton"
        for name in ("builder", "triton", "gateway", "prometheus"):
            assert services[name]["build"]["args"]["BASE_IMAGE"] == "local/debian-python:bookworm"
        assert "grafana" not in services  # only with --profile grafana: no local Grafana image


def test_env_example_documents_every_compose_variable() -> None:
    documented = env_example()
    commented = {
        line.lstrip("#").split("=", 1)[0] for line in ENV_EXAMPLE.read_text().splitlines() if line.startswith("#") and "=" in line
    }
    for name in sorted({n for files in COMPOSE_FILES.values() for n in files}):
        for var, default in _VARIABLE.findall((REPO_ROOT / name).read_text()):
            assert var in documented, f"{name} uses ${{{var}}} but .env.example does not document it"
            if default:
                assert documented[var] == default, f"{var}: .env.example says {documented[var]!r}, {name} defaults to {default!r}"
    assert {"COMPOSE_FILE"} <= commented


def test_deployment_docs_state_the_env_examples_defaults() -> None:
    """docs/deployment.md's table of variables gives each one's default; it must be .env.example's (it once said
    GATEWAY_CPU_LIMIT=2 while .env.example and compose had 0)."""
    documented = env_example()
    checked = 0
    for row in (REPO_ROOT / "docs" / "deployment.md").read_text().splitlines():
        cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
        if not row.startswith("| `") or len(cells) < 3:
            continue
        names = re.findall(r"`([A-Z][A-Z0-9_]*)`", cells[0])
        defaults = re.findall(r"`([^`]*)`", cells[1])
        if len(names) != len(defaults):  # a row naming a family of variables (`LOCAL_*`, `OTEL_...`)
            continue
        for name, default in zip(names, defaults):
            if name in documented:
                assert documented[name] == default, f"docs/deployment.md: {name} defaults to {default!r}, " \
                    f".env.example to {documented[name]!r}"
                checked += 1
    assert checked >= 20


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: str(p.relative_to(REPO_ROOT)))
def test_hadolint(dockerfile: Path) -> None:
    out = subprocess.run([hadolint_binary(), "--no-color", str(dockerfile)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_dockerfile_takes_its_base_from_a_build_argument() -> None:
    assert len(DOCKERFILES) >= 5
    for dockerfile in DOCKERFILES:
        froms = [l.split()[1] for l in dockerfile.read_text().splitlines() if l.startswith("FROM ")]
        assert froms and all(f == "${BASE_IMAGE}" for f in froms), f"{dockerfile}: FROM {froms}"


def test_promtool_check_config() -> None:
    out = subprocess.run([promtool_binary(), "check", "config", str(PROMETHEUS_CONFIG)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    jobs = {j["job_name"]: j["static_configs"][0]["targets"] for j in yaml.safe_load(PROMETHEUS_CONFIG.read_text())["scrape_configs"]}
    assert jobs == {"gateway": ["gateway:8080"], "triton": ["triton:8002"]}


def dashboard_queries() -> list[str]:
    """Every PromQL expression of the provisioned dashboard."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for p in panels for t in p.get("targets", [])]


def test_dashboard_queries_are_valid_promql(tmp_path: Path) -> None:
    """promtool parses every query (as a recording rule), with Grafana's $__rate_interval filled in."""
    queries = dashboard_queries()
    assert len(queries) >= 20
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [{"record": f"dashboard:q{i}", "expr": q.replace("$__rate_interval", "1m")} for i, q in enumerate(queries)],
            }
        ]
    }
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rules))
    out = subprocess.run([promtool_binary(), "check", "rules", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_grafana_provisioning_matches_the_dashboard() -> None:
    provisioning = REPO_ROOT / "monitoring" / "grafana" / "provisioning"
    (datasource,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert datasource["url"] == "http://prometheus:9090"
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "dashboards.yml").read_text())["providers"]
    gpu = compose_config("gpu", ENV_EXAMPLE)["services"]["grafana"]
    mounts = {v["target"]: v["source"] for v in gpu["volumes"]}
    assert Path(mounts[provider["options"]["path"]]) == DASHBOARD.parent
    panels = json.loads(DASHBOARD.read_text())["panels"]
    for panel in panels:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == datasource["uid"], panel["title"]
    titles = " | ".join(p["title"] for p in panels).lower()
    for topic in ("request rate", "latency", "errors", "inputs per request", "queue", "compute", "batch size", "gpu utilisation", "gpu memory"):
        assert topic in titles, f"dashboard has no panel about {topic}"


def test_models_spec_resolves_for_gpu_and_cpu() -> None:
    """The default models.yaml through the builder's own spec loader, as the builder container sees it."""
    from builder.spec import load_spec

    spec = REPO_ROOT / "models.yaml"
    gpu = {s.name: s for s in load_spec(spec, {})}
    assert gpu["kcbert"].model == "beomi/kcbert-large" and gpu["kcbert"].task == "classify"
    assert gpu["kcbert"].labels == ["negative", "neutral", "positive"]
    assert gpu["m3e"].model == "moka-ai/m3e-base" and gpu["m3e"].task == "embed"
    assert all(s.device == "gpu" and s.formats == ["onnx", "trt"] for s in gpu.values())
    cpu = load_spec(spec, {"MODEL_DEVICE": "cpu", "MODEL_FORMATS": "onnx", "EMBED_MODEL": "/local/emb"})
    assert all(s.device == "cpu" and s.formats == ["onnx"] for s in cpu)
    assert cpu[1].model == "/local/emb"


def test_cuda_shm_override_gives_the_gateway_tritons_gpu_and_namespaces() -> None:
    services = compose_config("cuda-shm", ENV_EXAMPLE)["services"]
    gateway, triton = services["gateway"], services["triton"]
    assert gateway["environment"]["GATEWAY_SHM"] == "cuda"
    (device,) = gpu_devices(gateway)  # CUDA IPC works within one GPU: the one Triton has
    assert device == gpu_devices(triton)[0] and device["capabilities"] == ["gpu"]
    # IPC namespace for the handles, PID namespace so that exporter and importer PIDs differ
    assert gateway["ipc"] == "service:triton" and gateway["pid"] == "service:triton"
    plain = compose_config("gpu", ENV_EXAMPLE)["services"]["gateway"]
    assert plain["environment"]["GATEWAY_SHM"] == "system" and not gpu_devices(plain) and "pid" not in plain


def test_compose_headers_name_real_commands() -> None:
    """The commands the Compose files' header comments give exist, and take no flag they would refuse."""
    mentioned = 0
    for compose in sorted(REPO_ROOT.glob("compose*.yaml")):
        header = [line for line in compose.read_text().splitlines() if line.startswith("#")]
        for line in header:
            for script, flags in re.findall(r"(scripts/[\w-]+)((?: --?[\w-]+)*)", line):
                mentioned += 1
                assert (REPO_ROOT / script).is_file() and (REPO_ROOT / script).stat().st_mode & 0o111, (compose.name, script)
                assert not flags.strip(), f"{compose.name}: `{script}{flags}`: these scripts take no such flag"
    assert mentioned >= 2


def test_the_dashboards_gpu_panels_draw_each_gpu() -> None:
    """Triton's nv_gpu_* series carry gpu_uuid: a host of several GPUs shows one line per GPU, never a sum."""
    dashboard = json.loads((REPO_ROOT / "monitoring/grafana/dashboards/bert-serving.json").read_text())
    targets = [t for panel in dashboard["panels"] for t in panel.get("targets", []) if "nv_gpu_" in t.get("expr", "")]
    assert len(targets) >= 3
    for target in targets:
        assert not re.search(r"\b(sum|avg|max|min)\s*\(", target["expr"]), target["expr"]
        assert "{{gpu_uuid}}" in target["legendFormat"], target
