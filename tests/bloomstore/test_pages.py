"""bloomstore/pages.py: the KV page layout (encode, verify, look up), the page
cache and the cut of a buffer into pages; a corrupt page is never served."""

from __future__ import annotations

from pathlib import Path

import pytest

from bloomstore import BloomStore, CorruptionError, Tuning
from bloomstore.filter import digests, prefix8
from bloomstore.pages import MAGIC, MAX_ZONES, Page, PageCache, chunk_bounds, encode, zones
from tests.bloomstore.helpers import QUIET, SMALL, be8


def test_corrupt_page_is_detected_never_served(tmp_path: Path) -> None:
    path = tmp_path / "db"
    store = BloomStore(path, SMALL, QUIET)
    model = {b"k%06d" % i: b"value %d" % i for i in range(300)}
    store.write(model, ())
    store.checkpoint()
    store.close()
    victim = sorted(path.glob("p0001-*.pages"))[0]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0x40
    victim.write_bytes(bytes(data))
    store = BloomStore(path, None, Tuning(cache_bytes=0, fsync=False))  # opens: no page read
    errors = 0
    for key, value in model.items():
        try:
            assert store.get_many([key]) == [value]
        except CorruptionError as exc:
            assert str(victim) in str(exc)
            errors += 1
    assert 0 < errors < len(model)
    with pytest.raises(CorruptionError):
        list(store.scan(b"", b"\xff"))
    store.close()


def _page(keys: list[bytes], values: list[bytes | None], partition: int = 3) -> bytes:
    lo, _ = digests(keys)
    return encode(partition, keys, values, lo)


def test_a_page_round_trips_its_entries() -> None:
    keys = [b"", b"a", b"b\x00", b"bb", b"c" * 300]
    values: list[bytes | None] = [b"empty key", b"1", None, b"", b"v" * 1000]
    data = _page(keys, values)
    assert data[:4] == MAGIC
    page = Page(data, "where", partition=3)
    assert page.n == 5 and page.keys() == keys
    lo, _ = digests([b"bb", b"absent", b"a", b"b\x00"])
    found = page.find_many([b"bb", b"absent", b"a", b"b\x00"], lo)
    assert found == [3, -1, 1, 2]
    assert page.value(1) == b"1" and page.value(3) == b"" and page.value(4) == b"v" * 1000
    assert page.is_tombstone(2) and not page.is_tombstone(3)
    assert page.key_range(b"a", b"bb") == range(1, 3)
    assert page.key_range(b"d", b"z") == range(5, 5)


def test_every_damage_is_corruption_naming_where() -> None:
    data = _page([b"a", b"b"], [b"1", b"2"])
    with pytest.raises(CorruptionError, match="where: a page of partition 3, not 4"):
        Page(data, "where", partition=4)
    with pytest.raises(CorruptionError, match="shorter than a page header"):
        Page(data[:20], "where")
    with pytest.raises(CorruptionError, match="layout of 2 entries needs"):
        Page(data[:-1], "where")
    with pytest.raises(CorruptionError, match="bad magic"):
        Page(b"XXXX" + data[4:], "where")
    for at in (24, len(data) - 1, 40):  # the checksum, a value, the hash index
        flipped = bytearray(data)
        flipped[at] ^= 1
        with pytest.raises(CorruptionError, match="checksum mismatch"):
            Page(bytes(flipped), "where")


def test_zones_bound_runs_of_a_first_byte() -> None:
    keys = sorted([b"B" + bytes([i]) * 8 for i in range(3)] + [b"L" + be8(5), b"L" + be8(9)])
    assert zones(keys) == ((prefix8(keys[0]), prefix8(keys[2])),
                           (prefix8(keys[3]), prefix8(keys[4])))
    many = [bytes([c]) for c in range(20)]  # 20 runs merge into at most MAX_ZONES
    merged = zones(many)
    assert len(merged) <= MAX_ZONES and merged[0][0] == 0 and merged[-1][1] == prefix8(b"\x13")


def test_chunk_bounds_respect_keys_and_bytes() -> None:
    assert chunk_bounds([1] * 5, [1] * 5, max_keys=2, max_bytes=100) == [(0, 2), (2, 4), (4, 5)]
    assert chunk_bounds([1, 1, 1], [50, 50, 50], max_keys=10, max_bytes=100) == [
        (0, 1), (1, 2), (2, 3)]
    assert chunk_bounds([1], [500], max_keys=10, max_bytes=100) == [(0, 1)]  # one big entry
    assert chunk_bounds([], [], max_keys=10, max_bytes=100) == []


def test_page_cache_is_an_lru_bounded_by_bytes() -> None:
    page = Page(_page([b"a"], [b"x" * 100]), "p")
    size = len(page.data)
    cache = PageCache(capacity=4 * size + 10)
    for i in range(5):
        cache.put((i % 2, 1, i), page)
    assert cache.used <= cache.capacity
    assert cache.get((0, 1, 0)) is None and cache.get((0, 1, 4)) is page  # oldest dropped
    cache.drop_partition(0)
    assert cache.get((0, 1, 4)) is None and cache.get((1, 1, 3)) is page
    PageCache(capacity=size).put((9, 9, 9), page)  # over a quarter: never cached
    cache.clear()
    assert cache.used == 0 and cache.get((1, 1, 3)) is None
