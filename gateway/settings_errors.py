"""Invalid settings as the user wrote them: `GATEWAY_SHM: must be one of system, cuda, none (got 'shared')`.

pydantic-settings names a field (`shm`) where the user set a variable (`GATEWAY_SHM`); this names the variable,
derived from the settings class's env prefix and field, and says what the value must be."""

from __future__ import annotations

import re
from typing import Any

from pydantic import ValidationError
from pydantic_core import ErrorDetails
from pydantic_settings import BaseSettings

_QUOTED = re.compile(r"'([^']*)'")
# What a value must be, by pydantic's error type (ctx holds the bounds and choices)
_MUST_BE = {
    "int_parsing": "a whole number", "int_type": "a whole number", "int_from_float": "a whole number",
    "float_parsing": "a number", "float_type": "a number",
    "bool_parsing": "true or false", "bool_type": "true or false",
    "greater_than_equal": "at least {ge}", "greater_than": "above {gt}", "less_than_equal": "at most {le}",
    "less_than": "below {lt}", "string_pattern_mismatch": "of the form {pattern}",
    "string_too_short": "at least {min_length} characters long",
    "string_too_long": "at most {max_length} characters long",
}


def variable_name(settings: type[BaseSettings], location: str) -> str:
    """The environment variable behind an error's location: a field's alias (which pydantic-settings reads without
    the prefix, and names in errors), else the class's env prefix + the field's name."""
    info = settings.model_fields.get(location)
    alias = info.validation_alias if info is not None else location
    name = alias if isinstance(alias, str) else f"{settings.model_config.get('env_prefix', '')}{location}"
    return name if settings.model_config.get("case_sensitive") else name.upper()


def _requirement(error: ErrorDetails) -> str:
    """What one error asks of the value, as a phrase that follows "must be" (or a whole predicate)."""
    ctx: dict[str, Any] = dict(error.get("ctx") or {})
    if error["type"] == "literal_error":
        choices = _QUOTED.findall(str(ctx.get("expected", "")))
        return choices[0] if len(choices) == 1 else f"one of {', '.join(choices)}"
    if error["type"] in _MUST_BE:
        return _MUST_BE[error["type"]].format(**ctx)
    message = error["msg"].removeprefix("Value error, ")
    return message.removeprefix("must be ") if message.startswith("must be ") else f"valid ({message})"


def describe(exc: ValidationError, settings: type[BaseSettings]) -> str:
    """One line naming each invalid variable, what it must be, and the value it had."""
    by_location: dict[str, list[ErrorDetails]] = {}
    for error in exc.errors():
        by_location.setdefault(str(error["loc"][0]) if error["loc"] else "", []).append(error)
    parts = []
    for location, errors in by_location.items():
        name = variable_name(settings, location)
        if errors[0]["type"] == "missing":
            parts.append(f"{name}: must be set")
            continue
        # a union (`int | Literal["auto"]`) fails once per member: "a whole number or auto"
        wants = " or ".join(dict.fromkeys(_requirement(e) for e in errors))
        parts.append(f"{name}: must be {wants} (got {errors[0]['input']!r})")
    return "; ".join(parts)
