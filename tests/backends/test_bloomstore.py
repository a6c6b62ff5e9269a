"""backends/bloomstore.py: the adapter of the BloomStore engine. Its Backend contract
is in tests/backends/test_contract.py; here: every engine error comes out as its
backends.errors kind naming the directory, tunables reach the engine, a bad one is a
BackendConfigError, and stats merge the engine's."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from backends.bloomstore import BloomStoreBackend
from backends.errors import (
    BackendConfigError,
    BackendCorrupt,
    BackendFormatError,
    BackendIOError,
)
from bloomstore import BloomStore, Geometry
from tests.backends.helpers import batch_of, put_all

SMALL = Geometry(partitions=4, keys_per_page=16, bits_per_key=10, hashes=7)
MODEL = {b"k%06d" % i: b"value %d" % i for i in range(300)}


def _filled(path: Path) -> None:
    backend = BloomStoreBackend(path, cache_bytes=0, geometry=SMALL, fsync=False)
    put_all(backend, MODEL.items(), sync=True)
    backend.engine.checkpoint()  # everything on pages
    backend.close()


def test_tunables_reach_the_engine_and_bad_ones_are_config_errors(tmp_path: Path) -> None:
    backend = BloomStoreBackend(tmp_path / "db", cache_bytes=1 << 20, geometry=SMALL,
                                page_bytes=2048, fsync=False)
    try:
        assert isinstance(backend.engine, BloomStore)
        stats = backend.stats()
        assert stats["backend"] == "bloomstore" and stats["cache_bytes_configured"] == 1 << 20
        assert stats["path"] == str(tmp_path / "db") and "disk_bytes" in stats
        backend.write(batch_of({b"a": b"1"}), sync=False)
        backend.compact()
        assert backend.get_many([b"a"]) == [b"1"]
    finally:
        backend.close()
    with pytest.raises(BackendConfigError, match="-1"):
        BloomStoreBackend(tmp_path / "neg", cache_bytes=-1)
    with pytest.raises(BackendConfigError, match="page_bytes") as bad:
        BloomStoreBackend(tmp_path / "bad", page_bytes=0)
    assert bad.value.__cause__ is not None  # the engine's ConfigError, kept
    with pytest.raises(BackendConfigError, match="geometry"):  # differs from the stored one
        BloomStoreBackend(tmp_path / "db", geometry=Geometry(partitions=5))


def test_closed_and_locked_stores_are_io_errors(tmp_path: Path) -> None:
    backend = BloomStoreBackend(tmp_path / "db", geometry=SMALL)
    with pytest.raises(BackendIOError, match="already open"):
        BloomStoreBackend(tmp_path / "db")
    backend.close()
    for call in (lambda: backend.get_many([b"a"]), lambda: list(backend.scan(b"", b"\xff")),
                 backend.sync, lambda: backend.write(batch_of({b"a": b"1"}), True)):
        with pytest.raises(BackendIOError, match=str(tmp_path / "db")):
            call()
    backend.resume()  # nothing to do


def test_corrupt_page_is_backend_corrupt_in_gets_and_scans(tmp_path: Path) -> None:
    path = tmp_path / "db"
    _filled(path)
    victim = sorted(path.glob("p0001-*.pages"))[0]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x40
    victim.write_bytes(bytes(data))
    backend = BloomStoreBackend(path, cache_bytes=0)
    try:
        errors = 0
        for key, value in MODEL.items():
            try:
                assert backend.get_many([key]) == [value]
            except BackendCorrupt as exc:
                assert str(victim) in exc.message
                assert type(exc.__cause__).__name__ == "CorruptionError"
                errors += 1
        assert 0 < errors < len(MODEL)
        with pytest.raises(BackendCorrupt):
            list(backend.scan(b"", b"\xff"))
    finally:
        backend.close()


def test_log_of_another_format_version_is_backend_format_error(tmp_path: Path) -> None:
    path = tmp_path / "db"
    _filled(path)
    [wal] = path.glob("wal-*.log")
    with wal.open("r+b") as fh:  # the header's version u16 follows the magic
        fh.seek(4)
        fh.write(struct.pack("<H", 9))
    with pytest.raises(BackendFormatError, match="version 9"):
        BloomStoreBackend(path)
    with wal.open("r+b") as fh:  # the refused open released the directory
        fh.seek(4)
        fh.write(struct.pack("<H", 1))
    again = BloomStoreBackend(path)
    assert again.get_many([b"k000001"]) == [b"value 1"]
    again.close()


def test_direct_io_drops_read_pages_from_the_page_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With direct_io every page read is followed by posix_fadvise(DONTNEED) of the
    range it read (and every fsync of a page file by one of the whole file); without
    it there is none."""
    import os

    calls: list[tuple[int, int, int]] = []
    real = os.posix_fadvise

    def spy(fd: int, offset: int, length: int, advice: int) -> None:
        calls.append((offset, length, advice))
        real(fd, offset, length, advice)

    monkeypatch.setattr(os, "posix_fadvise", spy)
    for direct in (False, True):
        calls.clear()
        be = BloomStoreBackend(tmp_path / str(direct), cache_bytes=0, direct_io=direct)
        try:
            put_all(be, [(b"k%05d" % i, b"v" * 64) for i in range(2000)], sync=True)
            be.flush_buffers()
            assert be.get_many([b"k00007", b"k01999"]) == [b"v" * 64] * 2
            assert be.stats()["direct_io"] == int(direct)
        finally:
            be.close()
        reads = [c for c in calls if c[1] > 0]
        assert bool(reads) is direct
        assert all(advice == os.POSIX_FADV_DONTNEED for _, _, advice in calls)
