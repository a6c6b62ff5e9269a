"""Holders through the index (protocol 2) against HolderOracle, on every backend:
a fleet of holders inserting shared prompts and their own turns (some on protocol 1:
the first insert wins), branches, removals of one holder or all, clears by a holder
mask, restarts; every match compared with its per-block answers, top holders and
spans, and the counts (new, removed, blocks, holdings). Spans on hard workloads
(hundreds of holders of one block, runs across windows, holes, one holder a block,
many windows) are also held to the index's reference match path: with the match
kernel built (tests/conftest.py's guard), the answers must come from it."""

from __future__ import annotations

import random
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.registry import backend_names
from sarpd.config import IndexConfig
from sarpd.core import index as index_module
from sarpd.core import native
from sarpd.errors import SarpError, TooLarge
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
from tests.core.test_index import TINY, Harness
from tests.oracle import BT, HolderOracle

BACKENDS = pytest.mark.parametrize("backend_name", backend_names())
HOT = 0xF00  # a holder that holds every shared prompt


def seq(toks: tuple[int, ...]) -> SeqSpec:
    return SeqSpec("fleet", tokens=np.array(toks, dtype=np.uint32))


@st.composite
def fleet(draw: st.DrawFn) -> list[tuple[str, tuple[Any, ...]]]:
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))

    def blocks(n: int) -> tuple[int, ...]:
        return tuple(rng.randrange(50) for _ in range(n * BT))

    prompts = [blocks(draw(st.integers(1, 20))) for _ in range(draw(st.integers(1, 2)))]
    seqs: list[tuple[int, ...]] = list(prompts)
    ops: list[tuple[str, tuple[Any, ...]]] = [("insert", (p, HOT, True)) for p in prompts]
    for _ in range(draw(st.integers(3, 25))):
        kind = draw(st.sampled_from(["insert", "insert", "branch", "remove", "clear",
                                     "match", "restart"]))
        holder = draw(st.integers(0, 7))
        src = seqs[draw(st.integers(0, len(seqs) - 1))]
        if kind == "insert":
            toks = src + blocks(draw(st.integers(0, 12)))
            seqs.append(toks)
            ops.append(("insert", (toks, holder, draw(st.booleans()) or holder < 6)))
        elif kind == "branch":  # from inside an earlier sequence
            cut = BT * draw(st.integers(0, len(src) // BT))
            toks = src[:cut] + blocks(draw(st.integers(1, 6)))
            seqs.append(toks)
            ops.append(("insert", (toks, holder, True)))
        elif kind == "remove":
            start = draw(st.integers(0, len(src) // BT))
            ops.append(("remove", (src, start, draw(st.sampled_from([None, holder, HOT])))))
        elif kind == "clear":
            ops.append(("clear", (draw(st.sampled_from([7, 1, 0xFFF])), holder & 1)))
        elif kind == "restart":
            ops.append(("restart", (draw(st.booleans()),)))
        ops.append(("match", (src + blocks(1), draw(st.integers(1, 9)))))
    ops += [("match", (s, 9)) for s in seqs]
    return ops


def check_match(h: Harness, model: HolderOracle, toks: tuple[int, ...], k: int) -> None:
    got, spanned = h.ix.match_many([Match(0, seq(toks), holders=k),
                                    Match(1, seq(toks), holders=k, spans=True)])
    assert isinstance(got, MatchResult) and isinstance(spanned, MatchResult)
    meta, top = model.match("fleet", toks, k)
    assert (got.blocks, got.meta.tolist(), got.holders) == (len(meta), meta, top)
    assert got.spans is None
    assert (spanned.blocks, spanned.meta.tolist(), spanned.holders) == (len(meta), meta, top)
    assert spanned.spans == model.spans("fleet", toks)


def write(h: Harness, op: Insert | Remove | Clear) -> InsertResult | RemoveResult:
    r = h.ix.write_many([op])[0]
    assert isinstance(r, InsertResult | RemoveResult), r
    return r


def run(h: Harness, ops: list[tuple[str, tuple[Any, ...]]]) -> None:
    model = HolderOracle()
    for kind, args in ops:
        if kind == "insert":
            toks, holder, add = args
            r = write(h, Insert(0, seq(toks), meta=holder, add_holder=add))
            assert isinstance(r, InsertResult)
            assert (r.blocks, r.new_blocks, r.matched_blocks) == model.insert(
                "fleet", toks, holder, add)
        elif kind == "remove":
            toks, start, holder = args
            r = write(h, Remove(0, seq(toks), start, "fleet", meta=holder))
            assert isinstance(r, RemoveResult)
            assert r.removed == model.remove("fleet", toks, start, holder)
        elif kind == "clear":
            mask, value = args
            r = write(h, Clear(0, "fleet", mask, value))
            assert isinstance(r, RemoveResult) and r.removed == model.clear("fleet", mask, value)
        elif kind == "restart":
            h.restart(args[0])
        else:
            check_match(h, model, *args)
        stats = h.ix.stats()
        assert (stats["blocks"], stats["holdings"]) == (len(model.blocks), model.holdings)


@BACKENDS
@pytest.mark.parametrize("cfg", [TINY, IndexConfig()], ids=["tiny", "default"])
@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(ops=fleet())
def test_holders_match_the_model(backend_name: str, cfg: IndexConfig,
                                 ops: list[tuple[str, tuple[Any, ...]]]) -> None:
    root = Path(tempfile.mkdtemp(prefix="sarp-holders-"))
    h = Harness(backend_name, cfg, root)
    try:
        run(h, ops)
    finally:
        h.ix.close()
        shutil.rmtree(root, ignore_errors=True)


@BACKENDS
def test_many_holders_of_a_hot_prefix_and_the_limit(backend_name: str, tmp_path: Path) -> None:
    """1,024 holders of one system prompt: every one is answered; one more is refused
    whole (too_large) and changes nothing."""
    h = Harness(backend_name, IndexConfig(max_holders=1024), tmp_path)
    try:
        prompt = tuple(range(BT * 70))
        for w in range(1024):
            r = h.ix.write_many([Insert(0, seq(prompt), meta=w << 48, add_holder=True)])[0]
            assert not isinstance(r, Exception)
        res = h.ix.match_many([Match(0, seq(prompt), holders=1024)])[0]
        assert isinstance(res, MatchResult) and res.holders is not None
        assert res.holders == [(w << 48, 70) for w in range(1024)]
        assert res.meta.tolist() == [0] * 70  # longest run, smallest meta
        refused = h.ix.write_many([Insert(0, seq(prompt), meta=1, add_holder=True)])[0]
        assert isinstance(refused, TooLarge) and "max_holders is 1,024" in refused.message
        assert h.ix.stats()["holdings"] == 70 * 1024
    finally:
        h.ix.close()


# -- spans: the native kernel's against the reference's ----------------------------------
NATIVE = native.expected()["match"]  # this run must match in C (tests/conftest.py's guard)
# holders at uint64's edges too: spans go by holder as unsigned
EDGES = [0, 1, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1]
Op = Insert | Remove


@st.composite
def span_work(draw: st.DrawFn) -> tuple[tuple[int, ...], list[Op], HolderOracle]:
    """A trunk of n blocks (window edges, many windows) and the writes of one shape, with
    the oracle that saw them: "crowd" (up to 150 holders of the same blocks),
    "bands" (holders of ranges: inserted to an end, taken off before a start),
    "holes" (holders taken off ranges inside), "single" (protocol 1 inserts of growing
    prefixes, one holder a block), or all of these."""
    rng = random.Random(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.sampled_from([1, 7, 8, 9, 16, 63, 64, 65, 100, 130]))
    trunk = tuple(rng.randrange(50) for _ in range(n * BT))
    shape = draw(st.sampled_from(["crowd", "bands", "holes", "single", "mixed"]))
    pool = EDGES + list(range(3, 3 + draw(st.integers(1, 150 if shape == "crowd" else 12))))
    model = HolderOracle()
    ops: list[Op] = []

    def insert(end: int, holder: int, add: bool) -> None:
        ops.append(Insert(0, seq(trunk[: end * BT]), meta=holder, add_holder=add))
        model.insert("fleet", trunk[: end * BT], holder, add)

    def take_off(start: int, end: int, holder: int) -> None:  # blocks [start, end)
        ops.append(Remove(0, seq(trunk[: end * BT]), start, "fleet", meta=holder))
        model.remove("fleet", trunk[: end * BT], start, holder)

    insert(n, rng.choice(pool), shape != "single")
    for _ in range(draw(st.integers(1, 60))):
        kind = shape if shape != "mixed" else rng.choice(["crowd", "bands", "holes", "single"])
        a, b = sorted(rng.sample(range(n + 1), 2)) if n > 1 else (0, 1)
        holder = rng.choice(pool)
        if kind == "single":
            insert(rng.randint(1, n), holder, False)
        elif kind == "crowd":
            insert(rng.choice([n, b]), holder, True)
        elif kind == "bands":
            insert(b, holder, True)
            if rng.random() < 0.7:
                take_off(0, a, holder)
        else:
            take_off(a, b, holder)
    return trunk, ops, model


def reference_answers(ix: index_module.SarpIndex, reqs: Sequence[Match]
                      ) -> list[MatchResult | SarpError]:
    """The requests on the index's reference match path (holders.py's spans), the
    index's other kernels as they are."""
    kept = ix.k
    ix.k = replace(kept, match=None)
    try:
        return ix.match_many(reqs)
    finally:
        ix.k = kept


def native_answers(ix: index_module.SarpIndex, reqs: Sequence[Match]
                   ) -> list[MatchResult | SarpError]:
    """The requests as the index answers them; with the match kernel built, from it
    alone (the reference's spans may not run)."""
    if not NATIVE:
        return ix.match_many(reqs)
    assert ix.k.match is not None, "the match kernel is built but the index does not use it"

    def refuse(*args: object) -> None:
        raise AssertionError("spans from the reference on the native path")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(index_module, "spans", refuse)
        return ix.match_many(reqs)


@BACKENDS
@pytest.mark.parametrize("cfg", [TINY, IndexConfig()], ids=["tiny", "default"])
@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(work=span_work())
def test_holder_spans_are_the_references_on_hard_workloads(
        backend_name: str, cfg: IndexConfig,
        work: tuple[tuple[int, ...], list[Op], HolderOracle]) -> None:
    """Spans through the index, in batches that mix queries with and without spans
    (prefixes, the trunk, a branch off it): the same lists as the reference match
    path's and the oracle's, and the metas and top holders unchanged."""
    trunk, ops, model = work
    root = Path(tempfile.mkdtemp(prefix="sarp-spans-"))
    h = Harness(backend_name, cfg, root)
    try:
        for at in range(0, len(ops), 16):
            for done in h.ix.write_many(ops[at : at + 16]):
                assert isinstance(done, InsertResult | RemoveResult), done
        n = len(trunk) // BT
        cuts = sorted({n, max(1, n // 2), min(n, 9), min(n, 65)})
        toks = [trunk[: c * BT] for c in cuts] + [trunk[: BT * (n - 1)] + (99,) * BT]
        reqs = [Match(i, seq(t), holders=3 * (i % 2), spans=i % 3 != 1)
                for i, t in enumerate(toks + toks)]
        got, want = native_answers(h.ix, reqs), reference_answers(h.ix, reqs)
        for r, t, g, w in zip(reqs, toks + toks, got, want, strict=True):
            assert isinstance(g, MatchResult) and isinstance(w, MatchResult)
            assert g.spans == w.spans == (model.spans("fleet", t) if r.spans else None)
            assert (g.blocks, g.meta.tolist(), g.holders) == (w.blocks, w.meta.tolist(),
                                                             w.holders)
    finally:
        h.ix.close()
        shutil.rmtree(root, ignore_errors=True)
