"""sarpd/indexer/ingest.py: vLLM events (encoded with vLLM's schema by msgspec; SGLang's
salt too) -> sarp requests keyed by tokens: ids, parents, holders, tiers, skips
(Dynamo's), the batch's rank, clears, and the engine maps' journal; then applied to a
real index, the answer walked as Dynamo walks it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.registry import backend_names
from sarpd import model
from sarpd.config import IndexConfig
from sarpd.events.mapping import WORKER_MASK
from sarpd.events.schema import EventBatch, decode_batch
from sarpd.indexer import api, hashing
from sarpd.indexer.ingest import DEVICE, HOST, Entry, Ingest, holder
from sarpd.indexer.workers import Registry, Worker, namespace
from tests.core.test_index import Harness
from tests.events import sglang_schema as sg
from tools.bench import vllm_schema as vs

T = list(range(7000, 7000 + 8 * 16))
IDS = [900000 + i for i in range(8)]
NS = namespace("m", "default")


def batch(*events: vs.KVCacheEvent, rank: int | None = 0) -> EventBatch:
    return decode_batch(vs.encode_events(list(events), rank=rank), tokens=True)


def dev(a: int, b: int, medium: str | None = "GPU", **kw: object) -> vs.BlockStored:
    return vs.block_stored(IDS[a:b], IDS[a - 1] if a else None, T[16 * a:16 * b], 16,
                           medium=medium, **kw)


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def __call__(self) -> int:
        self.n += 1
        return self.n


def setup() -> tuple[Ingest, Worker, Counter]:
    reg = Registry(16)
    w = reg.register("m", "default", 1, 0, 16, "tcp://h:1", None)
    return Ingest(reg), w, Counter()


def ids_of(a: int, b: int, lora: str | None = None, salt: str | None = None) -> np.ndarray:
    local = hashing.local_hashes(np.array(T, np.uint32), 16, hashing.seed_of(lora, salt))
    return hashing.chain(hashing.root(NS), local)[a:b]


def test_a_chain_its_continuation_a_lower_tier_and_removals() -> None:
    ing, w, nid = setup()
    ops = ing.batch(w, batch(dev(0, 3), dev(3, 5, medium="CPU")), nid)
    assert [type(o) for o in ops] == [model.Insert, model.Insert]
    first, cpu = ops
    assert isinstance(first, model.Insert) and isinstance(cpu, model.Insert)
    assert first.parent is None and first.add_holder and first.meta == holder(w.slot, DEVICE)
    assert first.seq.hashes is not None and np.array_equal(first.seq.hashes, ids_of(0, 3))
    assert cpu.parent is not None and np.array_equal(cpu.parent[0], ids_of(2, 3)[0])
    assert cpu.seq.hashes is not None and np.array_equal(cpu.seq.hashes, ids_of(3, 5))
    assert cpu.meta == holder(w.slot, HOST)
    rm = ing.batch(w, batch(vs.block_removed(IDS[4:5], medium="CPU"),
                            vs.block_removed(IDS[2:3], medium="CPU")), nid)  # not on CPU: no op
    assert len(rm) == 1 and isinstance(rm[0], model.Remove)
    assert rm[0].meta == holder(w.slot, HOST) and rm[0].ids is not None
    assert np.array_equal(rm[0].ids, ids_of(4, 5)) and ing.skipped["unknown_block"] == 1
    blocks = ing.maps[w.slot].blocks
    assert {h: (e[1], e[3], e[4]) for h, e in blocks.items()} == {
        IDS[0]: (1, None, 0), IDS[1]: (1, IDS[0], 1), IDS[2]: (1, IDS[1], 2),
        IDS[3]: (2, IDS[2], 3)}  # IDS[4] gone with its only tier
    local = hashing.local_hashes(np.array(T, np.uint32), 16, hashing.seed_of(None, None))
    assert [blocks[h][2] for h in IDS[:4]] == local[:4].tolist()
    assert [r[0] for r in ing.journal] == ["add", "add", "drop", "drop"]
    again = Ingest(ing.registry)  # the journal replayed (what a restart reads back)
    again.load(list(ing.journal))
    assert again.maps[w.slot].blocks == blocks and again.maps[w.slot].lower == 1
    assert not again.journal


def test_skips_as_dynamo_skips() -> None:
    ing, w, nid = setup()
    events = [dev(0, 1, medium="HBM"), dev(0, 1, medium="cpu"), dev(0, 1, group_idx=1),
              dev(0, 1, locality="REMOTE"), dev(0, 1, ownership="CPU"),
              vs.block_stored(IDS[:1], None, T[:8], 8), dev(1, 2),  # parent unknown
              vs.block_stored(IDS[:1], None, [], 16)]
    assert ing.batch(w, batch(*events), nid) == []
    assert dict(ing.skipped) == {"medium": 2, "group": 1, "remote": 1, "ownership": 1,
                                 "block_size": 1, "unknown_parent": 1, "empty": 1}
    ing.batch(w, batch(dev(0, 1, medium="CPU")), nid)  # a device store's parent must be on GPU
    assert ing.batch(w, batch(dev(1, 2)), nid) == [] and ing.skipped["unknown_parent"] == 2
    assert len(ing.batch(w, batch(dev(1, 2, medium="DISK")), nid)) == 1  # a lower tier's may


def test_lora_salt_and_block_count() -> None:
    ing, w, nid = setup()
    salted = dev(0, 2, lora_name="L", extra_keys=[("L", "dynamo-cache-salt:s"), None])
    short = vs.block_stored(IDS[4:7], None, T[:40], 16)  # 3 hashes, 2.5 blocks of tokens
    a, b = ing.batch(w, batch(salted, short), nid)
    assert isinstance(a, model.Insert) and isinstance(b, model.Insert)
    assert a.seq.hashes is not None and np.array_equal(a.seq.hashes, ids_of(0, 2, "L", "s"))
    assert b.seq.hashes is not None and len(b.seq.hashes) == 2


def test_a_continuation_takes_its_parent_s_salt_except_on_disk() -> None:
    """Dynamo's rule (the conformance test found it): the salt of block 0 carries down
    the chain on the device and host tiers, not to a disk store; a continuation's own
    salt key wins; a LoRA name is each store's own."""
    ing, w, nid = setup()
    salted = [("dynamo-cache-salt:s",), None]
    ops = ing.batch(w, batch(dev(0, 2, extra_keys=salted), dev(2, 3), dev(3, 4, medium="CPU"),
                             dev(4, 5, medium="DISK")), nid)
    got = [o.seq.hashes for o in ops if isinstance(o, model.Insert)]
    assert len(got) == 4 and all(g is not None for g in got)
    assert np.array_equal(np.concatenate(got[:3]), ids_of(0, 4, salt="s"))
    unsalted_disk = hashing.chain(ids_of(3, 4, salt="s")[0].astype("<u8").tobytes(),
                                  hashing.local_hashes(np.array(T[64:80], np.uint32), 16,
                                                       hashing.seed_of(None, None)))
    assert np.array_equal(got[3], unsalted_disk)
    (own,) = ing.batch(w, batch(dev(3, 4, extra_keys=[("dynamo-cache-salt:t",)])), nid)
    assert isinstance(own, model.Insert) and own.seq.hashes is not None
    t_local = hashing.local_hashes(np.array(T[48:64], np.uint32), 16, hashing.seed_of(None, "t"))
    assert np.array_equal(own.seq.hashes, hashing.chain(
        ids_of(2, 3, salt="s")[0].astype("<u8").tobytes(), t_local))


