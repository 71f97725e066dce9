"""How much single-text throughput depends on the gateway's event-loop CPU per request: put this directory first on
PYTHONPATH with LOOP_TAX_US=N, and every request the gateway's hot routes serve first burns N µs of CPU on the event
loop (holding the GIL, as Python work does). The slope of throughput against N says what cutting the loop's CPU per
request would give (loadtest/results/h100-20z-loop-tax):

    PYTHONPATH=loadtest/experiments/loop_tax:$PYTHONPATH LOOP_TAX_US=100 python3 -m loadtest bench7 ...

Python runs a `sitecustomize` in every process at start, the gateway's spawned workers included; the patch is
applied when gateway.api.hot is first imported. Without LOOP_TAX_US (or 0) it does nothing.
"""

import importlib.abc
import importlib.util
import os
import sys
import time

TAX_S = float(os.environ.get("LOOP_TAX_US", "0") or 0) / 1e6
TARGET = "gateway.api.hot"


def _patch(module):
    call = module.HotRoutes.__call__

    async def taxed(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in self.routes:
            end = time.perf_counter() + TAX_S
            while time.perf_counter() < end:
                pass
        await call(self, scope, receive, send)

    module.HotRoutes.__call__ = taxed


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        loader = spec.loader
        execute = loader.exec_module

        def exec_and_patch(module):
            execute(module)
            _patch(module)

        loader.exec_module = exec_and_patch
        return spec


if TAX_S > 0:
    sys.meta_path.insert(0, _Finder())
