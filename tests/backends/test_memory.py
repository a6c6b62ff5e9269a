"""backends/memory.py: what the contract suite does not show of the oracle backend:
nothing survives close, a scan sees the range as of its first item, stats count."""

from __future__ import annotations

import pytest

from backends.errors import BackendIOError
from backends.memory import MemoryBackend
from tests.backends.helpers import batch_of, put_all


def test_nothing_survives_close() -> None:
    backend = MemoryBackend()
    put_all(backend, [(b"a", b"1")], sync=True)
    assert backend.persistent is False
    backend.close()
    with pytest.raises(BackendIOError, match="get_many after close"):
        backend.get_many([b"a"])
    with pytest.raises(BackendIOError, match="sync after close"):
        backend.sync()
    assert MemoryBackend().get_many([b"a"]) == [None]
    assert backend.stats()["open"] == 0 and backend.stats()["estimate_num_keys"] == 0


def test_scan_takes_its_snapshot_at_the_first_item() -> None:
    backend = MemoryBackend()
    put_all(backend, [(b"a", b"1"), (b"b", b"2")], sync=False)
    started = backend.scan(b"", b"\xff")
    not_started = backend.scan(b"", b"\xff")
    assert next(started) == (b"a", b"1")
    backend.write(batch_of({b"c": b"3"}, deletes=[b"b"]), sync=False)
    assert list(started) == [(b"b", b"2")]  # as of the first item
    assert list(not_started) == [(b"a", b"1"), (b"c", b"3")]  # as of now


def test_values_are_copied_and_stats_count() -> None:
    backend = MemoryBackend()
    value = bytearray(b"abc")
    backend.write(batch_of({b"k": value}), sync=False)  # type: ignore[dict-item]
    value[0] = ord("z")
    assert backend.get_many([b"k"]) == [b"abc"]
    backend.write(batch_of({b"l": b"12345"}), sync=True)
    stats = backend.stats()
    assert stats["backend"] == "memory" and stats["disk_bytes"] == 0
    assert (stats["estimate_num_keys"], stats["value_bytes"], stats["write_batches"]) == (2, 8, 2)
    backend.resume()  # nothing to do
    assert backend.get_many([b"l"]) == [b"12345"]