def test_sglang_s_salt_by_name_keys_as_dynamo_s_marker() -> None:
    """SGLang sends its salt by name (Dynamo reads it as the namespace): the same keys
    as vLLM's marked salt. tests/events/sglang_schema.py: SGLang's current structs."""
    ing, w, nid = setup()
    ev = sg.V4.BlockStored(IDS[0:2], None, T[:32], 16, None, "GPU", cache_salt="s")
    (op,) = ing.batch(w, decode_batch(sg.encode(sg.V4.EventBatch(1.0, [ev], 0)), tokens=True),
                      nid)  # fmt: skip
    assert isinstance(op, model.Insert) and op.seq.hashes is not None
    assert np.array_equal(op.seq.hashes, ids_of(0, 2, salt="s"))


def test_a_batch_s_rank_names_the_worker_and_clears_are_per_rank() -> None:
    ing, w, nid = setup()
    (op,) = ing.batch(w, batch(dev(0, 1), rank=3), nid)
    other = ing.registry.workers[("m", "default", 1, 3)]
    assert other.endpoint is None and isinstance(op, model.Insert)
    assert op.meta == holder(other.slot, DEVICE) != holder(w.slot, DEVICE)
    (clear,) = ing.batch(w, batch(vs.AllBlocksCleared(), rank=3), nid)
    assert isinstance(clear, model.Clear)  # requests compare by identity (eq=False)
    assert (clear.ns, clear.mask, clear.value) == (NS, WORKER_MASK, other.slot << 48)
    assert not ing.maps[other.slot].blocks and ing.journal[-1] == ("clear", other.slot)


