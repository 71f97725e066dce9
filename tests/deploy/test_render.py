"""The Kubernetes form of the stack (deploy/kubernetes), as `kubectl kustomize` renders every
overlay: the pod shape, the same promises as the compose files (images, Triton's command, the
builder's environment, GATEWAY_* settings that exist and are documented, the dashboard byte for
byte), exposure, scaling objects, the repository options and the values of each overlay."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from builder.spec import load_spec
from gateway.settings import MAX_AUTO_WORKERS, GatewaySettings
from tests.deploy.manifests import (
    ADAPTER,
    DASHBOARD,
    DEPLOY,
    NAMESPACE,
    OVERLAYS,
    REPO_ROOT,
    SERVER_LABELS,
    Obj,
    compose_default,
    compose_service,
    container,
    container_env,
    env_example,
    expand,
    find,
    matches,
    overlay,
    pod_spec,
    quantity_bytes,
    render,
    values,
)

REPOSITORY_OVERLAYS = {"pvc": "pvc", "s3": "s3", "example": "pvc"}  # overlay -> model repository option
TRITON_PORTS = {"triton-http": 8000, "triton-grpc": 8001, "triton-metrics": 8002}
TRITON_EXIT_TIMEOUT_S = 30  # tritonserver's default --exit-timeout-secs


def test_every_variant_is_covered() -> None:
    assert set(OVERLAYS) == set(REPOSITORY_OVERLAYS), "a new overlay needs its line in REPOSITORY_OVERLAYS"
    components = {p.parent.name for p in (DEPLOY / "components").glob("*/kustomization.yaml")}
    used = {c.split("/")[-1] for name in OVERLAYS
            for c in yaml.safe_load((DEPLOY / "overlays" / name / "kustomization.yaml").read_text()).get("components", [])}
    assert components == used, f"components no overlay renders: {sorted(components - used)}"


@pytest.mark.parametrize("name", OVERLAYS)
def test_overlay_renders_the_whole_stack(name: str) -> None:
    objects = overlay(name)
    kinds = {(o["kind"], re.sub(r"-[a-z0-9]{10}$", "", o["metadata"]["name"]) if o["kind"] == "ConfigMap" else o["metadata"]["name"])
             for o in objects}
    assert {
        ("Deployment", "bert-triton"), ("Service", "bert-triton-gateway"), ("Service", "bert-triton-metrics"),
        ("HorizontalPodAutoscaler", "bert-triton"), ("PodDisruptionBudget", "bert-triton"),
        ("NetworkPolicy", "bert-triton"), ("ServiceMonitor", "bert-triton"), ("ConfigMap", "bert-triton-dashboard"),
        ("ConfigMap", "bert-triton-gateway"), ("Job", "bert-triton-builder"),
    } <= kinds
    assert not [o for o in objects if o["kind"] == "Values"], "the values object must stay local config"
    for obj in objects:
        assert obj["metadata"]["namespace"] == NAMESPACE, obj["metadata"]["name"]
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "bert-triton"
    assert ("PersistentVolumeClaim", "bert-triton-model-repository") in kinds or REPOSITORY_OVERLAYS[name] == "s3"


@pytest.mark.parametrize("name", OVERLAYS)
def test_one_gpu_pod_of_triton_and_the_gateway_sidecar(name: str) -> None:
    objects = overlay(name)
    deployment = find(objects, "Deployment", "bert-triton")
    spec = pod_spec(objects)
    assert [c["name"] for c in spec["containers"]] == ["triton", "gateway"]
    assert "replicas" not in deployment["spec"], "the HPA owns the replica count"
    assert matches(deployment["spec"]["selector"]["matchLabels"], deployment["spec"]["template"]["metadata"]["labels"])
    triton, gateway = container(spec, "triton"), container(spec, "gateway")

    # /dev/shm: one emptyDir in memory, mounted in both, sized by the overlay's values.
    (dshm,) = [v for v in spec["volumes"] if v["name"] == "dshm"]
    assert dshm["emptyDir"]["medium"] == "Memory"
    assert dshm["emptyDir"]["sizeLimit"] == values(name)["shmSize"]
    for ctr in (triton, gateway):
        assert {m["mountPath"]: m["name"] for m in ctr["volumeMounts"]}["/dev/shm"] == "dshm"

    # One GPU, for Triton only; requests and limits everywhere.
    assert triton["resources"]["requests"]["nvidia.com/gpu"] == triton["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "nvidia.com/gpu" not in gateway["resources"]["limits"]
    for ctr in spec["containers"] + spec.get("initContainers", []):
        for key in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(ctr["resources"][key]), f"{ctr['name']}: {key}"
    assert spec["nodeSelector"]["nvidia.com/gpu.product"] == values(name)["gpuProduct"]

    # Probes: readiness = the gateway's /readyz; liveness = /healthz and Triton's /v2/health/live.
    ports = {p["name"]: p["containerPort"] for c in (triton, gateway) for p in c["ports"]}
    assert ports == {**TRITON_PORTS, "http": 8080}
    assert gateway["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert gateway["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert triton["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "triton-http"}
    assert triton["startupProbe"]["httpGet"] == triton["livenessProbe"]["httpGet"]
    start_period = compose_default(compose_service("triton")["healthcheck"]["start_period"])
    assert triton["startupProbe"]["periodSeconds"] * triton["startupProbe"]["failureThreshold"] >= int(start_period.rstrip("s"))
    assert "readinessProbe" not in triton  # one readiness: the gateway's (which checks Triton's)


@pytest.mark.parametrize("name", OVERLAYS)
def test_pod_runs_non_root_without_capabilities_on_a_read_only_root(name: str) -> None:
    objects = overlay(name)
    spec = pod_spec(objects)
    security = spec["securityContext"]
    # One uid for both: the gateway's regions are mode 0600 and Triton opens them.
    assert security["runAsNonRoot"] is True and security["runAsUser"] == 10001
    assert security["seccompProfile"]["type"] == "RuntimeDefault"
    assert spec["automountServiceAccountToken"] is False
    job = pod_spec(objects, "Job", "bert-triton-builder")
    assert job["securityContext"] == security
    for pod in (spec, job):
        for ctr in pod["containers"] + pod.get("initContainers", []):
            ctx = ctr["securityContext"]
            assert ctx["allowPrivilegeEscalation"] is False, ctr["name"]
            assert ctx["capabilities"]["drop"] == ["ALL"], ctr["name"]
            assert ctx["readOnlyRootFilesystem"] is True, ctr["name"]
            assert "runAsUser" not in ctx and "privileged" not in ctx, ctr["name"]
            # A read-only root: every container writes only to volumes (/tmp, /dev/shm, the repository).
            assert "/tmp" in {m["mountPath"] for m in ctr["volumeMounts"]} or ctr["name"] == "wait-for-repository"


@pytest.mark.parametrize("name", OVERLAYS)
def test_graceful_termination_lets_the_gateway_drain(name: str) -> None:
    spec = pod_spec(overlay(name))
    triton, gateway = container(spec, "triton"), container(spec, "gateway")
    gateway_stop = gateway["lifecycle"]["preStop"]["sleep"]["seconds"]
    triton_stop = triton["lifecycle"]["preStop"]["sleep"]["seconds"]
    main = (REPO_ROOT / "gateway" / "__main__.py").read_text()
    graceful = int(re.search(r"timeout_graceful_shutdown=(\d+)", main).group(1))  # type: ignore[union-attr]
    assert gateway_stop > 0
    assert triton_stop >= gateway_stop + graceful, "Triton must serve until the gateway has drained"
    assert spec["terminationGracePeriodSeconds"] >= triton_stop + TRITON_EXIT_TIMEOUT_S


@pytest.mark.parametrize("name", OVERLAYS)
def test_images_carry_the_compose_release_pins(name: str) -> None:
    objects = overlay(name)
    documented = env_example()
    pins = {"triton": documented["TRITON_IMAGE"], "gateway": documented["GATEWAY_IMAGE"], "builder": documented["BUILDER_IMAGE"]}
    assert pins == {s: compose_default(compose_service(s)["image"]) for s in pins}
    images = {c["name"]: c["image"] for o in objects if o["kind"] in ("Deployment", "Job")
              for c in o["spec"]["template"]["spec"]["containers"] + o["spec"]["template"]["spec"].get("initContainers", [])
              if c["image"].rsplit(":", 1)[0].endswith(tuple(f"bert-triton/{s}" for s in pins))}
    assert {"triton", "gateway", "builder"} <= set(images)
    for ctr, image in images.items():
        service = image.rsplit(":", 1)[0].rsplit("/", 1)[1]
        if name == "example":  # pushed to a registry: the same release tags for the NGC-based images
            assert image.startswith("registry.example.com/bert-triton/")
            if service != "gateway":
                assert image.rsplit(":", 1)[1] == pins[service].rsplit(":", 1)[1]
        else:
            assert image == pins[service], ctr


@pytest.mark.parametrize("name", OVERLAYS)
def test_triton_runs_composes_command_in_explicit_mode(name: str) -> None:
    objects = overlay(name)
    triton = container(pod_spec(objects), "triton")
    env = container_env(triton, objects, secrets={"bert-triton-s3": {}})
    assert "command" not in triton, "args only: the image's entrypoint stays, as with compose's `command:`"
    args = [expand(a, env) for a in triton["args"]]
    command = compose_service("triton")["command"]
    # compose runs triton-gpu-check first (sh -c '... && exec triton-mps tritonserver "$@"' tritonserver ARGS); a pod
    # has one GPU. Both start tritonserver through triton-mps, with TRITON_MPS auto by default.
    assert command[2].endswith('exec triton-mps tritonserver "$$@"') and args[0] == "triton-mps"
    assert env["TRITON_MPS"] == compose_default(compose_service("triton")["environment"]["TRITON_MPS"]) == "auto"
    args = args[1:]
    compose = [compose_default(a) for a in command[command.index("tritonserver"):]]

    def control(argv: list[str]) -> list[str]:
        return [a for a in argv if a.startswith(("--model-control-mode=", "--load-model="))]

    def rest(argv: list[str]) -> list[str]:
        return [a for a in argv if a not in control(argv) and not a.startswith("--model-repository=")]

    assert control(args) == ["--model-control-mode=explicit", "--load-model=*"]
    assert rest(args) == rest(compose)
    (repository,) = [a.split("=", 1)[1] for a in args if a.startswith("--model-repository=")]
    if REPOSITORY_OVERLAYS[name] == "s3":
        assert repository == values(name)["s3Repository"] and repository.startswith("s3://")
        assert triton["envFrom"] == [{"secretRef": {"name": "bert-triton-s3"}}]
    else:
        assert [a for a in compose if a.startswith("--model-repository=")] == [f"--model-repository={repository}"]


@pytest.mark.parametrize("name", OVERLAYS)
def test_gateway_settings_are_real_and_documented(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every GATEWAY_* the gateway container gets (env, and its envFrom ConfigMaps) is a field of
    GatewaySettings and documented in .env.example; with them the settings load."""
    objects = overlay(name)
    spec = pod_spec(objects)
    gateway = container(spec, "gateway")
    keys = {"bert-triton-api-keys": {"GATEWAY_API_KEYS": "k1,k2", "GATEWAY_ADMIN_KEYS": "admin"}}
    env = container_env(gateway, objects, secrets=keys)
    used = {k for k in env if k.startswith("GATEWAY_")}
    fields = {f"GATEWAY_{n.upper()}" for n in GatewaySettings.model_fields}
    assert used <= fields, f"not gateway settings: {sorted(used - fields)}"
    assert used <= set(env_example()), f"not documented in .env.example: {sorted(used - set(env_example()))}"
    # The keys come from the Secret, optional (auth off without it, as compose's empty default).
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in gateway["env"] if "valueFrom" in e}
    assert refs == {k: {"name": "bert-triton-api-keys", "key": k, "optional": True} for k in ("GATEWAY_API_KEYS", "GATEWAY_ADMIN_KEYS")}
    assert "GATEWAY_API_KEYS" not in container_env(gateway, objects)

    for key in [k for k in os.environ if k.startswith("GATEWAY_")]:
        monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = GatewaySettings()
    assert settings.api_keys == ["k1", "k2"] and settings.admin_keys == ["admin"]
    triton = container(spec, "triton")
    # Triton in the same pod, over shared memory, the repository as mounted in the gateway.
    assert settings.triton_url == f"127.0.0.1:{TRITON_PORTS['triton-grpc']}"
    assert settings.port == 8080 and settings.shm == "system"
    mounts = {m["mountPath"]: m for m in gateway["volumeMounts"]}
    assert mounts["/model_repository"]["readOnly"] is True
    assert settings.repository == "/model_repository/models"
    if REPOSITORY_OVERLAYS[name] == "pvc":
        triton_env = container_env(triton, objects)
        assert settings.repository == triton_env["MODEL_REPOSITORY"]  # Triton's repository, the same files
    assert str(settings.workers) == find(objects, "ConfigMap", "bert-triton-gateway")["data"]["GATEWAY_WORKERS"]


