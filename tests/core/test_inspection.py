"""`dump` (sarpd/core/inspection.py): per window, the routing probes, the candidates a
match reads and their decoded contents with the verified run (a branch's too); it
stops after the first window without a candidate, and changes nothing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.base import WriteBatch
from backends.memory import MemoryBackend
from sarpd.config import IndexConfig
from sarpd.core.ids import chain_ids, id_bytes, salt_ids, token_ids
from sarpd.core.index import SarpIndex
from sarpd.core.inspection import branches, chain_starts, dump_or_error, dump_sequence
from sarpd.core.segment import seg_key
from sarpd.errors import SarpError, TooLarge
from sarpd.model import Insert, Match, MatchResult, Remove, SeqSpec, ids_to_bytes


def toks(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 1 << 30, 16 * n + 5).astype(np.uint32)


def index(cfg: IndexConfig | None = None) -> SarpIndex:
    ix = SarpIndex(MemoryBackend(), cfg or IndexConfig())
    ix.recover()
    return ix


def test_dump_of_an_indexed_sequence() -> None:
    ix = index()
    t = toks(100, 1)
    ix.write_many([Insert(0, SeqSpec("t", tokens=t[: 16 * 90]), meta=7)])
    stats = ix.stats()
    out = dump_sequence(ix, SeqSpec("t", tokens=t))
    assert (out["ns"], out["blocks"], out["matched_blocks"], out["truncated"]) == ("t", 100, 90,
                                                                                 False)
    w0, w1 = out["windows"]
    assert (w0["window"], w0["blocks"], w0["candidates"], w0["run"]) == (0, 64, [1], 64)
    assert (w1["window"], w1["blocks"], w1["candidates"], w1["run"]) == (1, 36, [2], 26)
    head = w0["probes"][0]
    assert head["offset"] == 0 and head["postings"] == 1 and head["entries"][0][0] == 1
    assert [p["offset"] for p in w0["probes"]] == list(range(0, 64, 4))
    [seg] = w1["segments"]
    assert (seg["id"], seg["window"], seg["nblocks"], seg["run"]) == (2, 1, 26, 26)
    assert seg["presence"] == (1 << 26) - 1
    internal = token_ids("t", t, 16)[64:90]
    assert seg["ids"] == ids_to_bytes(salt_ids("t", internal))  # the external form
    assert seg["meta"] == np.full(26, 7, "<u8").tobytes()
    # nothing changed: no match counted, no directory entry added
    after = ix.stats()
    assert after["index_matches"] == stats["index_matches"] == 0
    assert after["routing_points"] == stats["routing_points"]


def test_dump_of_a_branch_shows_both_heads_and_where_the_base_stops() -> None:
    ix = index()
    base = np.arange(1, 1 + 64 * 16, dtype=np.uint32)  # one full window
    branch = np.concatenate([base[: 40 * 16],  # shares 40 blocks, then differs
                             np.arange(500_000, 500_000 + 40 * 16, dtype=np.uint32)])
    ix.write_many([Insert(0, SeqSpec("dump", tokens=base), meta=1),
                   Insert(1, SeqSpec("dump", tokens=branch), meta=2)])
    d = dump_sequence(ix, SeqSpec("dump", tokens=branch))
    [hit] = ix.match_many([Match(2, SeqSpec("dump", tokens=branch), with_ids=True)])
    assert isinstance(hit, MatchResult) and hit.ids is not None
    assert d["blocks"] == 80 and d["matched_blocks"] == hit.blocks == 80
    w0, w1 = d["windows"]
    assert w0["probes"][0]["offset"] == 0 and w0["probes"][0]["postings"] >= 2  # both heads
    assert len(w0["candidates"]) >= 2 and w0["run"] == 64
    runs = sorted(seg["run"] for seg in w0["segments"])
    assert runs[-2:] == [40, 64]  # the base segment stops at the branch
    best = max(w0["segments"], key=lambda seg: seg["run"])
    metas = np.frombuffer(best["meta"], "<u8")
    assert metas[:40].tolist() == [1] * 40 and metas[40:64].tolist() == [2] * 24
    assert best["ids"] == ids_to_bytes(hit.ids[:64])  # external ids, as match returns
    assert (w1["window"], w1["run"]) == (1, 16)
    miss = dump_sequence(ix, SeqSpec("dump", tokens=np.arange(7_000_000, 7_000_064,
                                                               dtype=np.uint32)))
    assert miss["matched_blocks"] == 0 and miss["windows"][0]["candidates"] == []


def test_dump_stops_after_the_first_window_without_candidates() -> None:
    ix = index()
    out = dump_sequence(ix, SeqSpec("", tokens=toks(200, 2)))
    assert out["matched_blocks"] == 0 and len(out["windows"]) == 1
    assert out["windows"][0]["candidates"] == [] and out["truncated"] is True
    assert all(p["postings"] == 0 for p in out["windows"][0]["probes"])


def test_a_bad_candidate_is_shown_as_an_error() -> None:
    ix = index()
    t = toks(10, 3)
    ix.write_many([Insert(0, SeqSpec("", tokens=t), meta=1)])
    wb = WriteBatch()
    wb.put(seg_key(1), b"garbage")
    ix.backend.write(wb, True)
    ix.store.forget_segments()
    [seg] = dump_sequence(ix, SeqSpec("", tokens=t))["windows"][0]["segments"]
    assert seg == {"id": 1, "error": "missing or failed its checks (see sarpctl check)"}
    [r] = ix.match_many([Match(0, SeqSpec("", tokens=t))])
    assert r.blocks == 0  # type: ignore[union-attr]


def test_dump_uses_the_index_rules_and_refuses_other_indexes() -> None:
    ix = index(IndexConfig(max_sequence_tokens=64))
    with pytest.raises(TooLarge, match=r"65 tokens exceeds max_sequence_tokens \(64\)"):
        dump_sequence(ix, SeqSpec("", tokens=np.zeros(65, np.uint32)))
    hashes = np.array([[5, 6]], np.uint64)
    assert dump_or_error(ix, SeqSpec("", hashes=hashes))["blocks"] == 1  # type: ignore[index]
    refused = dump_or_error(object(), SeqSpec("", hashes=hashes))
    assert isinstance(refused, SarpError) and "cannot be inspected" in refused.message


# -- branches: what follows a chain (issue 27) -----------------------------------------

def _block(v: int) -> np.ndarray:
    return np.full(16, v, dtype=np.uint32)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 3), min_size=1, max_size=20),
                          st.integers(0, 9), st.sampled_from(["insert", "parent", "remove"])),
                min_size=1, max_size=30),
       st.sampled_from([4, 8]))
def test_branches_are_every_stored_continuation(
        ops: list[tuple[list[int], int, str]], sb: int) -> None:
    """Against a brute force over every chain ever stored (a removed block keeps its
    id, so it is still a branch), with small windows so that heads end at window
    starts (the branch links) as often as inside windows; inserts after a parent too."""
    ix = index(IndexConfig(segment_blocks=sb, routing_points=2, branch_links=True))
    chains: list[np.ndarray] = []
    for blocks, meta, kind in ops:
        toks_ = np.concatenate([_block(b) for b in blocks])
        if kind == "parent" and chains:
            base = chains[meta % len(chains)]
            parent = salt_ids("", base[-1:])
            [got] = ix.write_many([Insert(0, SeqSpec("", tokens=toks_), meta=meta,
                                          parent=parent)])
            if isinstance(got, SarpError):  # its parent was removed
                continue
            ids = np.concatenate([base, chain_ids(id_bytes(base[-1]), toks_, 16)])
        elif kind == "remove" and chains:
            seq = chains[meta % len(chains)]
            ix.write_many([Remove(0, ns="", ids=salt_ids("", seq[len(seq) // 2:]))])
            continue
        else:
            ix.write_many([Insert(0, SeqSpec("", tokens=toks_), meta=meta)])
            ids = token_ids("", toks_, 16)
        chains.append(ids)
    for c in chains:
        for d in range(1, len(c) + 1):
            head = c[:d]
            want = {tuple(o[d].tolist()) for o in chains
                    if len(o) > d and (o[:d] == head).all()}
            got = {tuple(r) for r in branches(ix, head).tolist()}
            assert got == want, (d, sb)


def test_branches_at_a_window_start_need_the_links() -> None:
    ix = index(IndexConfig(segment_blocks=8, routing_points=2))
    t = np.concatenate([_block(i) for i in range(10)])
    ix.write_many([Insert(0, SeqSpec("", tokens=t), meta=1)])
    ids = token_ids("", t, 16)
    assert branches(ix, ids[:3]).tolist() == ids[3:4].tolist()
    with pytest.raises(ValueError, match="branch_links"):
        branches(ix, ids[:8])


@pytest.mark.parametrize("links", [True, False])
def test_chain_starts_are_every_chain_s_first_block_and_say_what_links_miss(
        links: bool) -> None:
    """`chain_starts` against what was written: every sequence's block 0 (removed ones
    too: their segments stay), and the window-start blocks no branch link names (all of
    them without links, none with)."""
    ix = index(IndexConfig(segment_blocks=8, branch_links=links))
    rng = np.random.default_rng(5)
    firsts, starts = set(), set()
    seqs = []
    for i in range(40):
        t = rng.integers(0, 1 << 30, 16 * int(rng.integers(1, 30))).astype(np.uint32)
        if seqs and i % 3 == 0:  # a branch of an earlier sequence
            base = seqs[int(rng.integers(len(seqs)))]
            t = np.concatenate([base[: 16 * int(rng.integers(1, len(base) // 16 + 1))], t])
        seqs.append(t)
        ns = f"n{i % 2}"
        ix.write_many([Insert(0, SeqSpec(ns, tokens=t), meta=i)])
        ids = token_ids(ns, t, 16)
        firsts.add(id_bytes(ids[0]))
        starts.update(id_bytes(ids[p]) for p in range(8, len(ids), 8))
    ix.write_many([Remove(0, seq=SeqSpec("n0", tokens=seqs[0]), ns="n0")])
    got = chain_starts(ix)
    assert {id_bytes(r) for r in got.firsts} == firsts and len(got.firsts) == len(firsts)
    assert got.window_starts == len(starts)
    assert got.unlinked == (0 if links else len(starts))
