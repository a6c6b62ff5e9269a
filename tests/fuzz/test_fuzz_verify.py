"""Fuzz sarpd/core/verify/_cverify.c (`first_mismatch`, `first_mismatch_many`, on its
AVX2 and its plain C path) against sarpd/core/verify/_numpy.py: the same index for id
arrays of any lengths (empty, odd, equal, differing at any row and word, colliding
rows), read in any form that holds them (unaligned, read-only, a memoryview); a clean
TypeError/ValueError for any other (another dtype, byte order, shape or memory order,
no buffer, sequences of different lengths, a wrong argument count)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from sarpd.core.verify import _numpy
from tests.fuzz._common import U64, Source, clean, extension, outcome, refused, replay, u64_form

C = extension("verify")


def _pair(src: Source) -> tuple[U64, U64]:
    """Two id arrays that share a prefix, then differ at one word (or not at all)."""
    n = src.integer(0, 40)
    cand = src.u64s((n, 2), pool=src.pick([0, 1, 3]))
    query = cand.copy()
    if n and src.chance(70):
        query[src.integer(0, n - 1), src.integer(0, 1)] ^= np.uint64(1 << src.integer(0, 63))
    cut = src.integer(0, 3)
    if cut == 1:
        query = query[: src.integer(0, n)].copy()
    elif cut == 2:
        query = np.concatenate([query, src.u64s((src.integer(1, 5), 2))])
    return cand, query


def _bad_shape(src: Source, arr: U64) -> object:
    n = len(arr)
    return src.pick([arr.reshape(-1), np.zeros((n, 3), np.uint64), arr.reshape(n, 2, 1),
                     np.zeros((n, 1), np.uint64), np.uint64(5), np.zeros((2, n), np.uint64)
                     if n != 2 else np.zeros((3, 4), np.uint64)])


def one_input(data: bytes) -> None:
    if C is None:
        return
    src = Source(data)
    C._set_simd(src.flag())
    mode = src.integer(0, 3)
    if mode <= 1:  # one pair, in any form
        cand, query = _pair(src)
        a, ok_a = u64_form(src, cand)
        b, ok_b = u64_form(src, query)
        if src.chance(10):
            a, ok_a = _bad_shape(src, cand), False
        got, err = outcome(lambda: C.first_mismatch(a, b))
        if ok_a and ok_b:
            clean(err, "first_mismatch")
            assert err is None, f"first_mismatch refused valid arrays: {err}"
            want = _numpy.first_mismatch(cand, query)
            assert got == want, f"first_mismatch: {got}, reference {want}"
        else:
            refused(err, "first_mismatch")
    elif mode == 2:  # a batch of pairs
        m = src.integer(0, 6)
        pairs = [_pair(src) for _ in range(m)]
        forms = [(u64_form(src, c), u64_form(src, q)) for c, q in pairs]
        ok = all(fa[1] and fb[1] for fa, fb in forms)
        cands = [fa[0] for fa, _ in forms]
        queries = [fb[0] for _, fb in forms]
        if m and src.chance(10):  # one pair short
            queries = queries[:-1]
            ok = False
        as_seq = src.pick([list, tuple])
        got_many, err = outcome(lambda: C.first_mismatch_many(as_seq(cands), as_seq(queries)))
        if ok:
            assert err is None, f"first_mismatch_many refused valid arrays: {err}"
            want_many = _numpy.first_mismatch_many([c for c, _ in pairs], [q for _, q in pairs])
            assert got_many == want_many, f"first_mismatch_many: {got_many}, ref {want_many}"
        else:
            refused(err, "first_mismatch_many")
    else:  # the wrong arguments altogether
        cand, query = _pair(src)
        args: list[object] = src.pick([[], [cand], [cand, query, query]])
        refused(outcome(lambda: C.first_mismatch(*args))[1], "first_mismatch(argc)")
        bad = src.pick([None, 3, cand, iter([cand])])
        _, err = outcome(lambda: C.first_mismatch_many(bad, [query]))
        if not isinstance(bad, type(iter([]))):  # an iterator of one array is a sequence
            refused(err, "first_mismatch_many(not a sequence)")
        clean(err, "first_mismatch_many(not a sequence)")


@pytest.mark.skipif(C is None, reason="the C verifier is not built")
def test_replay() -> None:
    try:
        replay(one_input, seed=1, runs=1500, max_len=700)
    finally:
        assert C is not None
        C._set_simd(True)


if __name__ == "__main__":
    from tests.fuzz._common import fuzz

    fuzz(one_input, sys.argv)
