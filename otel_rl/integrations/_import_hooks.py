"""Run a callback once a module has been imported, without importing it.

For frameworks whose plugin loader imports otel-rl early (verl loads its ``verl.plugins`` entry
points while ``import verl`` is still running): a part of the framework that is heavy to import
(verl's agent loop pulls hydra, transformers and Ray) is instrumented when the framework itself
imports it, in the processes that use it, and never imported where it is not used.

``when_imported(name, callback)`` calls ``callback(module)`` right away when ``name`` is already
imported, else right after the import of ``name`` finishes (its package's ``__init__`` included).
It returns a function that cancels the callback if it has not run yet. A callback that raises is
logged, never raised into the import.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

logger = logging.getLogger("otel_rl")

Callback = Callable[[ModuleType], Any]

_lock = threading.Lock()
_pending: dict[str, list[Callback]] = {}  # module name -> callbacks waiting for its import


def when_imported(name: str, callback: Callback) -> Callable[[], None]:
    """``callback(module)`` once ``name`` is imported (now, if it is); returns a cancel function."""
    module = sys.modules.get(name)
    if module is not None and _fully_imported(module):
        _run(name, callback, module)
        return _nothing
    with _lock:
        _pending.setdefault(name, []).append(callback)
        if not any(isinstance(finder, _Finder) for finder in sys.meta_path):
            sys.meta_path.insert(0, _FINDER)

    def cancel() -> None:
        with _lock:
            waiting = _pending.get(name, [])
            if callback in waiting:
                waiting.remove(callback)
            if not waiting:
                _pending.pop(name, None)
            if not _pending and _FINDER in sys.meta_path:
                sys.meta_path.remove(_FINDER)

    return cancel


def _nothing() -> None:
    return None


def _fully_imported(module: ModuleType) -> bool:
    # A module whose import is running sits in sys.modules already, marked by its spec.
    spec = getattr(module, "__spec__", None)
    return not getattr(spec, "_initializing", False)


def _run(name: str, callback: Callback, module: ModuleType) -> None:
    try:
        callback(module)
    except Exception:  # never into the framework's import
        logger.warning("otel-rl: instrumenting %s on its import failed", name, exc_info=True)


def _fire(name: str, module: ModuleType) -> None:
    with _lock:
        callbacks = _pending.pop(name, [])
        if not _pending and _FINDER in sys.meta_path:
            sys.meta_path.remove(_FINDER)
    for callback in callbacks:
        _run(name, callback, module)


class _Loader(importlib.abc.Loader):
    """The module's own loader, then the callbacks. The module keeps its own loader as
    ``__loader__`` / ``__spec__.loader`` (resources and source lookups go to it)."""

    def __init__(self, loader: Any, name: str) -> None:
        self._loader = loader
        self._name = name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        spec = module.__spec__
        if spec is not None:
            spec.loader = self._loader
        module.__loader__ = self._loader
        self._loader.exec_module(module)
        _fire(self._name, module)


class _Finder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: for a watched name it asks the finders after it and wraps the loader."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _pending:
            return None
        for finder in list(sys.meta_path):
            if finder is self or isinstance(finder, _Finder):
                continue
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, fullname)
                return spec
        return None


_FINDER = _Finder()

__all__ = ["when_imported"]
