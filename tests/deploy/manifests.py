"""The Kubernetes manifests as a real engine renders them (`kubectl kustomize`), and what the
kubelet would make of a container: its environment (envFrom, env, `$(VAR)` expansion) and its
effective command (the pod's command/args over the image's ENTRYPOINT/CMD)."""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from devstack.tritonserver import REPO_ROOT

DEPLOY = REPO_ROOT / "deploy" / "kubernetes"
OVERLAYS = sorted(p.parent.name for p in (DEPLOY / "overlays").glob("*/kustomization.yaml"))
ADAPTER = DEPLOY / "prometheus-adapter"
ENV_EXAMPLE = REPO_ROOT / ".env.example"
COMPOSE = REPO_ROOT / "compose.yaml"
DASHBOARD = REPO_ROOT / "monitoring" / "grafana" / "dashboards" / "bert-serving.json"
NAMESPACE = "bert-triton"
SERVER_LABELS = {"app.kubernetes.io/name": "bert-triton", "app.kubernetes.io/component": "server"}
_COMPOSE_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}")
_KUBE_VARIABLE = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")

Obj = dict[str, Any]


def kubectl() -> str:
    """The kubectl binary (with Kustomize v5) of this machine."""
    path = shutil.which("kubectl")
    if path is None:
        pytest.fail("kubectl is not installed: the manifests are rendered by `kubectl kustomize` (Kustomize v5)")
    return path


@functools.cache
def render_text(directory: Path) -> str:
    """`kubectl kustomize DIR`, with no flag: what `kubectl apply -k DIR` and `kustomize build DIR` render
    (Kustomize's default load restrictor: no file outside a kustomization's root)."""
    out = subprocess.run(
        [kubectl(), "kustomize", str(directory)],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def render(directory: Path) -> list[Obj]:
    """The rendered objects of a kustomization (a fresh copy each call)."""
    return [d for d in yaml.safe_load_all(render_text(directory)) if d]


def overlay(name: str) -> list[Obj]:
    return render(DEPLOY / "overlays" / name)


def values(name: str) -> dict[str, Any]:
    """The `spec` of an overlay's Values object (values.yaml)."""
    return dict(yaml.safe_load((DEPLOY / "overlays" / name / "values.yaml").read_text())["spec"])


def find(objects: list[Obj], kind: str, name: str | None = None) -> Obj:
    """The one object of `kind` (and `name`, or a generated name starting with `name-`)."""
    hits = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    if not hits and name is not None:  # configMapGenerator adds a hash suffix
        hits = [o for o in objects if o["kind"] == kind and re.fullmatch(re.escape(name) + r"-[a-z0-9]{10}", o["metadata"]["name"])]
    assert len(hits) == 1, f"{len(hits)} {kind} objects named {name!r}"
    return hits[0]


def pod_spec(objects: list[Obj], kind: str = "Deployment", name: str = "bert-triton") -> Obj:
    return dict(find(objects, kind, name)["spec"]["template"]["spec"])


def container(spec: Obj, name: str) -> Obj:
    (hit,) = [c for c in spec.get("containers", []) + spec.get("initContainers", []) if c["name"] == name]
    return dict(hit)


def env_example() -> dict[str, str]:
    """KEY=value lines of .env.example."""
    pairs = (line.split("=", 1) for line in ENV_EXAMPLE.read_text().splitlines() if line and not line.startswith("#") and "=" in line)
    return {k.strip(): v.strip() for k, v in pairs}


def compose_default(value: str) -> str:
    """A compose.yaml value with every `${VAR:-default}` resolved from .env.example (as with no .env edits)."""
    documented = env_example()
    return _COMPOSE_VARIABLE.sub(lambda m: documented.get(m.group(1), m.group(2) or ""), value)


def compose_service(name: str) -> Obj:
    return dict(yaml.safe_load(COMPOSE.read_text())["services"][name])


def expand(value: str, env: Mapping[str, str]) -> str:
    """The kubelet's `$(VAR)` expansion (`$$` escapes; an unknown variable stays as written)."""
    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))
    return _KUBE_VARIABLE.sub(one, value)


def container_env(ctr: Obj, objects: list[Obj], secrets: Mapping[str, Mapping[str, str]] | None = None) -> dict[str, str]:
    """The environment the kubelet gives a container: envFrom first, then env in order (each value
    expanded against the variables before it); `secrets` stands in for Secrets the user creates.
    A missing optional reference is skipped, a missing required one fails."""
    secrets = secrets or {}
    configmaps = {o["metadata"]["name"]: o.get("data", {}) for o in objects if o["kind"] == "ConfigMap"}
    env: dict[str, str] = {}
    for source in ctr.get("envFrom", []):
        ref, store = (source["configMapRef"], configmaps) if "configMapRef" in source else (source["secretRef"], secrets)
        if ref["name"] in store:
            env.update({source.get("prefix", "") + k: v for k, v in store[ref["name"]].items()})
        else:
            assert ref.get("optional"), f"{ctr['name']}: envFrom {ref['name']} does not exist"
    for item in ctr.get("env", []):
        if "value" in item:
            env[item["name"]] = expand(str(item["value"]), env)
            continue
        source = item["valueFrom"]
        ref, store = (source["secretKeyRef"], secrets) if "secretKeyRef" in source else (source["configMapKeyRef"], configmaps)
        if ref["key"] in store.get(ref["name"], {}):
            env[item["name"]] = store[ref["name"]][ref["key"]]
        else:
            assert ref.get("optional"), f"{ctr['name']}: {item['name']} refers to a missing {ref['name']}/{ref['key']}"
    return env


def dockerfile_command(dockerfile: Path) -> tuple[list[str], list[str]]:
    """(ENTRYPOINT, CMD) of a Dockerfile's last stage, exec form."""
    entrypoint: list[str] = []
    cmd: list[str] = []
    for line in dockerfile.read_text().splitlines():
        if line.startswith("FROM "):
            entrypoint, cmd = [], []
        elif line.startswith("ENTRYPOINT "):
            entrypoint = json.loads(line.split(" ", 1)[1])
        elif line.startswith("CMD "):
            cmd = json.loads(line.split(" ", 1)[1])
    return entrypoint, cmd


def effective_command(ctr: Obj, dockerfile: Path, env: Mapping[str, str]) -> list[str]:
    """What a container runs: `command` replaces the image's ENTRYPOINT and `args` its CMD (CMD
    is dropped when only `command` is set); `$(VAR)` expanded from the container's environment."""
    entrypoint, cmd = dockerfile_command(dockerfile)
    if "command" in ctr:
        argv = list(ctr["command"]) + list(ctr.get("args", []))
    else:
        argv = entrypoint + list(ctr.get("args", cmd))
    return [expand(str(a), env) for a in argv]


def quantity_bytes(quantity: str) -> int:
    """A Kubernetes memory quantity (binary or decimal suffix) in bytes."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([A-Za-z]*)", str(quantity))
    assert match, quantity
    return int(float(match.group(1)) * units.get(match.group(2), 1))


def matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())
