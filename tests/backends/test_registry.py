"""backends/registry.py: names -> factories, the lazy import of an engine's module,
the refusal of an unknown name (an operator's error) and the fault-file wrapper."""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from backends import registry
from backends.errors import BackendConfigError
from backends.faulty import ENV, FaultyBackend
from backends.memory import MemoryBackend
from backends.registry import BACKENDS, backend_names, open_backend
from backends.rocksdb import block_cache_bytes

CACHE = 8 << 20
ROOT = Path(__file__).resolve().parents[2]


class NotABackend:
    """Opens like a backend, implements none of the protocol."""

    def __init__(self, path: Path, cache_bytes: int = 0, *, direct_io: bool = False) -> None:
        self.path = path


def test_registry_names_and_unknown_name(tmp_path: Path) -> None:
    assert {"rocksdb", "memory"} <= set(backend_names())
    assert backend_names() == list(BACKENDS)
    with pytest.raises(BackendConfigError) as err:
        open_backend("leveldb", tmp_path, cache_bytes=CACHE)
    assert "'leveldb'" in err.value.message and "rocksdb" in err.value.message
    assert err.value.__cause__ is None  # the KeyError is no part of the story


def test_open_backend_returns_the_engine_it_names(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    backend = open_backend("memory", tmp_path / "m", cache_bytes=CACHE)
    assert isinstance(backend, MemoryBackend) and backend.path == tmp_path / "m"
    assert backend.persistent is False
    backend.close()
    rocks = open_backend("rocksdb", tmp_path / "r", cache_bytes=3 << 20)
    try:
        assert rocks.name == "rocksdb" and rocks.persistent is True
        assert rocks.stats()["cache_bytes_configured"] == 3 << 20  # cache_bytes reaches it
        assert rocks.stats()["block_cache_bytes"] == block_cache_bytes(3 << 20)
    finally:
        rocks.close()


def test_every_registered_engine_declares_persistence() -> None:
    """`persistent` is part of the Backend protocol: a class attribute of each engine."""
    for name in backend_names():
        if name == "wiredtiger" and importlib.util.find_spec("wiredtiger") is None:
            continue
        module = importlib.import_module(f"backends.{name}")
        classes = [v for k, v in vars(module).items() if k.endswith("Backend")
                   and isinstance(v, type) and v.__module__ == module.__name__]
        assert [type(c.persistent) for c in classes] == [bool], name


LAZY_CHILD = """
import importlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from backends.registry import open_backend
before = {m for m in ("backends.rocksdb", "backends.memory") if m in sys.modules}
open_backend("memory", Path(sys.argv[1]), cache_bytes=0).close()
after = {m for m in ("backends.rocksdb", "backends.memory") if m in sys.modules}
print(sorted(before), sorted(after))
"""


def test_engine_modules_are_imported_on_first_open(tmp_path: Path) -> None:
    """Importing the registry imports no engine; opening one imports only its module."""
    proc = subprocess.run([sys.executable, "-c", LAZY_CHILD, str(tmp_path)],
                          env=dict(os.environ, PYTHONPATH=str(ROOT)),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[0] == "[] ['backends.memory']"


def test_a_class_that_is_no_backend_is_refused(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(BACKENDS, "bogus", registry._lazy(__name__, "NotABackend"))
    with pytest.raises(TypeError, match="NotABackend does not implement"):
        open_backend("bogus", tmp_path, cache_bytes=0)


def test_fault_file_wraps_only_when_set(tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    plain = open_backend("memory", tmp_path, cache_bytes=0)
    assert not isinstance(plain, FaultyBackend)
    monkeypatch.setenv(ENV, str(tmp_path / "fault"))
    wrapped = open_backend("memory", tmp_path, cache_bytes=0)
    assert isinstance(wrapped, FaultyBackend) and isinstance(wrapped.inner, MemoryBackend)
    assert wrapped.control == tmp_path / "fault" and wrapped.mode() == ""
    assert wrapped.persistent is False and wrapped.name == "memory"