def gateway_workers(objects: list[dict[str, Any]], value: str) -> int:
    """The gateway's worker count in the pod: GATEWAY_WORKERS, or for `auto` its container's CPU limit (the
    gateway's own quota, gateway/settings.py auto_workers), at most MAX_AUTO_WORKERS."""
    if value != "auto":
        return int(value)
    limit = container(pod_spec(objects), "gateway")["resources"]["limits"]["cpu"]
    cpus = int(limit[:-1]) / 1000 if str(limit).endswith("m") else float(limit)
    return max(1, min(MAX_AUTO_WORKERS, int(cpus)))


def region_bytes(max_batch: int, max_seq_len: int, width: int, bytes_per_token: int) -> int:
    """One gateway region of a model step (docs/deployment.md, Shared memory size)."""
    return max_batch * (4 + max_seq_len * bytes_per_token) + max_batch * (width + 1) * 4


@pytest.mark.parametrize("name", OVERLAYS)
def test_shm_size_holds_the_gateway_regions(name: str) -> None:
    """/dev/shm is sized from the shared-memory settings: GATEWAY_SHM_POOL_SIZE regions per model and
    worker for the default models (kcbert: 300 tokens, 3 labels; m3e-base: 512 tokens, 768-d; max
    batch 64), plus Docker's default 64 MiB for the python backend's own tensors."""
    objects = overlay(name)
    settings = find(objects, "ConfigMap", "bert-triton-gateway")["data"]
    per_token, pool = (int(settings[k]) for k in ("GATEWAY_SHM_BYTES_PER_TOKEN", "GATEWAY_SHM_POOL_SIZE"))
    workers = gateway_workers(objects, settings["GATEWAY_WORKERS"])
    models = region_bytes(64, 300, 3, per_token) + region_bytes(64, 512, 768, per_token)
    needed = models * pool * workers + 64 * 2**20
    (dshm,) = [v for v in pod_spec(objects)["volumes"] if v["name"] == "dshm"]
    assert quantity_bytes(dshm["emptyDir"]["sizeLimit"]) >= needed


