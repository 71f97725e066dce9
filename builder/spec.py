"""Spec files: YAML with an optional `defaults:` mapping and a `models:` list; `${VAR}` / `${VAR:-default}` expand.

An entry with `enabled: false` (spec only; default true) is skipped."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter, ValidationError

from builder.errors import UsageError
from builder.settings import BuildRequest

_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}")


def interpolate(value: Any, environ: Mapping[str, str] | None = None) -> Any:
    """Expand `${VAR}` and `${VAR:-default}` in every string of `value` (nested lists and mappings)."""
    env = os.environ if environ is None else environ
    if isinstance(value, str):
        def substitute(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            current = env.get(name)
            if current not in (None, ""):
                return str(current)
            if default is not None:
                return default
            raise UsageError(f"spec file uses ${{{name}}} but the environment variable {name} is not set")
        return _VARIABLE.sub(substitute, value)
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    return value


def _normalise_keys(item: dict[str, Any]) -> dict[str, Any]:
    return {str(k).replace("-", "_"): v for k, v in item.items()}


def _drop_empty(item: dict[str, Any]) -> dict[str, Any]:
    """A value that interpolated to "" means "use the default"."""
    return {k: v for k, v in item.items() if v != ""}


def _enabled(value: Any, where: str) -> bool:
    """The entry's `enabled` key (true/false, yes/no, 1/0 once interpolated); absent or "" = true."""
    if value == "":
        return True
    try:
        return TypeAdapter(bool).validate_python(value)
    except ValidationError:
        raise UsageError(f"{where}: invalid enabled: {value!r} is not true or false") from None


def format_validation_error(error: ValidationError, where: str) -> str:
    first = error.errors()[0]
    field_name = ".".join(str(p) for p in first["loc"]) or "entry"
    return f"{where}: invalid {field_name.replace('_', '-')}: {first['msg']}"


def load_spec(path: Path, environ: Mapping[str, str] | None = None) -> list[BuildRequest]:
    """Parse `path` into build requests; raise UsageError with one line on any problem."""
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise UsageError(f"cannot read spec file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"spec file {path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict) or not isinstance(data.get("models"), list) or not data["models"]:
        raise UsageError(f"spec file {path} needs a non-empty `models:` list")
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise UsageError(f"spec file {path}: `defaults:` must be a mapping")
    unknown = set(data) - {"defaults", "models"}
    if unknown:
        raise UsageError(f"spec file {path}: unknown top-level key(s) {', '.join(sorted(map(str, unknown)))}")
    requests = []
    for index, item in enumerate(data["models"]):
        if not isinstance(item, dict):
            raise UsageError(f"spec file {path}: models[{index}] must be a mapping")
        entry = {**_normalise_keys(defaults), **_normalise_keys(item)}
        where = f"spec file {path}: models[{index}]"
        if not _enabled(interpolate(entry.pop("enabled", True), environ), where):
            continue  # before the rest is interpolated: a disabled entry needs none of its variables
        merged = _drop_empty(interpolate(entry, environ))
        try:
            requests.append(BuildRequest.model_validate(merged))
        except ValidationError as exc:
            raise UsageError(format_validation_error(exc, where)) from None
    return requests
