"""How much single-text throughput depends on the gateway's event-loop CPU per request: put this directory first on
PYTHONPATH with LOOP_TAX_US=N, and every request the gateway's hot routes serve first burns N µs of CPU on the event
loop (holding the GIL, as Python work does). The slope of throughput against N says what cutting the loop's CPU per
request would give (loadtest/results/h100-20z-loop-tax):

    PYTHONPATH=loadtest/experiments/loop_tax:$PYTHONPATH LOOP_TAX_US=100 python3 -m loadtest bench7 ...

Python runs a `sitecustomize` in every process at start, the gateway's spawned workers included; the patch is
applied when gateway.api.hot is first imported. Without LOOP_TAX_US (or 0) it does nothing.
"""

import os
import runpy
import time

TAX_S = float(os.environ.get("LOOP_TAX_US", "0") or 0) / 1e6
TARGET = "gateway.api.hot"
# run by its path: no package of the checkout need be importable yet
ON_IMPORT = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "_shared", "on_import.py")


def _patch(module):
    call = module.HotRoutes.__call__

    async def taxed(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in self.routes:
            end = time.perf_counter() + TAX_S
            while time.perf_counter() < end:
                pass
        await call(self, scope, receive, send)

    module.HotRoutes.__call__ = taxed


if TAX_S > 0:
    runpy.run_path(ON_IMPORT)["patch_on_import"](TARGET, _patch)
