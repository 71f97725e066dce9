"""The loop-tax experiment's sitecustomize: with LOOP_TAX_US, every request of the gateway's hot routes burns that CPU
first; without it, nothing is patched."""

from __future__ import annotations

import pytest

from tests.fixtures.experiments import probe_with_experiment

PROBE = """
import asyncio, time
import gateway.api.hot as hot

async def app(scope, receive, send):
    pass

routes = hot.HotRoutes(app, {"/embed": None})  # a served path (its entry is not looked at before the tax)
async def timed(path):
    start = time.process_time()
    await routes(dict(type="http", method="POST", path=path), None, None)
    return time.process_time() - start
print(hot.HotRoutes.__call__.__name__, asyncio.run(timed("/embed")) > 0.04, asyncio.run(timed("/other")) < 0.04)
"""


def run(tax: str | None) -> str:
    return probe_with_experiment("loop_tax", "LOOP_TAX_US", tax, PROBE)


@pytest.mark.slow  # a GPU experiment's CPU smoke run (~2 s): `scripts/test -m slow`
def test_the_tax_is_burnt_on_hot_routes_only_and_only_when_asked() -> None:
    assert run("50000") == "taxed True True"  # 50 ms of CPU on /embed, none on a path the hot routes do not serve
    assert run(None).startswith("__call__ ")
