"""An invalid GATEWAY_* value: `python -m gateway` answers one line naming the variable, what it must be and the
value it had, and exits 2 before anything starts (no pydantic traceback naming the field)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from devstack.tritonserver import REPO_ROOT
from gateway.settings import GatewaySettings
from gateway.settings_errors import describe, variable_name


@pytest.mark.parametrize(("variable", "value", "expected"), [
    ("GATEWAY_SHM", "shared", "GATEWAY_SHM: must be one of system, cuda, none (got 'shared')"),
    ("GATEWAY_WORKERS", "four", "GATEWAY_WORKERS: must be a whole number or auto (got 'four')"),
    ("GATEWAY_WORKERS", "0", "GATEWAY_WORKERS: must be at least 1 (or auto) (got '0')"),
    ("GATEWAY_PORT", "0", "GATEWAY_PORT: must be at least 1 (got '0')"),
    ("GATEWAY_MAX_QUEUE_WAIT_S", "soon", "GATEWAY_MAX_QUEUE_WAIT_S: must be a number (got 'soon')"),
    ("GATEWAY_DIRECT_ROUTES", "maybe", "GATEWAY_DIRECT_ROUTES: must be true or false (got 'maybe')"),
])
def test_invalid_setting_names_the_variable(
    variable: str, value: str, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValidationError) as caught:
        GatewaySettings()
    assert describe(caught.value, GatewaySettings) == expected


def test_several_invalid_settings_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_SHM", "shared")
    monkeypatch.setenv("GATEWAY_LOG_LEVEL", "loud")
    with pytest.raises(ValidationError) as caught:
        GatewaySettings()
    assert describe(caught.value, GatewaySettings) == (
        "GATEWAY_SHM: must be one of system, cuda, none (got 'shared'); "
        "GATEWAY_LOG_LEVEL: must be one of debug, info, warning, error (got 'loud')")


class _Other(BaseSettings):
    """Another class's prefix and an alias: the names come from the class, not from a table."""

    model_config = SettingsConfigDict(env_prefix="OTHER_")
    count: int = 1
    home: str = Field("/home", validation_alias="HOME_DIR", min_length=2)


def test_variable_names_come_from_the_settings_class(monkeypatch: pytest.MonkeyPatch) -> None:
    assert variable_name(GatewaySettings, "triton_http_url") == "GATEWAY_TRITON_HTTP_URL"
    assert (variable_name(_Other, "count"), variable_name(_Other, "HOME_DIR")) == ("OTHER_COUNT", "HOME_DIR")
    monkeypatch.setenv("OTHER_COUNT", "many")
    with pytest.raises(ValidationError) as caught:
        _Other()
    assert describe(caught.value, _Other) == "OTHER_COUNT: must be a whole number (got 'many')"
    monkeypatch.setenv("HOME_DIR", "/")
    with pytest.raises(ValidationError) as caught:
        _Other()
    assert describe(caught.value, _Other) == (
        "OTHER_COUNT: must be a whole number (got 'many'); HOME_DIR: must be at least 2 characters long (got '/')")


def test_python_m_gateway_exits_2_with_one_line() -> None:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}, "GATEWAY_SHM": "shared"}
    result = subprocess.run([sys.executable, "-m", "gateway"], cwd=REPO_ROOT, env=env, capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert result.stderr == "error: GATEWAY_SHM: must be one of system, cuda, none (got 'shared')\n"
    assert result.stdout == ""