def test_kustomize_copies_are_the_repositorys_files() -> None:
    """The base generates the dashboard and models ConfigMaps from copies inside its root (so that no
    render needs --load-restrictor): each is the repository's file byte for byte."""
    copies = {DASHBOARD: DEPLOY / "base" / "files" / DASHBOARD.name, REPO_ROOT / "models.yaml": DEPLOY / "base" / "files" / "models.yaml"}
    stale = [str(copy.relative_to(REPO_ROOT)) for source, copy in copies.items() if copy.read_bytes() != source.read_bytes()]
    assert not stale, f"{stale} differ from the repository's files: run scripts/sync-kubernetes"
    check = subprocess.run([str(REPO_ROOT / "scripts" / "sync-kubernetes"), "--check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


@pytest.mark.parametrize("name", OVERLAYS)
def test_dashboard_configmap_is_the_monitoring_file(name: str) -> None:
    dashboard = find(overlay(name), "ConfigMap", "bert-triton-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"  # Grafana's dashboard sidecar
    assert list(dashboard["data"]) == [DASHBOARD.name]
    assert dashboard["data"][DASHBOARD.name].encode() == DASHBOARD.read_bytes()


@pytest.mark.parametrize("name", OVERLAYS)
def test_only_the_gateway_is_exposed(name: str) -> None:
    objects = overlay(name)
    template_labels = find(objects, "Deployment", "bert-triton")["spec"]["template"]["metadata"]["labels"]
    services = {o["metadata"]["name"]: o["spec"] for o in objects if o["kind"] == "Service"}
    gateway = services.pop("bert-triton-gateway")
    assert gateway["ports"] == [{"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}]
    metrics = services.pop("bert-triton-metrics")
    assert metrics["clusterIP"] == "None"  # headless: the ServiceMonitor's endpoints, nothing to call
    assert {p["targetPort"] for p in metrics["ports"]} == {"http", "triton-metrics"}
    triton = services.pop("bert-triton-triton", None)
    assert (triton is not None) == (name == "example")  # only with the triton-ports component
    assert not services
    for spec in (gateway, metrics, triton or gateway):
        assert spec["selector"] == SERVER_LABELS and matches(spec["selector"], template_labels)

    policy = find(objects, "NetworkPolicy", "bert-triton")["spec"]
    assert policy["podSelector"]["matchLabels"] == SERVER_LABELS and policy["policyTypes"] == ["Ingress"]
    open_ports = {p["port"]: rule.get("from") for rule in policy["ingress"] for p in rule["ports"]}
    monitoring = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": values(name)["monitoringNamespace"]}}}]
    assert open_ports == {8080: None, 8002: monitoring}
    extra = [o["spec"] for o in objects if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == "bert-triton-triton"]
    if name == "example":
        (rule,) = extra[0]["ingress"]
        assert {p["port"] for p in rule["ports"]} == {8000, 8001} and rule["from"] == [{"podSelector": {}}]
        ingress = find(objects, "Ingress", "bert-triton")["spec"]
        (path,) = ingress["rules"][0]["http"]["paths"]
        assert path["backend"]["service"] == {"name": "bert-triton-gateway", "port": {"name": "http"}}
        assert ingress["rules"][0]["host"] == ingress["tls"][0]["hosts"][0] == values(name)["ingressHost"]
    else:
        assert not extra and not [o for o in objects if o["kind"] == "Ingress"]
    builder_policy = find(objects, "NetworkPolicy", "bert-triton-builder")["spec"]
    job_labels = find(objects, "Job", "bert-triton-builder")["spec"]["template"]["metadata"]["labels"]
    assert matches(builder_policy["podSelector"]["matchLabels"], job_labels) and "ingress" not in builder_policy


@pytest.mark.parametrize("name", OVERLAYS)
def test_scaling_disruption_and_monitoring_objects(name: str) -> None:
    objects = overlay(name)
    template_labels = find(objects, "Deployment", "bert-triton")["spec"]["template"]["metadata"]["labels"]
    hpa = find(objects, "HorizontalPodAutoscaler", "bert-triton")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "bert-triton"}
    v = values(name)
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (v["minReplicas"], v["maxReplicas"])
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods" and metric["pods"]["target"] == {"type": "AverageValue", "averageValue": v["queueTimeTargetUs"]}
    pdb = find(objects, "PodDisruptionBudget", "bert-triton")["spec"]
    assert matches(pdb["selector"]["matchLabels"], template_labels) and pdb["maxUnavailable"] == 1

    monitor = find(objects, "ServiceMonitor", "bert-triton")["spec"]
    metrics_service = find(objects, "Service", "bert-triton-metrics")
    assert matches(monitor["selector"]["matchLabels"], metrics_service["metadata"]["labels"])
    assert {e["port"] for e in monitor["endpoints"]} == {p["name"] for p in metrics_service["spec"]["ports"]}
    assert all(e["path"] == "/metrics" for e in monitor["endpoints"])


@pytest.mark.parametrize("name", OVERLAYS)
def test_builder_job_builds_where_the_servers_run(name: str) -> None:
    objects = overlay(name)
    server, job = pod_spec(objects), pod_spec(objects, "Job", "bert-triton-builder")
    assert job["nodeSelector"] == server["nodeSelector"], "TensorRT engines are tied to the GPU product"
    assert job["restartPolicy"] == "Never"
    builder = container(job, "builder")
    assert builder["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert builder["args"] == ["build", "--spec", "/spec/models.yaml", "--repository", "/model_repository/models"]
    env = container_env(builder, objects)
    assert next(e for e in builder["env"] if e["name"] == "HF_TOKEN")["valueFrom"]["secretKeyRef"]["optional"] is True

    # compose's builder environment with .env.example's defaults (HF_TOKEN aside), overlay edits on top.
    compose_env = {k: compose_default(str(v)) for k, v in compose_service("builder")["environment"].items() if k != "HF_TOKEN"}
    edits = {"E5_ENABLED": "true"} if name == "example" else {}
    assert {k: v for k, v in env.items() if k in compose_env or k in edits} == {**compose_env, **edits}
    spec_volume = next(v for v in job["volumes"] if v["name"] == "spec")["configMap"]["name"]
    spec_text = next(o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == spec_volume)["data"]["models.yaml"]
    if name != "example":
        assert spec_text == (REPO_ROOT / "models.yaml").read_text(), "the models spec is the repository's models.yaml"

    mounts = {m["mountPath"]: m["name"] for m in builder["volumeMounts"]}
    if REPOSITORY_OVERLAYS[name] == "pvc":
        claim = next(v for v in job["volumes"] if v["name"] == mounts["/model_repository"])["persistentVolumeClaim"]
        served = next(v for v in server["volumes"] if v["name"] == "model-repository")["persistentVolumeClaim"]
        assert claim["claimName"] == served["claimName"] and served["readOnly"] is True and not claim.get("readOnly")
        pvc = find(objects, "PersistentVolumeClaim", claim["claimName"])
        assert pvc["spec"]["resources"]["requests"]["storage"] == values(name)["storageSize"]
        assert "ReadWriteMany" in pvc["spec"]["accessModes"]
        assert mounts["/cache"] == mounts["/model_repository"]  # compose's hf_cache/trt_cache, on the claim
        assert container(server, "wait-for-repository")
    else:
        url = values(name)["s3Repository"]
        assert [c["name"] for c in job["initContainers"]] == ["pull", "builder"]
        assert [c["name"] for c in job["containers"]] == ["publish"]
        for step in ("pull", "publish"):
            ctr = container(job, step)
            argv = [expand(a, container_env(ctr, objects, secrets={"bert-triton-s3": {}})) for a in ctr["args"]]
            assert argv[:2] == ["s3", "sync"] and url in argv and "/model_repository/models" in argv
        sync = container(server, "tokenizer-sync")  # a native sidecar that gates the servers' start
        assert sync["restartPolicy"] == "Always" and "startupProbe" in sync
        assert container_env(sync, objects, secrets={"bert-triton-s3": {}})["S3_REPOSITORY"] == url
        repository = next(v for v in server["volumes"] if v["name"] == "model-repository")
        assert set(repository) == {"name", "emptyDir"}
        assert not [c for c in server.get("initContainers", []) if c["name"] == "wait-for-repository"]


@pytest.mark.parametrize("name", OVERLAYS)
def test_models_spec_loads_with_the_builder(name: str, tmp_path: Path) -> None:
    """The builder's own spec loader, with the environment the Job gives it."""
    objects = overlay(name)
    builder = container(pod_spec(objects, "Job", "bert-triton-builder"), "builder")
    spec_text = find(objects, "ConfigMap", "bert-triton-models")["data"]["models.yaml"]
    env = container_env(builder, objects)
    path = tmp_path / "models.yaml"
    path.write_text(spec_text)
    specs = load_spec(path, env)
    assert specs and all(s.device == "gpu" and s.formats == ["onnx", "trt"] for s in specs)
    assert all(s.trt_timing_cache and s.trt_timing_cache.startswith("/cache/") for s in specs)
    if name == "example":
        assert {s.name for s in specs} == {"m3e", "e5"}


@pytest.mark.parametrize("name", [o for o in OVERLAYS if REPOSITORY_OVERLAYS[o] == "pvc"])
def test_builder_part_applies_alone(name: str) -> None:
    """`kubectl apply -l app.kubernetes.io/component=model-repository` (docs/kubernetes.md, step 1)
    applies everything the Job needs: the claim, its ServiceAccount and ConfigMaps."""
    objects = overlay(name)
    part = {(o["kind"], o["metadata"]["name"]) for o in objects
            if o["metadata"]["labels"].get("app.kubernetes.io/component") == "model-repository"}
    job = pod_spec(objects, "Job", "bert-triton-builder")
    wanted = {("ServiceAccount", job["serviceAccountName"]), ("Job", "bert-triton-builder")}
    for volume in job["volumes"]:
        if "persistentVolumeClaim" in volume:
            wanted.add(("PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"]))
        if "configMap" in volume:
            wanted.add(("ConfigMap", volume["configMap"]["name"]))
    for ctr in job["containers"]:
        wanted |= {("ConfigMap", s["configMapRef"]["name"]) for s in ctr.get("envFrom", []) if "configMapRef" in s}
    assert wanted <= part, f"missing from the builder part: {sorted(wanted - part)}"
    assert not {k for k, _ in part} & {"Deployment", "Service", "HorizontalPodAutoscaler"}


def test_adapter_configmap_is_the_rule_file() -> None:
    objects = render(ADAPTER)
    (config,) = objects
    assert config["kind"] == "ConfigMap" and config["metadata"]["name"] == "bert-triton-adapter-rules"
    assert config["data"]["config.yaml"].encode() == (ADAPTER / "config.yaml").read_bytes()
    helm: dict[str, Any] = yaml.safe_load((ADAPTER / "helm-values.yaml").read_text())
    assert helm["rules"]["existing"] == config["metadata"]["name"]


def _values_fields() -> dict[str, set[str]]:
    fields: dict[str, set[str]] = {}
    for path in DEPLOY.rglob("kustomization.yaml"):
        for replacement in yaml.safe_load(path.read_text()).get("replacements", []):
            fields.setdefault(replacement["source"]["fieldPath"].removeprefix("spec."), set()).add(path.parent.name)
    return fields


@pytest.mark.parametrize("name", OVERLAYS)
def test_values_files_set_exactly_the_values_their_components_read(name: str) -> None:
    kustomization: Obj = yaml.safe_load((DEPLOY / "overlays" / name / "kustomization.yaml").read_text())
    components = {c.split("/")[-1] for c in kustomization["components"]}
    read = {field for field, users in _values_fields().items() if users & components}
    assert set(values(name)) == read


@pytest.mark.parametrize("name", OVERLAYS)
def test_triton_can_write_the_onnx_tensorrt_engine_cache(name: str) -> None:
    """Models built with `onnx_accelerator: tensorrt` have Triton write the TensorRT provider's engines into
    the builder's default onnx_trt_cache: compose mounts its ort_trt_cache volume there, the pod a writable
    emptyDir (kept across container restarts, not pod moves; the root filesystem is read-only)."""
    from builder.settings import DEFAULT_ONNX_TRT_CACHE

    assert f"ort_trt_cache:{DEFAULT_ONNX_TRT_CACHE}" in compose_service("triton")["volumes"]
    spec = pod_spec(overlay(name))
    mount = {m["mountPath"]: m for m in container(spec, "triton")["volumeMounts"]}[DEFAULT_ONNX_TRT_CACHE]
    assert not mount.get("readOnly")
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    assert set(volume) == {"name", "emptyDir"}
