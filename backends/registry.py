"""Backend names -> factories. Adding an engine is one line in `BACKENDS`.

Every factory is called as `factory(path, cache_bytes=n)`. A backend class whose
constructor is `Cls(path: Path, cache_bytes: int = ...)` registers with
`_lazy("backends.module", "Cls")`: its module is imported on first open only, so an
engine whose package is optional (wiredtiger is built from source) costs nothing
until it is used. A backend that keeps nothing across `close()` sets the class
attribute `persistent = False` (the Backend protocol; the contract tests then skip
reopen and crash tests). An unknown name raises BackendConfigError.
With $SARPD_FAULT_FILE set, `open_backend` wraps the engine in backends.faulty's
FaultyBackend (fault-injection tests of a real daemon).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Protocol

from backends.base import Backend
from backends.errors import BackendConfigError
from backends.faulty import wrap_from_env


class BackendFactory(Protocol):
    def __call__(self, path: Path, *, cache_bytes: int) -> Backend: ...


def _lazy(module: str, cls_name: str) -> BackendFactory:
    def make(path: Path, *, cache_bytes: int) -> Backend:
        cls = getattr(importlib.import_module(module), cls_name)
        backend = cls(path, cache_bytes=cache_bytes)
        if not isinstance(backend, Backend):
            raise TypeError(f"{module}.{cls_name} does not implement backends.base.Backend")
        return backend

    return make


BACKENDS: dict[str, BackendFactory] = {
    "rocksdb": _lazy("backends.rocksdb", "RocksDBBackend"),
    "memory": _lazy("backends.memory", "MemoryBackend"),
    "bloomstore": _lazy("backends.bloomstore", "BloomStoreBackend"),
    "wiredtiger": _lazy("backends.wiredtiger", "WiredTigerBackend"),
}


def backend_names() -> list[str]:
    return list(BACKENDS)


def open_backend(name: str, path: Path, *, cache_bytes: int) -> Backend:
    """Open (creating if missing) the backend `name` on `path`."""
    try:
        factory = BACKENDS[name]
    except KeyError:
        raise BackendConfigError(
            f"backend {name!r} is not known (known: {', '.join(backend_names())})"
        ) from None
    return wrap_from_env(factory(path, cache_bytes=cache_bytes))

