"""The store (sarpd/core/store.py): backend errors mapped once, the decoded-segment
cache (LRU, committed segments only), counters and namespace counts, activity
counters, the one sequence -> ids rule, and `open_backend`."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest

from backends import errors as be_errors
from backends.base import WriteBatch
from backends.memory import MemoryBackend
from sarpd.config import IndexConfig
from sarpd.core import native
from sarpd.core import store as store_mod
from sarpd.core.ids import chain_ids, id_bytes, ns_root, salt_ids, token_ids
from sarpd.core.segment import (
    COUNTERS_KEY,
    Counters,
    Segment,
    encode_segment,
    ns_count_key,
    seg_key,
)
from sarpd.core.store import Activity, Store, open_backend
from sarpd.errors import (
    ConfigError,
    CorruptData,
    FormatVersionError,
    SarpError,
    StorageError,
    TooLarge,
)
from sarpd.model import SeqSpec

CFG = IndexConfig()
MAPPED = [(be_errors.BackendIOError, StorageError), (be_errors.BackendCorrupt, CorruptData),
          (be_errors.BackendFormatError, FormatVersionError),
          (be_errors.BackendConfigError, ConfigError)]


class Failing(MemoryBackend):
    """A memory backend whose calls raise `error` while it is set; with `bad`, a
    multi-get of more than one key fails and so does each key listed in it."""

    def __init__(self) -> None:
        super().__init__()
        self.error: Exception | None = None
        self.bad: set[bytes] = set()
        self.gets = 0

    def _maybe(self) -> None:
        if self.error is not None:
            raise self.error

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        self._maybe()
        self.gets += 1
        if self.bad and (len(keys) > 1 or keys[0] in self.bad):
            raise be_errors.BackendCorrupt(f"page of {keys[0]!r}: checksum mismatch")
        return super().get_many(keys)

    def write(self, batch: WriteBatch, sync: bool) -> None:
        self._maybe()
        super().write(batch, sync)

    def scan(self, start: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        for i, item in enumerate(super().scan(start, end)):
            if i == 1:
                self._maybe()  # mid-iteration
            yield item

    def resume(self) -> None:
        self._maybe()

    def stats(self) -> dict[str, int | float | str]:
        self._maybe()
        return super().stats()


def seg(sid: int, n: int = 3) -> Segment:
    return Segment(sid, 0, (1 << n) - 1, 0, np.full((n, 2), sid, np.uint64),
                   np.arange(n, dtype=np.uint64))


def put_segments(be: MemoryBackend, sids: list[int]) -> None:
    wb = WriteBatch()
    for s in sids:
        wb.put(seg_key(s), encode_segment(seg(s)))
    be.write(wb, True)


@pytest.mark.parametrize("theirs,ours", MAPPED)
def test_every_backend_error_is_mapped_with_its_cause(theirs: type[Exception],
                                                      ours: type[SarpError]) -> None:
    be = Failing()
    st = Store(be, CFG)
    put_segments(be, [1, 2, 3])
    be.error = theirs("engine says no")
    calls = [lambda: st.get_many([b"x"]), lambda: st.write(WriteBatch(), True),
             lambda: list(st.scan(b"S", b"T")), st.resume, st.backend_stats]
    for call in calls:
        with pytest.raises(ours, match=r"^engine says no$") as err:
            call()
        assert type(err.value) is ours and err.value.__cause__ is be.error


def test_sarp_errors_pass_through_unchanged() -> None:
    be = Failing()
    st = Store(be, CFG)
    be.error = StorageError("disk full")
    with pytest.raises(StorageError) as err:
        st.write(WriteBatch(), True)
    assert err.value is be.error


def test_open_backend_maps_and_opens(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    be = open_backend("memory", tmp_path / "m", cache_bytes=0)
    assert be.name == "memory" and Store(be, CFG).counters == Counters()
    with pytest.raises(SarpError, match="backend 'nope' is not known"):
        open_backend("nope", tmp_path / "n", cache_bytes=0)

    def bad_tunable(name: str, path: Path, *, cache_bytes: int, direct_io: bool = False) -> None:
        raise be_errors.BackendConfigError("cache_bytes: -1 is below 0")

    monkeypatch.setattr("backends.registry.open_backend", bad_tunable)
    with pytest.raises(ConfigError, match="cache_bytes: -1 is below 0") as err:
        open_backend("rocksdb", tmp_path / "r", cache_bytes=-1)
    assert isinstance(err.value.__cause__, be_errors.BackendConfigError)


def test_the_cache_is_lru_and_counts_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_mod, "SEGMENT_CACHE", 3)
    be = Failing()
    st = Store(be, CFG)
    put_segments(be, [1, 2, 3, 4])
    assert sorted(st.fetch([1, 2, 3])) == [1, 2, 3]
    assert st.activity.segment_reads == 3
    gets = be.gets
    st.fetch([1])  # from memory: no read, and 1 is now the most recent
    assert be.gets == gets and st.activity.segment_reads == 3
    st.fetch([4])  # evicts 2, the least recently used
    assert [sid for sid, _ in st.cached_segments()] == [3, 1, 4]
    st.forget_segments()
    assert st.cached_segments() == []


def test_a_fetch_of_more_than_the_cache_keeps_the_most_recent(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_mod, "SEGMENT_CACHE", 3)
    be = Failing()
    st = Store(be, CFG)
    put_segments(be, list(range(1, 9)))
    st.fetch([1, 2])
    got = st.fetch([2, 3, 4, 5, 99, 6])  # 2 from memory, 99 missing: 3..6 read, in order
    assert sorted(got) == [2, 3, 4, 5, 6, 99] and got[99] is None
    assert [sid for sid, _ in st.cached_segments()] == [4, 5, 6]  # each one trimmed alike
    assert st.activity.segment_reads == 2 + 5


def test_missing_and_corrupt_segments_are_none_and_counted() -> None:
    be = Failing()
    st = Store(be, CFG)
    put_segments(be, [1])
    wb = WriteBatch()
    wb.put(seg_key(2), encode_segment(seg(2))[:-1])  # torn
    be.write(wb, True)
    got = st.fetch([1, 2, 3])
    assert got[1] is not None and got[2] is None and got[3] is None
    assert st.activity.corrupt_segments == 1
    assert [sid for sid, _ in st.cached_segments()] == [1]  # nothing bad is cached
    assert list(st.read([1, 2, 3])) == [1]


@pytest.mark.parametrize("kernels", ["native", "reference"])
def test_read_views_caches_what_it_reads_as_fetch_does(kernels: str) -> None:
    """The match kernel's read of its misses: sound values cached (as stored values by
    the kernel's own cache), missing and corrupt ones left out and counted as `fetch`
    counts them; what Python code then gets from the cache is the decoded segment."""
    k = native.pick(reference=kernels == "reference")
    be = Failing()
    st = Store(be, CFG, kernels=k)
    put_segments(be, [1, 4])
    wb = WriteBatch()
    wb.put(seg_key(2), encode_segment(seg(2))[:-1])  # torn
    be.write(wb, True)
    got = st.read_views([1, 2, 3, 4])
    assert list(got) == [1, 4]
    assert st.activity.corrupt_segments == 1 and st.activity.segment_reads == 4
    assert [sid for sid, _ in st.cached_segments()] == [1, 4]
    assert encode_segment(st.fetch([4])[4] or seg(0)) == encode_segment(seg(4))
    be.bad = {seg_key(5)}  # an engine page fails its checksum: only its segment is lost
    put_segments(be, [5, 6])
    assert list(st.read_views([5, 6])) == [6] and st.activity.corrupt_segments == 2


def test_a_corrupt_engine_page_costs_only_its_segments() -> None:
    be = Failing()
    st = Store(be, CFG)
    put_segments(be, [1, 2, 3])
    be.bad = {seg_key(2)}
    got = st.fetch([1, 2, 3])
    assert got[1] is not None and got[2] is None and got[3] is not None
    assert st.activity.corrupt_segments == 1


def test_commit_makes_memory_follow_the_disk() -> None:
    be = MemoryBackend()
    st = Store(be, CFG)
    assert st.counters == Counters() and st.ns_blocks(5) == 0
    wb = WriteBatch()
    new = Counters(3, 2, 10, 2)
    wb.put(COUNTERS_KEY, new.encode())
    wb.put(ns_count_key(5), (10).to_bytes(8, "little"))
    st.commit(wb, True, new, {5: 10}, [seg(1), seg(2)])
    assert st.counters == new and st.ns_blocks(5) == 10
    assert [sid for sid, _ in st.cached_segments()] == [1, 2]
    reopened = Store(be, CFG)  # what was committed is on the backend
    assert reopened.counters == new and reopened.ns_blocks(5) == 10
    writes = be.stats()
    st.commit(WriteBatch(), True, new)  # an empty batch is not written
    assert be.stats() == writes
    st.reset()
    assert st.cached_segments() == [] and st.counters == new


def test_seq_ids_is_the_one_rule() -> None:
    st = Store(MemoryBackend(), IndexConfig(max_sequence_tokens=64))
    toks = np.arange(64, dtype=np.uint32)
    assert (st.seq_ids(SeqSpec("a", tokens=toks)) == token_ids("a", toks, 16)).all()
    parent = id_bytes(token_ids("a", toks, 16)[0])
    chained = st.seq_ids(SeqSpec("a", tokens=toks[16:]), parent)
    assert (chained == token_ids("a", toks, 16)[1:]).all()
    assert (chained == chain_ids(parent, toks[16:], 16)).all()
    assert not (st.seq_ids(SeqSpec("b", tokens=toks)) == chain_ids(ns_root("a"), toks, 16)).all()
    hashes = np.array([[1, 0], [2, 0]], dtype=np.uint64)
    assert (st.seq_ids(SeqSpec("a", hashes=hashes)) == salt_ids("a", hashes)).all()
    with pytest.raises(TooLarge, match=r"tokens: 65 tokens exceeds max_sequence_tokens \(64\)"):
        st.seq_ids(SeqSpec("a", tokens=np.arange(65, dtype=np.uint32)))


def test_a_loader_reads_only_what_its_cache_lacks() -> None:
    be = Failing()
    st = Store(be, CFG)
    put_segments(be, [1, 2])
    cache: dict[int, Segment | None] = {7: seg(7)}
    load = st.loader(cache)
    got = load([7, 1, 1, 9])
    assert got is cache and set(cache) == {7, 1, 9} and cache[9] is None
    reads = st.activity.segment_reads
    load([1, 7])
    assert st.activity.segment_reads == reads == 2


def test_activity_has_the_fields_the_daemon_reads() -> None:
    assert [f.name for f in dataclasses.fields(Activity)] == [
        "matches", "matched_blocks", "queried_blocks", "segment_reads", "corrupt_segments",
        "write_batches", "extra_rounds", "locator_reads"]
    assert not hasattr(Activity(), "__dict__")  # slotted


@pytest.mark.parametrize("references", [False, True])
def test_seq_ids_many_is_seq_ids_of_each_in_one_call(references: bool) -> None:
    """Token sequences of a batch are hashed in one call; hashes are salted; a sequence
    over max_sequence_tokens gets its TooLarge in its place, the others their ids."""
    from sarpd.core import native
    from sarpd.errors import TooLarge

    st = Store(MemoryBackend(), IndexConfig(max_sequence_tokens=64),
               native.pick(reference=references))
    rng = np.random.default_rng(5)
    seqs = [SeqSpec("a", tokens=rng.integers(0, 1 << 32, 40, dtype=np.uint64).astype(np.uint32)),
            SeqSpec("b", hashes=rng.integers(0, 1 << 63, (3, 2), dtype=np.uint64)),
            SeqSpec("a", tokens=np.zeros(65, np.uint32)),  # one token over the limit
            SeqSpec("", tokens=np.zeros(7, np.uint32)),  # no whole block
            SeqSpec("c", tokens=rng.integers(0, 9, 64, dtype=np.uint64).astype(np.uint32))]
    got = st.seq_ids_many(seqs)
    assert len(got) == len(seqs)
    for seq, q in zip(seqs, got, strict=True):
        if seq.tokens is not None and len(seq.tokens) > 64:
            assert isinstance(q, TooLarge) and "max_sequence_tokens (64)" in str(q)
            continue
        assert isinstance(q, np.ndarray)
        want = st.seq_ids(seq)
        assert q.shape == want.shape and (q == want).all()
    assert [len(q) for q in got if isinstance(q, np.ndarray)] == [2, 3, 0, 4]
    assert st.seq_ids_many([]) == []
