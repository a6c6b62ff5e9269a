"""Helpers of the BloomStore tests: small geometries (few keys per page, few
partitions) make every run cross many page flushes, log checkpoints and compactions;
random batches and a dict model to compare the store with."""

from __future__ import annotations

import random
from pathlib import Path

from bloomstore import BloomStore, Geometry, Tuning

ROOT = Path(__file__).resolve().parents[2]
SMALL = Geometry(partitions=4, keys_per_page=16, bits_per_key=10, hashes=7)
# no automatic checkpoint or compaction unless a test asks for them
QUIET = Tuning(page_bytes=4096, wal_bytes=1 << 30, compact_min_pages=0, fsync=False)


def be8(i: int) -> bytes:
    """`i` as 8 big-endian bytes (a sarp segment id or change-log version)."""
    return i.to_bytes(8, "big")


def random_batches(rng: random.Random, n: int, keyspace: int) -> list[tuple[dict[bytes, bytes],
                                                                              set[bytes]]]:
    out = []
    for _ in range(n):
        puts: dict[bytes, bytes] = {}
        deletes: set[bytes] = set()
        for _ in range(rng.randint(1, 12)):
            key = b"k%06d" % rng.randrange(keyspace)
            if rng.random() < 0.2:
                deletes.add(key)
                puts.pop(key, None)
            else:
                puts[key] = rng.randbytes(rng.randint(0, 60))
                deletes.discard(key)
        out.append((puts, deletes))
    return out


def apply(model: dict[bytes, bytes], puts: dict[bytes, bytes], deletes: set[bytes]) -> None:
    for key in deletes:
        model.pop(key, None)
    model.update(puts)


def assert_same(store: BloomStore, model: dict[bytes, bytes], keyspace: int) -> None:
    """Every key b"k%06d" below `keyspace` reads as in `model`, and a full scan is `model`."""
    keys = [b"k%06d" % i for i in range(keyspace)]
    assert store.get_many(keys) == [model.get(k) for k in keys]
    assert list(store.scan(b"", b"\xff")) == sorted(model.items())


def filled(path: Path, geometry: Geometry, keys: int) -> BloomStore:
    """A store of `keys` keys b"key%07d" (values b"v%d"), written in batches of 500."""
    store = BloomStore(path, geometry, QUIET)
    for start in range(0, keys, 500):
        store.write({b"key%07d" % i: b"v%d" % i for i in range(start, min(keys, start + 500))})
    return store
