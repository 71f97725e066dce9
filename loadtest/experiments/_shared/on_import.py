"""`patch_on_import(target, patch)`: run `patch(module)` right after the module named `target` is first imported.

The experiments' sitecustomize files (loadtest/experiments/*/sitecustomize.py) patch the gateway this way: Python
runs a `sitecustomize` in every process at start, before the gateway is imported, uvicorn's spawned workers included.
They load this file by its path, since at that point no package of the checkout may be importable yet.
"""

import importlib.abc
import importlib.util
import sys


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, target, patch):
        self.target, self.patch = target, patch

    def find_spec(self, name, path, target=None):
        if name != self.target:
            return None
        sys.meta_path.remove(self)  # once: the module is found normally, then patched
        spec = importlib.util.find_spec(name)
        loader = spec.loader
        execute = loader.exec_module

        def exec_and_patch(module):
            execute(module)
            self.patch(module)

        loader.exec_module = exec_and_patch
        return spec


def patch_on_import(target, patch):
    sys.meta_path.insert(0, _Finder(target, patch))
