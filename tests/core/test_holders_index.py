"""Holders through the index (protocol 2) against HolderOracle, on every backend:
a fleet of holders inserting shared prompts and their own turns (some on protocol 1:
the first insert wins), branches, removals of one holder or all, clears by a holder
mask, restarts; every match compared with its per-block answers and top holders,
and the counts (new, removed, blocks, holdings)."""

from __future__ import annotations

import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from backends.registry import backend_names
from sarpd.config import IndexConfig
from sarpd.errors import TooLarge
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
