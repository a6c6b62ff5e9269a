"""sarpd/core/bulk.py: a bulk build serves exactly what the same inserts would have,
on real engines; the locator runs sort on disk, the last write of a key winning."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from backends.base import WriteBatch
from sarpd.config import IndexConfig
from sarpd.core import bulk
from sarpd.core.bulk import BulkBuilder, Staging
from sarpd.core.index import SarpIndex
from sarpd.core.segment import LOCATOR, block_key
from sarpd.core.store import open_backend
from sarpd.errors import BadRequest
from sarpd.model import Insert, Match, MatchResult, Remove, SeqSpec

CFG = IndexConfig()
BT = CFG.block_tokens


def branchy(seed: int, n: int) -> list[Insert]:
    """Sessions on two hot system prompts in two namespaces: turns that extend a
    session, branches from inside an earlier turn (regenerate, edit), many siblings
    of one parent; token and hash sequences, one meta or one per block."""
    rng = np.random.default_rng(seed)
    prompts = [rng.integers(0, 500, BT * int(rng.integers(40, 90))).astype(np.uint32)
               for _ in range(2)]
    done: list[tuple[str, np.ndarray]] = []
    ops: list[Insert] = []
    for i in range(n):
        ns = ("", "tenant/a")[int(rng.integers(0, 2))]
        r = rng.random()
        if done and r < 0.5:  # branch inside (or extend) an earlier sequence
            ns, parent = done[int(rng.integers(0, len(done)))]
            cut = int(rng.integers(1, len(parent) + 1))
            toks = parent[:cut]
        else:
            toks = prompts[int(rng.integers(0, 2))]
        toks = np.concatenate([toks, rng.integers(0, 500, int(rng.integers(1, 700)))
                               ]).astype(np.uint32)
        done.append((ns, toks))
        nb = len(toks) // BT
        meta: int | np.ndarray = i if rng.random() < 0.7 else np.arange(nb, dtype=np.uint64) + i
        if rng.random() < 0.3:  # the caller's own 64-bit ids for the same blocks
            ids = np.zeros((nb, 2), np.uint64)
            ids[:, 0] = np.frombuffer(toks[: nb * BT].tobytes(), "<u8")[::8][:nb] + 1
            ops.append(Insert(i, SeqSpec(ns, hashes=ids), meta=meta))
        else:
            ops.append(Insert(i, SeqSpec(ns, tokens=toks), meta=meta))
    return ops


def queries(ops: list[Insert], seed: int) -> list[Match]:
    """Every inserted sequence, prefixes of it, and it with a changed block."""
    rng = np.random.default_rng(seed)
    out: list[Match] = []
    for op in ops:
        s = op.seq
        arr = s.tokens if s.tokens is not None else s.hashes
        assert arr is not None
        step = BT if s.tokens is not None else 1
        nb = len(arr) // step
        for cut in {nb, int(rng.integers(0, nb + 1)), int(rng.integers(0, nb + 1))}:
            part = arr[: cut * step].copy()
            if cut and rng.random() < 0.3:
                part[int(rng.integers(0, len(part)))] += 1  # a mismatch somewhere
            seq = SeqSpec(s.ns, tokens=part) if s.tokens is not None else SeqSpec(
                s.ns, hashes=part)
            out.append(Match(len(out), seq, with_ids=True))
    return out


def open_ix(root: Path, backend: str) -> SarpIndex:
    be = open_backend(backend, root / backend, cache_bytes=8 << 20)
    return SarpIndex(be, CFG, root / "snapshots" / backend)


def batches(ops: list[Insert], size: int = 16) -> list[list[Insert]]:
    return [ops[i:i + size] for i in range(0, len(ops), size)]


@pytest.mark.parametrize("backend", ["rocksdb", "wiredtiger"])
def test_import_serves_what_the_inserts_would(tmp_path: Path, backend: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bulk, "FLUSH_BYTES", 4096)  # many spills into the runs
    monkeypatch.setattr(bulk, "SEG_FILE_SIDS", 16)  # ... and many segment files
    ops = branchy(7, 160)
    builder = BulkBuilder(CFG, tmp_path / "work")
    for chunk in batches(ops):
        assert not any(isinstance(r, Exception) for r in builder.insert_many(chunk))
    be = open_backend(backend, tmp_path / "bulk" / backend, cache_bytes=8 << 20)
    report = builder.finish(be, tmp_path / "bulk" / "snapshots" / backend)
    be.close()
    assert not (tmp_path / "work").exists()
    assert report.blocks > 0 and report.locators >= report.blocks

    ref = open_ix(tmp_path / "ref", backend)
    ref.recover()
    for chunk in batches(ops):
        ref.write_many(chunk)
    ref.snapshot()
    ref.close()

    ix, ref = open_ix(tmp_path / "bulk", backend), open_ix(tmp_path / "ref", backend)
    rep = ix.recover()
    assert not rep.full_scan and rep.segments_rerouted == 0  # the snapshot is whole
    ref.recover()
    assert ix.counters == ref.counters and ix.counters.blocks == report.blocks
    assert ix.dir.entries == ref.dir.entries == report.routing_points
    qs = queries(ops, 1)
    got, want = ix.match_many(qs), ref.match_many(qs)
    matched = 0
    for g, w in zip(got, want, strict=True):
        assert isinstance(g, MatchResult) and isinstance(w, MatchResult)
        assert g.blocks == w.blocks
        assert g.meta.tolist() == w.meta.tolist()
        assert g.ids is not None and w.ids is not None
        assert g.ids.tolist() == w.ids.tolist()
        matched += g.blocks
    assert matched > 0
    for one in (ix, ref):
        assert one.check().clean, one.check().problems
    assert report.segments > report.blocks / CFG.segment_blocks  # branches made copies
    # both keep working as live indexes: removal by bare id reads the ingested locators
    victim = got[0]
    assert isinstance(victim, MatchResult) and victim.ids is not None and victim.blocks > 3
    rm = Remove(0, ns=qs[0].seq.ns, ids=victim.ids[2:4])
    removed = ix.write_many([rm])
    assert removed == ref.write_many([rm]) and removed[0].removed == 2  # type: ignore[union-attr]
    assert [r.blocks for r in ix.match_many(qs)] == [  # type: ignore[union-attr]
        r.blocks for r in ref.match_many(qs)]  # type: ignore[union-attr]
    ix.close()
    ref.close()


def test_locator_runs_sort_on_disk_last_write_wins(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bulk, "FLUSH_BYTES", 1000)
    st = Staging(tmp_path / "w")
    rng = np.random.default_rng(3)
    ids = [rng.bytes(16) for _ in range(3000)] + [bytes(16), b"\xff" * 16]
    want: dict[bytes, bytes] = {}
    for rnd in range(3):  # each key written up to three times, in separate batches
        wb = WriteBatch()
        for i, idb in enumerate(ids):
            if rnd == 0 or i % (rnd + 2) == 0:
                v = bytes([rnd]) * 12
                wb.put(block_key(idb), v)
                want[block_key(idb)] = v
        wb.put(b"S" + rnd.to_bytes(8, "big"), b"seg%d" % rnd)
        wb.put(b"L" + rnd.to_bytes(8, "big"), b"dropped")
        wb.put(b"A", b"below the locators")
        st.write(wb, False)
    want.update({b"A": b"below the locators"})
    want.update({b"S" + r.to_bytes(8, "big"): b"seg%d" % r for r in range(3)})
    assert len(list((tmp_path / "w").glob("locators-*.run"))) > 200
    items = list(st.sorted_items())
    assert [k for k, _ in items] == sorted(want)
    assert dict(items) == want
    assert st.log_records == 3
    assert not list((tmp_path / "w").glob("locators-*.run"))  # each run deleted once read
    st.close()
    assert not (tmp_path / "w").exists()


def test_bulk_build_refuses_what_it_cannot_stage(tmp_path: Path) -> None:
    builder = BulkBuilder(CFG, tmp_path / "w")
    ids = np.ones((1, 2), np.uint64)
    with pytest.raises(BadRequest, match="parent"):
        builder.insert_many([Insert(0, SeqSpec("", hashes=ids), meta=1, parent=ids)])
    # locators are spilled, not kept: a lookup cannot prove a block absent, so it
    # answers "may be indexed" (exact matching then reads its rounds)
    assert builder.staging.get_many([block_key(bytes(16))]) == [LOCATOR.pack(0, 0)]
    builder.close()


def test_segment_files_keep_the_last_value_in_id_order(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bulk, "SEG_FILE_SIDS", 4)
    st = Staging(tmp_path / "w")
    want: dict[bytes, bytes] = {}
    for rnd in range(3):
        wb = WriteBatch()
        for sid in range(rnd, 3000, rnd + 1):  # rewrites, in files of 4 ids
            wb.put(b"S" + sid.to_bytes(8, "big"), b"v%d-%d" % (sid, rnd) * (1 + sid % 5))
            want[b"S" + sid.to_bytes(8, "big")] = b"v%d-%d" % (sid, rnd) * (1 + sid % 5)
        st.write(wb, False)
    gone = b"S" + (7).to_bytes(8, "big")
    wb = WriteBatch()
    wb.delete(gone)
    st.write(wb, False)
    del want[gone]
    keys = [b"S" + sid.to_bytes(8, "big") for sid in (0, 7, 8, 2999, 3000)]
    assert st.get_many(keys) == [want.get(k) for k in keys]
    assert list(st.scan(b"S", b"T")) == sorted(want.items())
    assert st.items_total == len(want)
    assert list(st.sorted_items()) == sorted(want.items())
    assert not list((tmp_path / "w").glob("segments-*.log"))  # each file deleted once read
    st.close()
