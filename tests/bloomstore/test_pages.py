"""bloomstore/pages.py: the KV page layout (encode, verify, look up), the page
cache and the cut of a buffer into pages; a corrupt page is never served."""

from __future__ import annotations

from pathlib import Path

import pytest

from bloomstore import (
    BloomStore,
    CorruptionError,
    Tuning,
)
from tests.bloomstore.helpers import (
    QUIET,
    SMALL,
)


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
