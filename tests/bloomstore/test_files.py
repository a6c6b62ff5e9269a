"""bloomstore/files.py: whole positional writes and exact reads, atomic replacement,
the bytes of a directory, and a DataFile that refuses reads once closed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bloomstore.files import DataFile, file_bytes, pread_exact, pwrite_all, write_atomic


def test_pwrite_all_and_pread_exact(tmp_path: Path) -> None:
    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        pwrite_all(fd, b"hello", 0)
        pwrite_all(fd, memoryview(b"world"), 10)  # a hole in between reads as zeros
        assert pread_exact(fd, 15, 0) == b"hello\0\0\0\0\0world"
        with pytest.raises(EOFError, match="short read: 5 of 6 bytes at offset 10"):
            pread_exact(fd, 6, 10)
    finally:
        os.close(fd)


@pytest.mark.parametrize("fsync", [True, False])
def test_write_atomic_replaces_the_whole_file(tmp_path: Path, fsync: bool) -> None:
    path = tmp_path / "MANIFEST"
    path.write_bytes(b"x" * 100)
    write_atomic(path, b"new", fsync)
    assert path.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["MANIFEST"]  # no .tmp left


def test_file_bytes_counts_regular_files_only(tmp_path: Path) -> None:
    (tmp_path / "a").write_bytes(b"1" * 10)
    (tmp_path / "b").write_bytes(b"2" * 5)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c").write_bytes(b"3" * 100)
    (tmp_path / "link").symlink_to(tmp_path / "a")
    assert file_bytes(tmp_path) == 15
    assert file_bytes(tmp_path / "missing") == 0


def test_data_file(tmp_path: Path) -> None:
    f = DataFile(tmp_path / "p.pages", create=True)
    f.write(b"abcdef", 0)
    f.sync()
    assert f.size() == 6 and f.read(3, 2) == b"cde"
    again = DataFile(tmp_path / "p.pages", create=False, truncate=True)
    assert again.size() == 0
    again.close()
    f.close()
    f.close()  # idempotent
    assert f.fd == -1
    with pytest.raises(OSError, match="is closed"):
        f.read(1, 0)
    with pytest.raises(FileNotFoundError):
        DataFile(tmp_path / "missing", create=False)
