"""The bare-front experiment's sitecustomize (loadtest/experiments/bare_front): with BARE_FRONT, the gateway's protocol
class is replaced by one that serves POST /embed itself; without it, nothing is patched."""

from __future__ import annotations

import pytest

from tests.fixtures.experiments import probe_with_experiment

PROBE = "import gateway.http_protocol as p; print(p.NoDelayHttpToolsProtocol.__name__)"


def protocol_class(mode: str | None) -> str:
    return probe_with_experiment("bare_front", "BARE_FRONT", mode, PROBE)


@pytest.mark.slow  # a GPU experiment's CPU smoke run (~2 s): `scripts/test -m slow`
def test_the_protocol_is_replaced_only_when_asked() -> None:
    assert protocol_class("logged") == "BareEmbedProtocol"
    assert protocol_class(None) == "NoDelayHttpToolsProtocol"
