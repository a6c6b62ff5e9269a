"""Backend names -> factories. Adding an engine is one line in `BACKENDS`.

Every factory is called as `factory(path, cache_bytes=n, direct_io=b)`: `direct_io`
(default false) is THE tunable for reading around the OS page cache (O_DIRECT or
the engine's equivalent, each backend's docstring says which), so that the engine's
own cache of `cache_bytes` is the only cache of its data (the bench turns it on for
every SSD design). A backend class whose
constructor is `Cls(path: Path, cache_bytes: int = ..., *, direct_io: bool = False)`
registers with
`_lazy("backends.module", "Cls")`: its module is imported on first open only, so an
engine whose package is optional (wiredtiger is built from source) costs nothing
until it is used. A backend that keeps nothing across `close()` sets the class
attribute `persistent = False` (the Backend protocol; the contract tests then skip
reopen and crash tests). An unknown name raises BackendConfigError.
With $SARPD_FAULT_FILE set, `open_backend` wraps the engine in backends.faulty's
FaultyBackend (fault-injection tests of a real daemon).

`cache_bytes` is the engine's whole memory budget where the engine can keep to one
(rocksdb: block cache + memtables + index and filter partitions). `CACHE_FLOORS`
names the engines that keep more than a small budget whatever it says: wiredtiger's
cache is at least 32 MiB (a write batch's transaction must fit in it), so a smaller
budget does not bind it; `cache_floor(name)` says how much (0: none).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Protocol

from backends.base import Backend
from backends.errors import BackendConfigError
from backends.faulty import wrap_from_env


class BackendFactory(Protocol):
    def __call__(self, path: Path, *, cache_bytes: int, direct_io: bool = False) -> Backend: ...


def _lazy(module: str, cls_name: str) -> BackendFactory:
    def make(path: Path, *, cache_bytes: int, direct_io: bool = False) -> Backend:
        cls = getattr(importlib.import_module(module), cls_name)
        backend = cls(path, cache_bytes=cache_bytes, direct_io=direct_io)
        if not isinstance(backend, Backend):
            raise TypeError(f"{module}.{cls_name} does not implement backends.base.Backend")
        return backend

    return make


# the least cache an engine keeps whatever `cache_bytes` says (backends/wiredtiger.py)
CACHE_FLOORS: dict[str, int] = {"wiredtiger": 32 * 1024 * 1024}

BACKENDS: dict[str, BackendFactory] = {
    "rocksdb": _lazy("backends.rocksdb", "RocksDBBackend"),
    "memory": _lazy("backends.memory", "MemoryBackend"),
    "bloomstore": _lazy("backends.bloomstore", "BloomStoreBackend"),
    "wiredtiger": _lazy("backends.wiredtiger", "WiredTigerBackend"),
}


def backend_names() -> list[str]:
    return list(BACKENDS)


def cache_floor(name: str) -> int:
    """The least cache backend `name` keeps, above any smaller `cache_bytes` (0: none)."""
    return CACHE_FLOORS.get(name, 0)


def open_backend(name: str, path: Path, *, cache_bytes: int,
                 direct_io: bool = False) -> Backend:
    """Open (creating if missing) the backend `name` on `path`."""
    try:
        factory = BACKENDS[name]
    except KeyError:
        raise BackendConfigError(
            f"backend {name!r} is not known (known: {', '.join(backend_names())})"
        ) from None
    return wrap_from_env(factory(path, cache_bytes=cache_bytes, direct_io=direct_io))

