"""The write path (sarpd/core/writer.py): a `WriteTxn` over a real store and router
extends a segment in place, copies a branch's head into a segment of its own,
refills holes, checks what it is given, and commits everything as one batch (or
nothing, when it is not committed)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.memory import MemoryBackend
from sarpd.config import IndexConfig
from sarpd.core.delta import DELTA_PREFIX, apply_delta
from sarpd.core.ids import ns_tag, salt_ids, token_ids
from sarpd.core.index import SarpIndex
from sarpd.core.router import Router
from sarpd.core.routing import fingerprints
from sarpd.core.segment import LOG_PREFIX, SEG_PREFIX, Segment, decode_segment
from sarpd.core.store import Store
from sarpd.core.writer import WriteTxn, _by_window
from sarpd.errors import BadRequest, UnknownParent
from sarpd.model import (
    Clear,
    Insert,
    InsertResult,
    Match,
    MatchResult,
    Remove,
    RemoveResult,
    SeqSpec,
)

TINY = IndexConfig(segment_blocks=8, routing_points=2, refine_min_gap=1, refine_threshold=2,
                   prune_max_pred=1, window_cap=64)
BT = 16


def toks(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1 << 30, BT * n).astype(np.uint32)


class Box:
    def __init__(self, cfg: IndexConfig = TINY) -> None:
        self.backend = MemoryBackend()
        self.store = Store(self.backend, cfg)
        self.router = Router(cfg)

    def write(self, *ops: Insert | Remove | Clear,
              commit: bool = True) -> list[InsertResult | RemoveResult]:
        txn = WriteTxn(self.store, self.router)
        txn.prefetch(ops)
        out = [txn.apply(op) for op in ops]
        if commit:
            txn.commit(True)
        return out

    def segments(self) -> list[Segment]:
        """Every segment as stored: its value, with its delta records applied."""
        out = []
        for k, v in self.backend.scan(SEG_PREFIX, b"T"):
            seg = decode_segment(v)
            for _, d in self.backend.scan(DELTA_PREFIX + k[1:9], DELTA_PREFIX + k[1:9] + b"\xff"):
                seg = apply_delta(seg, d, "test")
            out.append(seg)
        return out

    def log(self) -> list[int]:
        """The segments the change log names, in order (a record names a batch's)."""
        return [int.from_bytes(v[i : i + 8], "big")
                for _, v in self.backend.scan(LOG_PREFIX, b"M") for i in range(0, len(v), 8)]


def insert(t: np.ndarray, meta: int | list[int] = 1, ns: str = "") -> Insert:
    m = np.array(meta, np.uint64) if isinstance(meta, list) else meta
    return Insert(0, SeqSpec(ns, tokens=t), meta=m)


def test_a_continuation_extends_its_segment_in_place() -> None:
    box = Box()
    t = toks(5, 1)
    assert box.write(insert(t[: 3 * BT], 1)) == [InsertResult(3, 3, 0)]
    assert box.write(insert(t, 2)) == [InsertResult(5, 2, 3)]
    [seg] = box.segments()
    assert seg.seg_id == 1 and seg.nblocks == 5 and seg.present_run(0) == 5
    assert seg.meta.tolist() == [1, 1, 1, 2, 2]  # the old blocks keep their meta
    assert (seg.ids == token_ids("", t, BT)).all()
    assert box.log() == [1, 1]  # created, then extended: same key
    assert box.store.counters.segments == 1 and box.store.counters.blocks == 5


def test_a_branch_gets_a_segment_with_a_copy_of_the_head() -> None:
    box = Box()
    t = toks(5, 2)
    box.write(insert(t, [10, 11, 12, 13, 14]))
    branch = np.concatenate([t[: 3 * BT], toks(2, 3)])
    assert box.write(insert(branch, 7)) == [InsertResult(5, 2, 3)]
    a, b = box.segments()
    assert (a.seg_id, b.seg_id) == (1, 2) and a.nblocks == b.nblocks == 5
    assert (b.ids[:3] == a.ids[:3]).all() and not (b.ids[3:] == a.ids[3:]).all()
    assert b.meta.tolist() == [10, 11, 12, 7, 7]  # the head's meta is copied
    assert a.meta.tolist() == [10, 11, 12, 13, 14]  # the original is untouched
    assert box.log() == [1, 2] and box.store.counters.blocks == 7


def test_holes_are_refilled_in_place() -> None:
    box = Box()
    t = toks(5, 4)
    box.write(insert(t, 1))
    assert box.write(Remove(0, seq=SeqSpec("", tokens=t), start=2)) == [RemoveResult(3)]
    [seg] = box.segments()
    assert seg.presence == 0b00011 and seg.nblocks == 5  # absent blocks keep their ids
    assert box.write(insert(t, 9)) == [InsertResult(5, 3, 2)]
    [seg] = box.segments()
    assert seg.presence == 0b11111 and seg.meta.tolist() == [1, 1, 9, 9, 9]
    assert box.store.counters.segments == 1 and box.store.counters.blocks == 5


def test_a_later_operation_sees_an_earlier_one_of_the_batch() -> None:
    box = Box()
    t = toks(6, 5)
    out = box.write(insert(t[: 2 * BT]), insert(t), insert(t))
    assert out == [InsertResult(2, 2, 0), InsertResult(6, 4, 2), InsertResult(6, 0, 6)]
    assert len(box.segments()) == 1


def test_what_is_not_committed_is_not_written() -> None:
    box = Box()
    box.write(insert(toks(3, 6)), commit=False)
    assert box.segments() == [] and box.store.counters.blocks == 0
    assert box.store.ns_blocks(ns_tag("")) == 0


def test_commit_counts_blocks_per_namespace() -> None:
    box = Box()
    box.write(insert(toks(3, 7), ns="a"), insert(toks(2, 8), ns="b"))
    assert box.store.ns_blocks(ns_tag("a")) == 3 and box.store.ns_blocks(ns_tag("b")) == 2
    assert Store(box.backend, TINY).ns_blocks(ns_tag("a")) == 3  # on the backend too


def test_clear_unsets_what_the_mask_selects() -> None:
    box = Box()
    box.write(insert(toks(3, 9), [0x100, 0x201, 0x102]), insert(toks(2, 10), 0x100, ns="b"))
    assert box.write(Clear(0, ns="", mask=0xF00, value=0x100)) == [RemoveResult(2)]
    seg = next(s for s in box.segments() if s.ns_tag == ns_tag(""))
    assert seg.presence == 0b010
    assert box.store.counters.blocks == 3  # namespace b is untouched


def test_a_parent_insert_continues_after_its_parent() -> None:
    box = Box()
    t = toks(4, 11)
    box.write(insert(t, 1))
    parent = salt_ids("", token_ids("", t, BT)[1:2])  # the external form of block 1
    op = Insert(0, SeqSpec("", tokens=toks(2, 12)), meta=5, parent=parent)
    assert box.write(op) == [InsertResult(2, 2, 0)]
    branch = box.segments()[1]
    assert branch.nblocks == 4 and (branch.ids[:2] == token_ids("", t, BT)[:2]).all()


def test_a_parent_removed_earlier_in_the_batch_is_unknown_then_refilled_known() -> None:
    """find_present's answer is kept for the batch (prefetch finds every parent first)
    only while the parent's window is unchanged: a removal earlier in the same batch
    makes the parent unknown, a re-insert of it (a refill) makes it known again."""
    box = Box()
    t = toks(4, 31)
    box.write(insert(t, 1))
    parent = salt_ids("", token_ids("", t, BT)[1:2])
    after = [Insert(0, SeqSpec("", tokens=toks(1, 32 + k)), meta=5, parent=parent)
             for k in range(2)]
    txn = WriteTxn(box.store, box.router)
    ops = [Remove(0, ids=parent), after[0], insert(t, 1), after[1]]
    txn.prefetch(ops)
    assert txn.apply(ops[0]) == RemoveResult(1)
    with pytest.raises(UnknownParent):
        txn.apply(ops[1])
    assert txn.apply(ops[2]) == InsertResult(4, 1, 1)  # block 1 refilled
    assert txn.apply(ops[3]) == InsertResult(1, 1, 0)
    txn.commit(True)
    assert box.store.counters.blocks == 5


def test_removing_two_siblings_at_one_offset_counts_both() -> None:
    """Blocks 2 (after 1) and 3 (a branch after 1) share window 0's offset 1; one
    remove of both takes both off, and the counters say so (found by the bridge's
    coalescing tests: the count was keyed by offset)."""
    box = Box()
    t = toks(2, 21)
    box.write(insert(t, 1))
    ids = token_ids("", t, BT)
    branch = Insert(0, SeqSpec("", tokens=toks(1, 22)), meta=1,
                    parent=salt_ids("", ids[:1]))
    assert box.write(branch) == [InsertResult(1, 1, 0)]
    sibling = box.segments()[1].ids[1:2]
    assert box.store.counters.blocks == 3
    both = np.concatenate([salt_ids("", ids[1:2]), salt_ids("", sibling)])
    both = np.concatenate([both, both[:1]])  # a block named twice counts once
    assert box.write(Remove(0, ids=both)) == [RemoveResult(2)]
    assert box.store.counters.blocks == 1


def test_the_inputs_are_checked() -> None:
    box = Box()
    txn = WriteTxn(box.store, box.router)
    with pytest.raises(BadRequest, match=r"meta: 2 values for 3 blocks \(need one per block\)"):
        txn.apply(insert(toks(3, 13), [1, 2]))
    bare = Box(IndexConfig(block_locators=False))
    txn = WriteTxn(bare.store, bare.router)
    with pytest.raises(BadRequest, match="parent: this index keeps no block locators"):
        txn.apply(Insert(0, SeqSpec("", tokens=toks(1, 1)), meta=0,
                         parent=np.zeros((1, 2), np.uint64)))


def test_an_insert_refills_the_copy_that_holds_a_removed_block() -> None:
    """A block removed everywhere has no locator, but its id stays in its segment: an
    insert that reaches it again refills that copy (its run goes on there) rather than
    settle at the block before it and lay the block out anew beside the absent copy,
    whose later blocks a match then never reaches. Regression: the insert's window was
    settled by "the next block is indexed nowhere", a proof about present blocks, for
    a run of ids (found after failed commits: the reload makes the block map exact,
    where a cleared block's stale entry had hidden the bug)."""
    cfg = IndexConfig(segment_blocks=8, routing_points=2, refine_min_gap=1,
                      refine_threshold=2, prune_max_pred=1, window_cap=2)
    ix = SarpIndex(MemoryBackend(), cfg, sync=False)

    def ids(hashes: list[int]) -> np.ndarray:
        return np.array([[h, 0] for h in hashes], np.uint64)

    def seq(hashes: list[int]) -> SeqSpec:
        return SeqSpec("", hashes=ids(hashes))

    def fp(h: int) -> int:  # a block's fingerprint at offset 4, as the filters hold it
        return int(fingerprints(salt_ids("", ids([h])), 0)[0])

    # branches off [1, 2, 3, 4] whose block 4 ties with block 5's fingerprint: the first
    # round of [1..5] reads them (the newest of equal agreement), not the segment of 5
    tied = [h for h in range(100, 400) if fp(h) == fp(5)][:2]
    ix.write_many([Insert(0, seq([1, 2, 3, 4, 5, 6, 7, 8]), meta=1)])
    ix.write_many([Insert(0, seq([1, 2, 3, 4, h]), meta=2) for h in tied])
    assert ix.write_many([Remove(0, seq=seq([1, 2, 3, 4, 5]), start=4)]) == [RemoveResult(1)]
    assert ix.store.indexed(salt_ids("", ids([5]))) == [False]  # present nowhere
    assert ix.write_many([Insert(0, seq([1, 2, 3, 4, 5]), meta=3)]) == [InsertResult(5, 1, 4)]
    [m] = ix.match_many([Match(0, seq([1, 2, 3, 4, 5, 6, 7, 8]))])
    assert isinstance(m, MatchResult) and m.blocks == 8  # blocks 6..8 were never removed
    assert m.meta.tolist() == [1, 1, 1, 1, 3, 1, 1, 1]
    assert ix.counters.segments == 3 and ix.check().problems == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-1, 40), st.integers(0, 2)), max_size=60))
