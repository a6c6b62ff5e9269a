"""backends/errors.py: one root, four kinds, each naming its engine; none of them is
one of sarp's errors (the core maps them, see backends/errors.py's docstring)."""

from __future__ import annotations

from pathlib import Path

import pytest

from backends.errors import (
    BackendConfigError,
    BackendCorrupt,
    BackendError,
    BackendFormatError,
    BackendIOError,
)

KINDS = [BackendIOError, BackendCorrupt, BackendFormatError, BackendConfigError]


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_has_the_one_root_and_keeps_its_message(kind: type[BackendError]) -> None:
    exc = kind("rocksdb /d: write failed")
    assert isinstance(exc, BackendError) and isinstance(exc, Exception)
    assert exc.message == str(exc) == "rocksdb /d: write failed"
    assert [k for k in KINDS if isinstance(exc, k)] == [kind]  # the kinds are disjoint


def test_backend_errors_are_not_sarp_errors() -> None:
    from sarpd.errors import SarpError

    assert not any(issubclass(k, SarpError) for k in [BackendError, *KINDS])
    assert not any(hasattr(k, "code") for k in [BackendError, *KINDS])  # no wire code


def test_engine_errors_raise_with_their_kind(tmp_path: Path) -> None:
    from backends.memory import MemoryBackend
    from backends.registry import open_backend

    with pytest.raises(BackendConfigError):
        open_backend("nope", tmp_path, cache_bytes=0)
    backend = MemoryBackend()
    backend.close()
    with pytest.raises(BackendIOError):
        backend.get_many([b"k"])
