"""Run a function on a module right after its first import, or now if it is already imported.

The overlay patches vLLM's DeepSeek V4.1 classes (the Engram table, the EXL3
load-time reconciliation) without importing the model code at plugin
registration: that import is heavy (seconds, CUDA-only kernels) and, in a vLLM
built with VLLM_TARGET_DEVICE=empty, not possible at all. Registration checks
the release's source instead (see `source.py`) and defers the patch to here.

A patch that raises makes the import raise: the engine stops before it
builds the model (fail closed).
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from collections.abc import Callable
from types import ModuleType

_lock = threading.Lock()
_pending: dict[str, list[Callable[[ModuleType], None]]] = {}


class _Loader(importlib.abc.Loader):
    def __init__(self, inner, name: str) -> None:
        self.inner = inner
        self.name = name

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def __getattr__(self, attr):  # get_source, get_filename, is_package, ...: the real loader's
        return getattr(self.inner, attr)

    def exec_module(self, module) -> None:
        self.inner.exec_module(module)
        with _lock:
            hooks = _pending.pop(self.name, [])
        for fn in hooks:
            fn(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name not in _pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, name)
                return spec
        return None


_finder = _Finder()


def after_import(name: str, fn: Callable[[ModuleType], None]) -> None:
    """Call `fn(module)` once `name` is imported (at once when it already is)."""
    module = sys.modules.get(name)
    if module is not None:
        fn(module)
        return
    with _lock:
        _pending.setdefault(name, []).append(fn)
        if _finder not in sys.meta_path:
            sys.meta_path.insert(0, _finder)


def pending(name: str) -> bool:
    """Whether a patch for `name` still waits for its import."""
    return bool(_pending.get(name))
