"""The data set's manifest (sarpd/core/manifest.py): written on a first open, checked
on every later one; another format, geometry, hash or locator setting is refused
naming the setting (and both versions), and the data is left untouched."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from backends.base import WriteBatch
from backends.memory import MemoryBackend
from backends.registry import backend_names
from backends.rocksdb import RocksDBBackend
from sarpd.config import IndexConfig
from sarpd.core.ids import HASH_NAME
from sarpd.core.index import SarpIndex
from sarpd.core.manifest import (
    FORMAT_VERSION,
    check_manifest,
    encode_manifest,
    expected_manifest,
)
from sarpd.core.segment import COUNTERS_KEY, MANIFEST_KEY, SEGMENT_FORMAT
from sarpd.core.store import open_backend
from sarpd.errors import CorruptData, FormatVersionError
from sarpd.model import Insert, SeqSpec

CFG = IndexConfig()
PERSISTENT = [n for n in backend_names() if n != "memory"]


def build(root: Path, backend: str = "rocksdb") -> None:
    """An index holding a few sequences; closed."""
    ix = SarpIndex(open_backend(backend, root / "db", cache_bytes=1 << 22), CFG, root / "snap")
    ix.recover()
    rng = np.random.default_rng(3)
    ix.write_many([Insert(i, SeqSpec("", tokens=rng.integers(0, 1000, 16 * 9).astype(np.uint32)),
                          meta=i) for i in range(4)])
    ix.close()


def set_manifest(db: Path, backend: str, fmt: int | None) -> bytes | None:
    """Rewrite the manifest's format (None: delete the manifest); the old value."""
    be = open_backend(backend, db, cache_bytes=1 << 22)
    try:
        old = be.get_many([MANIFEST_KEY])[0]
        assert old is not None
        wb = WriteBatch()
        if fmt is None:
            wb.delete(MANIFEST_KEY)
        else:
            wb.put(MANIFEST_KEY, json.dumps({**json.loads(old), "format": fmt}).encode())
        be.write(wb, True)
        return old
    finally:
        be.close()


def test_a_first_open_writes_the_expected_manifest() -> None:
    be = MemoryBackend()
    SarpIndex(be, CFG)
    raw = be.get_many([MANIFEST_KEY])[0]
    assert raw == encode_manifest(CFG)
    assert json.loads(raw or b"") == {
        "format": FORMAT_VERSION, "segment_format": SEGMENT_FORMAT, "hash": HASH_NAME,
        "block_tokens": CFG.block_tokens, "segment_blocks": CFG.segment_blocks,
        "block_locators": True}
    assert list(json.loads(raw or b"")) == sorted(expected_manifest(CFG))  # keys sorted
    SarpIndex(be, CFG)  # and a reopen accepts it


@pytest.mark.parametrize("raw,want", [
    (b"{not json", "manifest is not JSON"),
    (b"[1, 2]", "no integer format version"),
    (b'{"format": "1"}', "no integer format version"),
])
def test_an_unreadable_manifest_is_corrupt(raw: bytes, want: str) -> None:
    with pytest.raises(CorruptData, match=want):
        check_manifest(raw, CFG)


@pytest.mark.parametrize("key,value", [("hash", "md5-chain"), ("block_tokens", 32),
                                       ("segment_blocks", 32), ("segment_format", 9)])
def test_another_setting_is_refused_naming_it(key: str, value: object) -> None:
    raw = json.dumps({**expected_manifest(CFG), key: value}).encode()
    with pytest.raises(FormatVersionError, match=f"written with {key}={value!r}"):
        check_manifest(raw, CFG)


def test_data_from_before_the_locator_setting_has_locators() -> None:
    old = {k: v for k, v in expected_manifest(CFG).items() if k != "block_locators"}
    check_manifest(json.dumps(old).encode(), CFG)
    with pytest.raises(FormatVersionError, match="block_locators=True"):
        check_manifest(json.dumps(old).encode(), IndexConfig(block_locators=False))


@pytest.mark.parametrize("backend", PERSISTENT)
@pytest.mark.parametrize("fmt,side", [(FORMAT_VERSION + 1, "newer"), (0, "older")])
def test_other_data_format_is_refused_naming_both(tmp_path: Path, backend: str, fmt: int,
                                                  side: str) -> None:
    build(tmp_path, backend)
    set_manifest(tmp_path / "db", backend, fmt)
    be = open_backend(backend, tmp_path / "db", cache_bytes=1 << 22)
    try:
        with pytest.raises(FormatVersionError) as err:
            SarpIndex(be, CFG, tmp_path / "snap")
        msg = err.value.message
        assert f"data format {fmt}" in msg and f"reads format {FORMAT_VERSION}" in msg
        assert side in msg
        assert json.loads(be.get_many([MANIFEST_KEY])[0] or b"")["format"] == fmt  # untouched
    finally:
        be.close()


def test_missing_manifest_with_data_is_refused(tmp_path: Path) -> None:
    build(tmp_path)
    set_manifest(tmp_path / "db", "rocksdb", None)
    be = open_backend("rocksdb", tmp_path / "db", cache_bytes=1 << 22)
    try:
        with pytest.raises(CorruptData, match=r"manifest .* is missing"):
            SarpIndex(be, CFG, tmp_path / "snap")
        assert be.get_many([MANIFEST_KEY]) == [None]  # nothing written over the data
        assert be.get_many([COUNTERS_KEY])[0] is not None
    finally:
        be.close()


def test_block_locators_setting_cannot_change_under_data(tmp_path: Path) -> None:
    be = open_backend("rocksdb", tmp_path / "db", cache_bytes=1 << 22)
    SarpIndex(be, IndexConfig(), tmp_path / "snap").close()
    be = open_backend("rocksdb", tmp_path / "db", cache_bytes=1 << 22)
    try:
        with pytest.raises(FormatVersionError, match="block_locators=True"):
            SarpIndex(be, IndexConfig(block_locators=False), tmp_path / "snap")
    finally:
        be.close()


def test_geometry_change_is_refused(tmp_path: Path) -> None:
    ix = SarpIndex(open_backend("rocksdb", tmp_path / "db", cache_bytes=1 << 22), CFG,
                   tmp_path / "snap")
    ix.recover()
    ix.close()
    backend = RocksDBBackend(tmp_path / "db")
    with pytest.raises(FormatVersionError, match="segment_blocks"):
        SarpIndex(backend, IndexConfig(segment_blocks=32), tmp_path / "snap")
    backend.close()


@pytest.mark.parametrize("backend", PERSISTENT)
def test_segment_format_1_data_is_read_and_its_manifest_upgraded(tmp_path: Path,
                                                                 backend: str) -> None:
    """Data written before holder tables (segment format 1) opens as it is; the open
    rewrites only the manifest, so an older build refuses the data from then on."""
    build(tmp_path, backend)
    be = open_backend(backend, tmp_path / "db", cache_bytes=1 << 22)
    try:
        old = json.loads(be.get_many([MANIFEST_KEY])[0] or b"")
        wb = WriteBatch()
        wb.put(MANIFEST_KEY, json.dumps({**old, "segment_format": 1}).encode())
        be.write(wb, True)
    finally:
        be.close()
    be = open_backend(backend, tmp_path / "db", cache_bytes=1 << 22)
    try:
        ix = SarpIndex(be, CFG, tmp_path / "snap")
        ix.recover()
        assert ix.counters.blocks == 9 * 4
        assert json.loads(be.get_many([MANIFEST_KEY])[0] or b"")["segment_format"] == 2
    finally:
        be.close()