@pytest.mark.parametrize("backend_name", backend_names())
def test_applied_to_an_index_the_walk_is_dynamo_s(backend_name: str, tmp_path: Path) -> None:
    """Dynamo's F2.1 table, through the index and `spans`: dev[0,2) cpu[2,3) disk[2,5)
    gives gpu 32, cpu 48, disk 80; a second instance with a hole in its CPU run."""
    ing, w, nid = setup()
    w2 = ing.registry.register("m", "default", 2, 0, 16, "tcp://h:2", None)
    h = Harness(backend_name, IndexConfig(), tmp_path)
    ix = h.ix
    try:
        ops = ing.batch(w, batch(dev(0, 2), dev(2, 3, medium="CPU"),
                                 vs.block_stored(IDS[2:5], IDS[1], T[32:80], 16,
                                                 medium="DISK")), nid)
        ops += ing.batch(w2, batch(dev(0, 2), dev(3, 5, medium="CPU")), nid)  # no parent: skip
        ops += ing.batch(w2, batch(dev(2, 3, medium="STORAGE")), nid)
        for r in ix.write_many(ops):
            assert not isinstance(r, Exception), r
        (res,) = ix.match_many([model.Match(0, model.SeqSpec(NS, hashes=ids_of(0, 8)),
                                            spans=True)])
        assert isinstance(res, model.MatchResult) and res.spans is not None
        ranks = {w.slot: (1, 0), w2.slot: (2, 0)}
        assert api.answer(api.reach(res.spans, ranks), 16)["instances"] == {
            "1": {"longest_matched": 80, "gpu": 32, "dp": {"0": 32}, "cpu": 48, "disk": 80},
            "2": {"longest_matched": 48, "gpu": 32, "dp": {"0": 32}, "cpu": 32, "disk": 48}}
    finally:
        ix.close()


def _brute_add(blocks: dict[int, Entry], hashes: tuple[int, ...], raw: bytes, tier: int,
               local: list[int], parent: int | None, pos: int, salt: int) -> None:
    for i, h in enumerate(hashes):  # block by block, as the map's first version
        was = blocks[h][1] if h in blocks else 0
        blocks[h] = (raw[16 * i:16 * i + 16], was | 1 << tier, local[i], parent, pos + i, salt)
        parent = h


def _brute_drop(blocks: dict[int, Entry], hashes: tuple[int, ...], tier: int) -> list[bytes]:
    out = []
    for h in hashes:
        if h in blocks and blocks[h][1] & 1 << tier:
            e = blocks[h]
            out.append(e[0])
            left = e[1] & ~(1 << tier)
            if left:
                blocks[h] = (e[0], left, *e[2:])
            else:
                del blocks[h]
    return out


_OPS = st.lists(st.one_of(
    st.tuples(st.just("add"), st.lists(st.integers(0, 7), min_size=1, max_size=6),
              st.integers(0, 2), st.one_of(st.none(), st.integers(0, 7)), st.integers(0, 9)),
    st.tuples(st.just("drop"), st.lists(st.integers(0, 7), max_size=6), st.integers(0, 2)),
    st.tuples(st.just("clear"))), max_size=30)


@settings(max_examples=300, deadline=None)
@given(ops=_OPS)
def test_the_map_is_the_block_by_block_model_and_its_journal_replays_it(
        ops: list[tuple[Any, ...]]) -> None:
    """Adds (new blocks, known ones, repeated hashes, lower tiers), drops and clears:
    the same blocks, ids dropped and `lower` as a block-by-block model; the journal,
    replayed by `load` (through msgpack, as saved), gives the same map."""
    reg = Registry(16)
    ing = Ingest(reg)
    m = ing.engine_map(0)
    want: dict[int, Entry] = {}
    for k, op in enumerate(ops):
        if op[0] == "add":
            hashes = tuple(op[1])
            raw = bytes(range(k, k + 16 * len(hashes)))
            local = [h * 3 + k for h in hashes]
            m.add(hashes, raw, op[2], local, op[3], op[4], k)
            _brute_add(want, hashes, raw, op[2], local, op[3], op[4], k)
        elif op[0] == "drop":
            assert m.drop(tuple(op[1]), op[2]) == _brute_drop(want, tuple(op[1]), op[2])
        else:
            m.clear()
            want.clear()
        assert m.blocks == want
        assert m.lower == sum(e[1] > 1 for e in want.values())
    again = Ingest(reg)
    again.load(msgpack.unpackb(msgpack.packb(ing.journal), use_list=False))
    assert again.engine_map(0).blocks == want and not again.journal
