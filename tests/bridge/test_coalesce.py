"""Coalescing (sarpd.bridge.coalesce): chained stores and removals of one holder fold
into one request each, and applying the coalesced requests to a real index leaves
the same answers, holder by holder, as applying the bridge's requests one by one
(the oracle: `Translator`'s ops, unchanged), on random event streams with branches,
shared blocks, removals in between, clears, unknown parents, several engines and
tiers."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.memory import MemoryBackend
from sarpd.bridge.coalesce import Mark, Req, coalesce, split_all, split_first
from sarpd.client import SyncClient
from sarpd.config import IndexConfig
from sarpd.core.index import SarpIndex
from sarpd.errors import SarpError, UnknownParent
from sarpd.events.mapping import CanaryOp, ClearOp, InsertOp, RemoveOp, Translator
from sarpd.events.schema import AllBlocksCleared, BlockRemoved, BlockStored, Event
from sarpd.model import Match, SeqSpec
from tests.bridge.vllm_engine import bridge_cfg, start_bridge
from tests.daemon_helpers import Launcher
from tools.bench.bridge import id_array, model_ops
from tools.bench.vllm_publisher import Publisher, encode_batch, stored

META = 3 << 48


def _store(hashes: tuple[int, ...], parent: int | None, **kw: object) -> Req:
    return Req("stored", InsertOp("", hashes, parent, META), **kw)  # type: ignore[arg-type]


def _remove(ids: tuple[int, ...], ns: str = "") -> Req:
    return Req("removed", RemoveOp(ns, ids, META))


def test_a_chain_of_stores_becomes_one_insert_in_the_first_ones_place() -> None:
    items: list[Req | Mark] = [_store((1, 2), None), Mark(0, 0.0), _remove((50,)),
                               _store((3,), 2), _store((4, 5), 3), Mark(1, 0.0)]  # fmt: skip
    out = coalesce(items)
    assert len(out) == 4 and out[1:] == [Mark(0, 0.0), _remove((50,)), Mark(1, 0.0)]
    head = out[0]
    assert isinstance(head, Req) and head.op == InsertOp("", (1, 2, 3, 4, 5), None, META)
    assert head.parts == (2, 1, 2) and head.events == 3
    n, rest = split_first(Req("stored", InsertOp("", (1, 2, 3, 4, 5), 9, META),
                              parts=(2, 1, 2)))  # fmt: skip
    assert n == 2 and rest.op == InsertOp("", (3, 4, 5), 2, META) and rest.parts == (1, 2)
    n, last = split_first(rest)
    assert n == 1 and last.op == InsertOp("", (4, 5), 3, META) and last.events == 1


def test_what_ends_a_run() -> None:
    def inserts(items: list[Req | Mark]) -> int:
        return sum(isinstance(it, Req) and isinstance(it.op, InsertOp) for it in coalesce(items))

    assert inserts([_store((1,), None), _store((2,), 1)]) == 1
    assert inserts([_store((1,), None), _remove((1,)), _store((2,), 1)]) == 2  # its tail
    assert inserts([_store((1, 2), None), _remove((1,)), _store((3,), 2)]) == 2  # its block
    assert inserts([_store((1,), None), _remove((2,)), _store((2,), 1)]) == 2  # the store's
    assert inserts([_store((1,), None), _store((7,), 1), _store((2,), 1)]) == 2  # a branch
    assert inserts([_store((1,), None), Req("cleared", ClearOp("", 1, 1)),
                    _store((2,), 1)]) == 2  # fmt: skip
    assert inserts([_store((1,), None), _store((2,), 1, alternatives=("x",))]) == 2
    other_holder = Req("stored", InsertOp("", (2,), 1, META + 1))
    assert inserts([_store((1,), None), other_holder]) == 2
    assert inserts([_store((1,), None), Req("stored", InsertOp("x", (2,), 1, META))]) == 2
    assert inserts([_store((1,), None), _remove((9,)), _store((2,), 1)]) == 1  # unrelated
    assert inserts([_store((1,), None), _store((1,), 1)]) == 2  # repeats its own block
    removals = [_remove((1, 2)), _store((5,), None), _remove((3,)), _remove((4,), "x")]
    assert coalesce(removals, removals=False) == removals
    out = coalesce(removals)  # the default merges them
    assert len(out) == 3 and out[0] == Req("removed", RemoveOp("", (1, 2, 3), META), merged=2)
    # a removal of a block named since the open removal stays in its place
    assert len(coalesce([_remove((1,)), _store((2,), None), _remove((2,))], True)) == 3
    # a removal of a run's block ends the run
    assert len(coalesce([_remove((9,)), _store((1,), None), _remove((1,)), _store((2,), 1)],
                        True)) == 4  # fmt: skip


# ------------------------------------------------------------------ the property


def _stream(rng: random.Random, n: int, workers: int, p_chain: float, p_remove: float,
            p_clear: float) -> list[tuple[int, Event]]:  # fmt: skip
    """(worker, event): stores along one shared tree of blocks (so that engines share
    blocks, continue their own last store, branch, store after evicted parents), LoRA
    chains, evictions of stored blocks, CPU-tier copies, clears."""
    parent_of: dict[int, int | None] = {}
    lora: dict[int, str | None] = {}
    for b in range(1, 60):  # mostly chains, some branches, some roots
        r = rng.random()
        parent_of[b] = b - 1 if (b > 1 and r < p_chain) else (
            None if r > 0.9 or b == 1 else rng.randrange(1, b))
        root = b if parent_of[b] is None else None
        lora[b] = (rng.choice([None, None, "sql"]) if root else lora[parent_of[b] or b])
    last: dict[int, int] = {}
    held: dict[int, list[int]] = {w: [] for w in range(workers)}
    out: list[tuple[int, Event]] = []
    for _ in range(n):
        w = rng.randrange(workers)
        r = rng.random()
        if r < p_clear:
            out.append((w, AllBlocksCleared()))
            held[w].clear()
            continue
        if r < p_clear + p_remove and held[w]:
            ids = tuple(rng.sample(held[w], min(len(held[w]), rng.randint(1, 3))))
            medium = rng.choice(["GPU", "GPU", "CPU"])
            out.append((w, BlockRemoved(ids, medium)))
            continue
        kids = [b for b, p in parent_of.items() if p == last.get(w)] if w in last else []
        first = rng.choice(kids) if kids and rng.random() < 0.7 else rng.randrange(1, 60)
        chain = [first]
        while len(chain) < rng.randint(1, 4):
            nxt = [b for b, p in parent_of.items() if p == chain[-1]]
            if not nxt:
                break
            chain.append(rng.choice(nxt))
        medium = "CPU" if rng.random() < 0.15 else "GPU"
        out.append((w, BlockStored(tuple(chain), parent_of[first], 16, medium=medium,
                                   lora_name=lora[first], num_tokens=16 * len(chain))))
        last[w] = chain[-1]
        held[w].extend(chain)
    return out


def _items(stream: list[tuple[int, Event]], workers: int) -> list[Req | Mark]:
    trs = [Translator(w) for w in range(workers)]
    items: list[Req | Mark] = []
    for i, (w, ev) in enumerate(stream):
        tr = trs[w].event(ev)
        items.extend(Req(tr.kind if k == 0 else None, op) for k, op in enumerate(tr.ops))
        items.append(Mark(i, 0.0))
    return items


def _apply(items: list[Req | Mark]) -> tuple[SarpIndex, Counter[str]]:
    """Apply requests as the bridge does (one request per write; an unknown parent of
    a coalesced insert drops its first store and re-sends the rest)."""
    ix = SarpIndex(MemoryBackend(), IndexConfig(snapshot_interval_s=0.0), sync=False)
    counts: Counter[str] = Counter()
    todo = [it for it in items if isinstance(it, Req) and not isinstance(it.op, CanaryOp)]
    todo.reverse()
    while todo:
        it = todo.pop()
        (r,) = ix.write_many(model_ops([it.op]))
        if isinstance(r, UnknownParent):
            counts["unknown_parent"] += 1
            if len(it.parts) > 1:
                todo.append(split_first(it)[1])
            continue
        assert not isinstance(r, SarpError), r
        if it.kind is not None:
            counts[it.kind] += it.events
        counts["new_blocks"] += getattr(r, "new_blocks", 0)
        counts["removed_blocks"] += getattr(r, "removed", 0)
    return ix, counts


def _answers(ix: SarpIndex, namespaces: set[str], paths: list[list[int]]) -> list[object]:
    """Every path's match in every namespace, with its holders' runs."""
    reqs = [Match(i, SeqSpec(ns, hashes=id_array(path)), holders=8)
            for i, (ns, path) in enumerate((ns, p) for ns in sorted(namespaces)
                                           for p in paths)]  # fmt: skip
    out: list[object] = []
    for r in ix.match_many(reqs):
        assert not isinstance(r, SarpError), r
        out.append((r.blocks, r.meta.tolist(), r.holders))
    return out


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 120), workers=st.integers(1, 3),
       p_chain=st.floats(0.3, 0.95), p_remove=st.floats(0.0, 0.4),
       p_clear=st.sampled_from([0.0, 0.0, 0.02, 0.08]), round_size=st.integers(1, 64),
       removals=st.booleans())
def test_coalesced_application_answers_as_one_by_one(
    seed: int, n: int, workers: int, p_chain: float, p_remove: float, p_clear: float,
    round_size: int, removals: bool,
) -> None:  # fmt: skip
    rng = random.Random(seed)
    stream = _stream(rng, n, workers, p_chain, p_remove, p_clear)
    items = _items(stream, workers)
    rounds: list[Req | Mark] = []
    for i in range(0, len(items), round_size * 2):
        rounds.extend(coalesce(items[i : i + round_size * 2], removals))
    ix_one, one = _apply(items)
    ix_co, co = _apply(rounds)
    namespaces = {it.op.ns for it in items if isinstance(it, Req)}
    paths = _tree_paths(stream)
    assert _answers(ix_co, namespaces, paths) == _answers(ix_one, namespaces, paths)
    assert co == one  # removals too: sarpd counts sibling blocks at one offset apart
    assert ix_co.stats()["blocks"] == ix_one.stats()["blocks"]
    assert ix_co.stats()["holdings"] == ix_one.stats()["holdings"]


def test_streams_do_coalesce() -> None:
    """The property above is not vacuous: its streams give runs of several stores."""
    stream = _stream(random.Random(1), 200, 2, 0.9, 0.1, 0.0)
    out = coalesce(_items(stream, 2))
    assert sum(len(it.parts) > 1 for it in out if isinstance(it, Req)) >= 5


def _tree_paths(stream: list[tuple[int, Event]]) -> list[list[int]]:
    """Every chain from position 0 that the stream's stores describe."""
    parent: dict[int, int | None] = {}
    for _, ev in stream:
        if isinstance(ev, BlockStored):
            p = ev.parent
            for h in ev.block_hashes:
                parent.setdefault(h, p)
                p = h
    paths: list[list[int]] = []
    for b in parent:
        path: list[int] = []
        seen: set[int] = set()
        x: int | None = b
        while x is not None and x not in seen:
            seen.add(x)
            path.append(x)
            x = parent.get(x)
        if x is None:
            paths.append(path[::-1])
    return paths or [[1]]


