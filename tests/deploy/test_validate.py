"""Every rendered object against the Kubernetes schemas (kubernetes-validate, strict: unknown
fields fail) for the oldest supported release (1.30) and the newest the package ships; the
ServiceMonitor, a custom resource, against the Prometheus Operator's CRD schema vendored in
schemas/. Then the policy scanner checkov over everything: no failed check, and every skipped
check is one of the findings kept on purpose, each with its reason in the manifest."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import kubernetes_validate.utils
import pytest
import yaml

from tests.deploy.manifests import (
    ADAPTER,
    DEPLOY,
    OVERLAYS,
    REPO_ROOT,
    Obj,
    render,
    render_text,
)

VERSIONS = ["1.30", kubernetes_validate.utils.latest_version()]
SERVICE_MONITOR_CRD = Path(__file__).parent / "schemas" / "monitoring.coreos.com_servicemonitors.yaml"
CHECKOV_REQUIREMENTS = REPO_ROOT / "requirements" / "checkov.txt"
CHECKOV_VENV = REPO_ROOT / ".cache" / "checkov-venv"
# Findings kept on purpose: each manifest that skips one says why (checkov.io/skipN annotations).
KEPT_FINDINGS = {
    "CKV_K8S_9": "one readiness probe per pod, the gateway's /readyz (Triton's container has none)",
    "CKV_K8S_14": "bert-triton/gateway:latest is compose's own tag; overlays pin it with `images:`",
    "CKV_K8S_43": "images built from this checkout have a digest only once pushed",
    "CKV_K8S_35": "keys and credentials are read from environment variables only",
}

# kubernetes-validate reads and parses the schema files on every call; they never change.
kubernetes_validate.utils.schema_contents = functools.lru_cache(maxsize=None)(kubernetes_validate.utils.schema_contents)


def variants() -> dict[str, list[Obj]]:
    return {**{name: render(DEPLOY / "overlays" / name) for name in OVERLAYS}, "prometheus-adapter": render(ADAPTER)}


@functools.cache
def service_monitor_schema() -> dict[str, Any]:
    documents = [d for d in yaml.safe_load_all(SERVICE_MONITOR_CRD.read_text()) if d]
    (crd,) = documents
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return dict(version["schema"]["openAPIV3Schema"])


def unknown_fields(obj: Any, schema: dict[str, Any], path: str = "") -> list[str]:
    """Fields a structural CRD schema does not declare (the API server would prune them silently)."""
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    found: list[str] = []
    if isinstance(obj, dict) and "properties" in schema:
        for key, value in obj.items():
            if key not in schema["properties"]:
                found.append(f"{path}.{key}")
            else:
                found += unknown_fields(value, schema["properties"][key], f"{path}.{key}")
    elif isinstance(obj, list) and "items" in schema:
        for i, item in enumerate(obj):
            found += unknown_fields(item, schema["items"], f"{path}[{i}]")
    return found


def validate_custom_resource(obj: Obj) -> None:
    assert obj["apiVersion"] == "monitoring.coreos.com/v1", obj["apiVersion"]
    schema = service_monitor_schema()
    jsonschema.validate(obj, schema, cls=jsonschema.Draft7Validator)
    assert not unknown_fields({k: v for k, v in obj.items() if k != "metadata"}, schema)


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("variant", [*OVERLAYS, "prometheus-adapter"])
def test_objects_validate_against_the_kubernetes_schemas(variant: str, version: str) -> None:
    objects = variants()[variant]
    assert objects
    for obj in objects:
        if obj["kind"] == "ServiceMonitor":
            validate_custom_resource(obj)
            continue
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']} ({version}): {'.'.join(map(str, exc.path))}: {exc.message}")


def test_the_crd_check_catches_mistakes() -> None:
    """The ServiceMonitor check is not a formality: a wrong type and a misspelt field both fail."""
    monitor = next(o for o in variants()["pvc"] if o["kind"] == "ServiceMonitor")
    validate_custom_resource(monitor)
    wrong_type = json.loads(json.dumps(monitor))
    wrong_type["spec"]["endpoints"][0]["interval"] = 10
    with pytest.raises(jsonschema.ValidationError):
        validate_custom_resource(wrong_type)
    misspelt = json.loads(json.dumps(monitor))
    misspelt["spec"]["endpoints"][0]["pathh"] = "/metrics"
    with pytest.raises(AssertionError):
        validate_custom_resource(misspelt)
    bad = next(o for o in variants()["pvc"] if o["kind"] == "Deployment")
    bad["spec"]["template"]["spec"]["containers"][0]["lifecycle"]["preStop"]["sleep"]["secs"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, VERSIONS[0], strict=True)


def checkov() -> Path:
    """checkov in a virtualenv of its own (it pins packaging and networkx below what .venv needs), as scripts/test
    makes it from requirements/checkov.txt; made here (about 30 s) where pytest runs without scripts/test."""
    binary = CHECKOV_VENV / "bin" / "checkov"
    digest = hashlib.sha256(CHECKOV_REQUIREMENTS.read_bytes()).hexdigest()[:16]
    stamp = CHECKOV_VENV / f".installed-{digest}"  # scripts/test's stamp: sha256sum's first 16 hex digits
    if not stamp.exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(CHECKOV_VENV)], check=True)
        subprocess.run([str(CHECKOV_VENV / "bin" / "pip"), "install", "-q", "-r", str(CHECKOV_REQUIREMENTS)],
                       check=True, timeout=900)
        stamp.touch()
    return binary


@pytest.mark.slow  # checkov's scan of every rendered manifest: scripts/test -m slow
def test_checkov_finds_nothing_unexplained(tmp_path: Path) -> None:
    for name in OVERLAYS:
        (tmp_path / f"{name}.yaml").write_text(render_text(DEPLOY / "overlays" / name))
    (tmp_path / "prometheus-adapter.yaml").write_text(render_text(ADAPTER))
    out = subprocess.run(
        [str(checkov()), "--directory", str(tmp_path), "--framework", "kubernetes", "--output", "json",
         "--skip-download", "--compact"],
        check=False, capture_output=True, text=True, timeout=300, env={**os.environ, "BC_SKIP_MAPPING": "TRUE"},
    )
    report = json.loads(out.stdout)
    reports = report if isinstance(report, list) else [report]
    results = [r["results"] for r in reports if r.get("check_type") == "kubernetes"]
    assert results, out.stdout[-2000:] + out.stderr[-2000:]
    failed = [(f["check_id"], f["resource"], f["file_path"]) for r in results for f in r["failed_checks"]]
    assert not failed, failed
    assert sum(len(r["passed_checks"]) for r in results) > 100
    skipped = [s for r in results for s in r["skipped_checks"]]
    for skip in skipped:
        assert skip["check_id"] in KEPT_FINDINGS, f"{skip['check_id']} skipped on {skip['resource']}: review it"
        assert len(skip["check_result"].get("suppress_comment", "")) > 40, f"{skip['check_id']} on {skip['resource']}: no reason"
    assert {s["check_id"] for s in skipped} == set(KEPT_FINDINGS)