def test_by_window_groups_located_blocks_as_a_dict_of_lists_would(
        located: list[tuple[int, int]]) -> None:
    """Blocks at random positions (-1: located nowhere) under a few head keys, in runs
    and interleaved: each (window, head key) is one group, in the order it first
    appears, its blocks in their order (offset in the window, id), every located block
    once."""
    sb = 8
    pos = np.array([p for p, _ in located], np.int64)
    heads = np.array([h for _, h in located], np.uint64)
    ids = np.arange(2 * len(located), dtype=np.uint64).reshape(-1, 2)
    want: dict[tuple[int, int], list[tuple[int, list[int]]]] = {}
    for i, (p, h) in enumerate(located):
        if p >= 0:
            want.setdefault((p // sb, h), []).append((p % sb, ids[i].tolist()))
    got = _by_window(ids, heads, pos, sb)
    assert got.keys == tuple(want)
    assert (int(got.ends[-1]) if len(got.ends) else 0) == sum(len(v) for v in want.values())
    assert len(got.offs) == len(got.ids) == int(np.count_nonzero(pos >= 0))
    for (w, h, offs, gids), (key, blocks) in zip(got.groups(), want.items(), strict=True):
        assert (w, h) == key
        assert list(zip(offs.tolist(), gids.tolist(), strict=True)) == blocks