def test_ids_zero_extend() -> None:
    assert id_array([5, 2**64 - 1]).tolist() == [[5, 0], [2**64 - 1, 0]]
    assert id_array([]).shape == (0, 2) and id_array([]).dtype == np.uint64


def test_an_unknown_parent_drops_the_first_store_only() -> None:
    """Store by store, a store after an unknown parent is dropped and the next one,
    whose parent happens to be indexed already, lands: so does the coalesced insert
    (split: the first store dropped, the rest re-sent after its last block)."""
    items: list[Req | Mark] = [_store((1, 2), None), _store((2,), 9), _store((3,), 2)]
    out = coalesce(items)
    assert len(out) == 2 and isinstance(out[1], Req) and out[1].parts == (1, 1)
    (ix_one, one), (ix_co, co) = _apply(items), _apply(out)
    assert co == one == Counter(stored=2, unknown_parent=1, new_blocks=3)
    assert _answers(ix_co, {""}, [[1, 2, 3]]) == _answers(ix_one, {""}, [[1, 2, 3]])
    assert _answers(ix_co, {""}, [[1, 2, 3]])[0] == (3, [META] * 3, [(META, 3)])


def test_split_all_gives_back_the_stores() -> None:
    req = Req("stored", InsertOp("", (1, 2, 3, 4, 5), 9, META), parts=(2, 1, 2))
    assert split_all(req) == [_store((1, 2), 9), _store((3,), 2), _store((4, 5), 3)]


def test_a_coalesced_insert_past_sarpds_id_limit_goes_store_by_store(
    sarpd_factory: Launcher, publisher: Publisher, tmp_path: Path
) -> None:
    """A sarpd that takes at most 4 ids per request: three chained stores of 2 blocks
    coalesce into 6 ids (too_large), so the bridge sends them one by one."""
    sarpd = sarpd_factory(config={"index": {"max_sequence_tokens": 64}})
    bt = start_bridge(bridge_cfg(publisher, sarpd, tmp_path / "state.json"), publisher)
    try:
        evs = [stored([1, 2], None, [0] * 32), stored([3, 4], 2, [0] * 32),
               stored([5, 6], 4, [0] * 32)]  # fmt: skip
        publisher.publish(encode_batch(evs))
        bt.wait_seq(0)
        assert bt.bridge is not None
        stats = bt.bridge.stats
        assert stats.events["stored"] == 3 and stats.rejected == 0 and stats.blocks_new == 6
    finally:
        bt.stop()
    with SyncClient(sarpd.socket) as c:
        assert c.match(hashes=[1, 2, 3, 4])["blocks"] == 4
        assert c.match(hashes=[3, 4, 5, 6], ns="")["blocks"] == 0  # not from position 0
