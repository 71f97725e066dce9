"""build_manifest.json: where a model came from, how it was built, and its parity numbers."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel

from builder import BUILDER_VERSION
from builder.parity import ParityResult
from builder.settings import ResolvedSettings

MANIFEST_FILE = "build_manifest.json"
_LIBRARIES = ("torch", "transformers", "tokenizers", "onnx", "onnxruntime", "onnxruntime-gpu", "tensorrt",
              "tritonclient", "numpy")


class OnnxFacts(BaseModel):
    """The published model.onnx: whether onnxruntime's transformer optimizer ran, what it fused, op counts."""

    optimized: bool = False
    precision: str = "fp32"
    fused_ops: dict[str, int] = {}
    ops: dict[str, int] = {}
    layout: str = "padded"  # packed: builder/packing.py rewrote the optimized graph
    packed_form: str = ""  # packed: "gpu" (PackedMultiHeadAttention) or "cpu" (MultiHeadAttention per row)


class Manifest(BaseModel):
    """Contents of build_manifest.json."""

    builder_version: str
    fingerprint: str
    version: int = 1  # the version directory this build was published as
    source: dict[str, Any]
    settings: ResolvedSettings
    artifacts: dict[str, str]  # format -> repository entry name
    versions: dict[str, str]
    python: str
    gpu: str | None
    parity: list[ParityResult]
    onnx: OnnxFacts
    built_at: str


def library_versions() -> dict[str, str]:
    """Installed versions of the libraries that shape the artifacts."""
    found = {}
    for name in _LIBRARIES:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def fingerprint(source: dict[str, Any], settings: ResolvedSettings) -> str:
    """Hash of everything a build depends on: source identity, settings, builder and library versions."""
    payload = {
        "builder": BUILDER_VERSION,
        "source": source,
        "settings": settings.model_dump(mode="json"),
        "versions": library_versions(),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def python_version() -> str:
    return platform.python_version()


def write_manifest(directory: Path, manifest: Manifest) -> None:
    (directory / MANIFEST_FILE).write_bytes(orjson.dumps(manifest.model_dump(mode="json"), option=orjson.OPT_INDENT_2))


def read_manifest(directory: Path) -> Manifest | None:
    """The manifest in `directory`, or None when it is missing or unreadable."""
    try:
        return Manifest.model_validate_json((directory / MANIFEST_FILE).read_bytes())
    except (OSError, ValueError):
        return None
