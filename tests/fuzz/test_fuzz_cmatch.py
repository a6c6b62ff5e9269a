"""Fuzz sarpd/core/_cmatch.c (the match kernel: `match`, `route`, `verify`,
`assemble`, `merge_order`) against its references, with tests/core/test_kernel.py's
helpers:

- the one-call `match` (routing, reads, the first round, bound-and-verify rounds with
  a locator check, the answers) answers as the reference index does (its
  `_verify_round`, `_exact_rounds` and `match_holders`), round for round;
- routing of random directories (base and unmerged delta, duplicate keys, tied
  filters, hot posting lists) is the router's (`reference_plans`), and the first
  verification round over candidates that are copies of the query, cut, holed, moved
  to another window, missing, or hostile (ids of another dtype or shape, strided
  views, presence past 64 bits or negative) is `reference_verify`'s;
- `assemble` is `holders.match_holders` (metas and top holders) and `holders.spans`
  (where a query asks for its spans);
- `merge_order` is numpy's stable argsort (keys that collide, uint64's extremes);
- the segment cache (`SegmentCache`, csrc/segcache.c) keeps the reference's answers
  and order (sarpd/core/segcache.py) over random operation sequences (puts of new and
  held ids, hits with repeats, capacities that shrink to 0 and grow, clears), and
  refuses hostile ids (negative, past 64 bits, not ints) and values (None, not a
  mapping) cleanly, its structure whole after (its `_audit`); of stored values
  (`put_values`: sound, damaged, torn, grown, another segment's, random bytes) it
  holds exactly those the reference's decoder accepts, and decodes them alike;
- hostile arguments (arrays of another dtype, shape or memory order, rows, spans,
  offsets and orders out of range, lengths that do not add up, sb/gap/cap out of
  range or huge) are refused with a clean exception, or, where the kernel takes them,
  answered within bounds (and, for verify, as the reference answers)."""

from __future__ import annotations

import functools
import sys
import threading
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from sarpd.config import IndexConfig
from sarpd.core import kernel, native
from sarpd.core.holders import match_holders, tables
from sarpd.core.holders import spans as holder_spans
from sarpd.core.index import SarpIndex
from sarpd.core.routing import filter_at, fingerprints
from sarpd.core.segcache import SegmentCache
from sarpd.core.segment import Segment, decode_segment, encode_segment
from sarpd.model import IdArray
from tests.core.test_kernel import (
    CONFIGS,
    _router,
    check_answers,
    kernel_plans,
    reference_plans,
    reference_verify,
)
from tests.fuzz._common import (
    I64,
    U64,
    Source,
    clean,
    extension,
    outcome,
    refused,
    replay,
    u64_form,
)

K = extension("match")
R = kernel.ROW_FIELDS
SEG_ERRORS = (AttributeError, KeyError)  # a segs entry that is no Segment, or missing


def _world(src: Source) -> tuple[IndexConfig, Any, list[IdArray]]:
    """A directory over a small pool of ids (base sorted by key, delta in insertion
    order), with filters near the queries' so that agreements tie; queries walk the
    pool. As tests/core/test_kernel.py's `worlds`, drawn from the fuzzer's bytes."""
    cfg = CONFIGS[src.pick(sorted(CONFIGS))]
    sb = cfg.segment_blocks
    pool = src.u64s((src.integer(1, 12), 2))
    qs = [pool[[src.integer(0, len(pool) - 1) for _ in range(src.integer(0, 3 * sb))]]
          .reshape(-1, 2) for _ in range(src.integer(0, 6))]
    qfilts = [filter_at(fingerprints(q[:sb], sb), o)
              for q in qs if len(q) for o in range(min(len(q), sb))] or [0]
    top = src.pick([3, 50, 1 << 40])

    def entries(n: int) -> list[tuple[int, int, int]]:
        out = []
        for _ in range(n):
            f = int(src.pick(qfilts))
            if src.flag():  # differs from a query's at one nibble: a given agreement
                f ^= 1 << src.integer(0, 63)
            out.append((int(pool[src.integer(0, len(pool) - 1), 0]), src.integer(1, top), f))
        return out

    router = _router(cfg, entries(src.integer(0, 60)), entries(src.integer(0, 40)))
    return cfg, router, qs


def _check_route(src: Source) -> None:
    _, router, qs = _world(src)
    want = reference_plans(router, qs)
    got = kernel_plans(router, qs)
    assert got == want, "route: not the router's plans"


def _candidate(src: Source, qw: IdArray, window: int, sb: int) -> tuple[object, bool]:
    """A segment offered for a window: (segment, in the kernel's domain)."""
    n = src.integer(1, sb)
    cand = np.resize(qw, (n, 2)).copy() if len(qw) else src.u64s((n, 2))
    if src.chance(40):
        cand[src.integer(0, n - 1), src.integer(0, 1)] ^= np.uint64(1)
    w = window + (1 if src.chance(10) else 0)
    presence = ((1 << n) - 1) & ~src.u64() if src.chance(30) else (1 << n) - 1
    seg = Segment(src.integer(1, 2**40), w, presence, 0, cand, np.zeros(n, np.uint64))
    k = src.integer(0, 19)
    if k == 0:
        seg.ids = np.repeat(cand, 2, axis=0)[::2]  # a strided view: read as it is
    elif k == 1:
        seg.presence = src.pick([-1, 2**64 - 1, 2**64 + presence, 2**70 - 1])
    elif k == 2:
        seg.window = src.pick([-1, -(2**63), 2**63 - 1, 2**63, 2**64 - 1])  # a u64 field
    elif k == 3:  # no id array of the kernel's: refused, or read as the reference
        seg.ids = src.pick([cand.astype(np.int64), cand.reshape(-1), cand[:, :1].copy(),
                            cand.tolist()])
        return seg, False
    elif k == 4:
        return src.pick([object(), None, 5]), False
    return seg, True


def _check_verify(src: Source) -> None:
    assert K is not None
    cfg, router, qs = _world(src)
    sb = cfg.segment_blocks
    routed = router.route(qs, K)
    segs: dict[int, Any] = {}
    ok = True
    for row in routed.rows.tolist():
        start = int(routed.qstarts[row[kernel.Q]]) + row[kernel.W] * sb
        qw = routed.qids[start : start + row[kernel.LEN]]
        for s in routed.first[row[kernel.FSTART] : row[kernel.FSTART] + row[kernel.FCOUNT]]:
            if int(s) in segs or src.chance(15):
                continue  # missing (or corrupt): not offered
            segs[int(s)], fits = _candidate(src, qw, row[kernel.W], sb)
            ok = ok and fits
    got, err = outcome(lambda: kernel.verify(K, routed, segs, sb))
    want, ref_err = outcome(lambda: reference_verify(routed, segs, sb))
    if not ok:
        clean(err, "verify", *SEG_ERRORS)
        if err is not None or ref_err is not None:
            return
    assert err is None, f"verify: {err!r} (reference: {ref_err!r})"
    assert got is not None
    best, sid = got
    got_v = list(zip(best.tolist(), sid.tolist(), strict=True))
    assert got_v == want, "verify: not the reference's"


class _RefIndex:
    """What the index's reference match (`SarpIndex._verify_round`, `_exact_rounds`)
    reads of its index: the router, the config, the reference kernels and a store whose
    reads come from `segs` and whose locator check answers from `held`."""

    def __init__(self, cfg: IndexConfig, router: Any, segs: dict[int, Any],
                 held: set[bytes]) -> None:
        self.cfg, self.router, self.k = cfg, router, native.pick(reference=True)
        self.store = SimpleNamespace(
            read=lambda sids: {s: segs[s] for s in sids if s in segs},
            indexed=lambda ids: [bytes(r) in held for r in np.ascontiguousarray(ids, "<u8")],
            activity=SimpleNamespace(extra_rounds=0), lock=threading.Lock())

    _verify_round = SarpIndex._verify_round
    _exact_rounds = SarpIndex._exact_rounds


def _reference_match(ix: _RefIndex, qs: list[IdArray], ks: list[int], wants: list[bool]
                     ) -> tuple[list[tuple[int, list[int], Any, Any]], int]:
    """Per query (blocks, metas, top holders, spans where `wants` asks) as the reference
    index answers, and the extra rounds it read."""
    plans = ix.router.plan_many_reference(qs)
    segs = ix._verify_round(qs, [(qi, p, p.first) for qi, w in enumerate(plans) for p in w], {})
    if ix.cfg.exact_match:
        ix._exact_rounds(qs, plans, segs)
    out = []
    for windows, k, want in zip(plans, ks, wants, strict=True):
        matched, total = [], 0
        for p in windows:
            if p.best_sid:
                matched.append((segs[p.best_sid], p.best))
            total += p.best
            if p.best < p.length:
                break
        meta, top = match_holders(matched, k)
        out.append((total, meta.tolist(), top or [], holder_spans(tables(matched)) if want else []))
    return out, ix.store.activity.extra_rounds


def _check_match(src: Source) -> None:
    """The one-call match (route, reads, verify, rounds, answers) against the
    reference index's, on segments copied from the queries (cut, holed, moved) and
    a locator check that holds a random part of the blocks."""
    assert K is not None
    cfg, router, qs = _world(src)
    cfg = replace(cfg, exact_match=src.chance(80), block_locators=src.chance(70))
    router.cfg = cfg
    sb = cfg.segment_blocks
    flat = router.dir.flat()
    segs: dict[int, Any] = {}
    for sid in sorted(set(flat.segs.tolist()) | set(flat.dsegs.tolist())):
        if not src.chance(85) or not qs:
            continue
        q = qs[src.integer(0, len(qs) - 1)]
        w = src.integer(0, max(0, (len(q) - 1) // sb))
        seg, fits = _candidate(src, q[w * sb : (w + 1) * sb], w, sb)
        if fits and isinstance(seg, Segment):
            segs[sid] = Segment(sid, seg.window, seg.presence, 0, seg.ids,
                                np.arange(1, seg.nblocks + 1, dtype=np.uint64))
    held = {bytes(np.ascontiguousarray(r, "<u8")) for q in qs for r in q if src.flag()}
    ks = [src.integer(0, 3) for _ in qs]
    wants = [src.flag() for _ in qs]
    ref = _RefIndex(cfg, router, segs, held)
    want, want_rounds = _reference_match(ref, qs, ks, wants)
    lens = np.array([len(q) for q in qs], np.int64)
    qids = np.concatenate(qs) if qs else np.empty((0, 2), np.uint64)
    indexed = ((lambda raw: ref.store.indexed(np.frombuffer(raw, "<u8").reshape(-1, 2)))
               if cfg.block_locators else None)
    res, meta, tops, hspans, rounds = kernel.match(
        K, np.ascontiguousarray(qids, np.uint64), lens, flat, sb, router.geo.gap, cfg.window_cap,
        ref.store.read, indexed, np.array(ks, np.int64), cfg.exact_match, None,
        np.array(wants, np.int64) if any(wants) or src.flag() else None)
    got = [(int(n), meta[a : a + n].tolist(), [tuple(t) for t in tops[b : b + c].tolist()],
            [tuple(t) for t in hspans[d : d + e].tolist()]) for n, a, b, c, d, e in res.tolist()]
    assert got == want, "match: not the reference index's answers"
    assert rounds == want_rounds, "match: not the reference's rounds"


def _check_assemble(src: Source) -> None:
    """As test_kernel's test_assemble_is_match_holders."""
    assert K is not None
    sb = 8
    nq = src.integer(0, 5)
    rows: list[list[int]] = []
    best: list[int] = []
    sids: list[int] = []
    spans: list[tuple[int, int]] = []
    segs: dict[int, Segment] = {}
    for q in range(nq):
        lo = len(rows)
        for w in range(src.integer(0, 4)):
            length = src.integer(1, sb)
            run = src.integer(0, length)
            row = [0] * R
            row[kernel.Q], row[kernel.W], row[kernel.LEN] = q, w, length
            sid = 0
            if run:
                sid = len(segs) + 1
                meta = np.array([src.integer(1, 3) for _ in range(run)], np.uint64)
                table = src.chance(25)
                xm = np.array([9], np.uint64) if table else np.empty(0, np.uint64)
                xk = np.array([1], np.uint64) if table else np.empty(0, np.uint64)
                ids = src.u64s((run, 2))
                if src.chance(10):  # strided metas: read as they are
                    meta = np.repeat(meta, 2)[::2]
                segs[sid] = Segment(sid, w, (1 << run) - 1, 0, ids, meta, xm, xk)
            rows.append(row)
            best.append(run)
            sids.append(sid)
        spans.append((lo, len(rows)))
    span = np.array(spans, np.int64).reshape(-1, 2)
    ks = [src.integer(0, 4) for _ in range(nq)]
    wants = [src.flag() for _ in range(nq)]
    res_b, meta_b, tops_b, spans_b = K.assemble(
        np.array(rows, np.int64).reshape(-1, R), span, np.array(best, np.int64),
        np.array(sids, np.uint64), segs, np.array(ks, np.int64), np.array(wants, np.int64))
    check_answers(np.frombuffer(res_b, np.int64).reshape(-1, kernel.RES_FIELDS),
                  np.frombuffer(meta_b, np.uint64), np.frombuffer(tops_b, np.uint64).reshape(-1, 2),
                  np.frombuffer(spans_b, np.uint64).reshape(-1, 3), rows, spans, best, sids,
                  segs, ks, wants)


def u64_form_k(src: Source, arr: U64) -> tuple[object, bool]:
    """u64_form for the kernel's arrays: never unaligned while the kernel reads them
    through typed pointers (undefined behaviour: test_found.py, the sanitized run)."""
    return u64_form(src, arr, unaligned=False)


def _i64_form(src: Source, arr: I64) -> tuple[object, bool]:
    """u64_form_k for an int64 array: int64 is this one's right dtype, uint64 is not."""
    obj, ok = u64_form_k(src, arr.view(np.uint64))
    if (isinstance(obj, np.ndarray) and obj.dtype in (np.uint64, np.int64)
            and obj.dtype.byteorder in "=|"):
        signed = obj.view(np.int64) if obj.dtype == np.uint64 else obj
        return signed, bool(signed.flags.c_contiguous) and (ok or obj.dtype == np.int64)
    return obj, False


def _check_merge(src: Source) -> None:
    assert K is not None
    n = src.integer(0, 60)
    keys = src.u64s(n, pool=src.pick([0, 1, 3, 8]))
    n0 = src.integer(0, n)
    old = np.argsort(keys[:n0], kind="stable")
    old_keys = keys[:n0][old]
    garbage = src.chance(15)
    if garbage:  # no stable order of keys[:n0]: any answer of n rows, no crash
        old = src.u64s(n0).view(np.int64)
        old_keys = src.u64s(n0)
    (a, ok_a), (b, ok_b), (c, ok_c) = (u64_form_k(src, keys), _i64_form(src, old),
                                       u64_form_k(src, old_keys))
    got, err = outcome(lambda: K.merge_order(a, b, c))
    if not (ok_a and ok_b and ok_c):
        refused(err, "merge_order")
        return
    assert err is None, f"merge_order refused valid arguments: {err!r}"
    assert got is not None
    order, ordered = np.frombuffer(got[0], np.int64), np.frombuffer(got[1], np.uint64)
    assert len(order) == len(ordered) == n, "merge_order: not one row per key"
    if not garbage:
        stable = np.argsort(keys, kind="stable")
        assert order.tolist() == stable.tolist(), "merge_order: not the stable argsort"
        assert ordered.tolist() == keys[stable].tolist(), "merge_order: keys"


def _fits(row: list[int], starts: list[int], nid: int, nf: int, sb: int) -> bool:
    q, w, length, fs, fc = (row[kernel.Q], row[kernel.W], row[kernel.LEN], row[kernel.FSTART],
                            row[kernel.FCOUNT])
    return (0 <= q < len(starts) and w >= 0 and 0 <= length <= sb and fs >= 0 and fc >= 0
            and fs + fc <= nf and 0 <= starts[q] <= nid and starts[q] + w * sb + length <= nid)


def _check_raw(src: Source) -> None:
    """route, verify and assemble called with arguments no caller builds."""
    assert K is not None
    nid = src.integer(0, 40)
    qids = src.u64s((nid, 2), pool=src.pick([1, 4]))
    cuts = sorted(src.integer(0, nid) for _ in range(src.integer(0, 4)))
    qlens = np.diff(np.array([0, *cuts, nid], np.int64))
    nb, nd = src.integer(0, 12), src.integer(0, 12)
    keys = qids[:, 0] if nid else np.zeros(1, np.uint64)
    bkeys = np.sort(keys[[src.integer(0, len(keys) - 1) for _ in range(nb)]].astype(np.uint64))
    dkeys = keys[[src.integer(0, len(keys) - 1) for _ in range(nd)]].astype(np.uint64)
    args: list[object] = [qids, qlens, bkeys, src.u64s(nb), src.u64s(nb), dkeys, src.u64s(nd),
                          src.u64s(nd), np.argsort(dkeys, kind="stable").astype(np.int64),
                          src.pick([1, 2, 8, 64]), src.pick([1, 2, 4, 7]), src.pick([1, 2, 40])]
    bad = src.integer(0, 14)
    if bad == 1:
        at = src.integer(0, 8)
        arr = args[at]
        assert isinstance(arr, np.ndarray)
        args[at], ok = (u64_form_k(src, arr) if arr.dtype == np.uint64
                        else _i64_form(src, arr))
    elif bad == 2:
        at = src.integer(9, 11)  # sb in 1..64, gap and cap >= 1 (any size)
        args[at] = src.pick([0, -1, 2**63, 2**64, None, 1.5, *([65, 2**62] if at == 9 else [])])
        ok = False
    elif bad == 3:  # qlens that do not add up, are negative or huge
        args[1] = src.pick([qlens + 1, -qlens - 1, np.array([2**62, 2**62], np.int64),
                            np.array([2**63 - 1], np.int64), np.append(qlens, 1)])
        ok = False
    elif bad == 4 and nd:  # dorder out of range
        d = np.argsort(dkeys, kind="stable").astype(np.int64)
        d[src.integer(0, nd - 1)] = src.pick([-1, nd, 2**63 - 1])
        args[8] = d
        ok = False
    elif bad == 5:  # base and delta lengths that differ
        args[src.pick([3, 4, 6, 7, 8])] = np.zeros(13, np.uint64)
        ok = False
    elif bad == 6:  # an unsorted base, a delta order that is a permutation: no crash
        args[2] = src.u64s(nb)
        args[8] = np.array(np.random.default_rng(nd).permutation(nd), np.int64)
        ok = True
    elif bad == 7:  # huge gap and cap: fine
        args[10], args[11] = src.pick([2**40, 2**62]), src.pick([2**40, 2**62])
        ok = True
    else:
        ok = True
    got, err = outcome(lambda: K.route(*args))
    if not ok:
        refused(err, "route")
        return
    assert err is None, f"route refused valid arguments: {err!r}"
    assert got is not None
    rows = np.frombuffer(got[0], np.int64).reshape(-1, R)
    first = np.frombuffer(got[1], np.uint64)
    sb = int(args[9])  # type: ignore[call-overload]
    for row in rows.tolist():
        assert 0 <= row[kernel.OFF] < row[kernel.LEN] <= sb, f"route: row {row}"
        assert 0 <= row[kernel.FSTART] <= row[kernel.FSTART] + row[kernel.FCOUNT] <= len(first)
        assert 0 <= row[kernel.BLO] <= row[kernel.BHI] <= nb, f"route: row {row}"
        assert 0 <= row[kernel.DLO] <= row[kernel.DHI] <= nd, f"route: row {row}"
    # verify and assemble on rows of garbage: refused by row, or answered as the reference
    nr = src.integer(0, 4)
    vrows = np.zeros((nr, R), np.int64)
    for r in range(nr):
        for f in (kernel.Q, kernel.W, kernel.LEN, kernel.FSTART, kernel.FCOUNT):
            vrows[r, f] = src.pick([0, 1, 2, 3, 8, -1, 2**62, -(2**63)]) if src.chance(20) \
                else src.integer(0, 4)
    starts = np.cumsum(qlens) - qlens if src.chance(80) else src.u64s(len(qlens)).view(np.int64)
    vfirst = src.u64s(src.integer(0, 6), pool=3)
    vsb = src.pick([1, 2, 8, 64])
    segs: dict[int, Any] = {int(s): Segment(int(s), src.integer(0, 2), src.u64(), 0,
                                            src.u64s((src.integer(0, 9), 2), pool=2),
                                            np.zeros(0, np.uint64)) for s in vfirst}
    vgot, verr = outcome(lambda: K.verify(qids, starts, vrows, vfirst, segs, vsb))
    fits = [_fits(row, starts.tolist(), nid, len(vfirst), vsb) for row in vrows.tolist()]
    if all(fits):
        assert verr is None, f"verify refused rows that fit: {verr!r}"
        assert vgot is not None
        routed = kernel.Routed(qids, starts, vrows, vfirst, None)  # type: ignore[arg-type]
        want = reference_verify(routed, segs, vsb)
        got_v = list(zip(np.frombuffer(vgot[0], np.int64).tolist(),
                         np.frombuffer(vgot[1], np.uint64).tolist(), strict=True))
        assert got_v == want, "verify: not the reference's on rows that fit"
    else:
        refused(verr, "verify(rows that do not fit)")
        assert f"rows[{fits.index(False)}]" in str(verr), f"verify: {verr}"
    spans = np.array([[src.integer(-1, nr + 1), src.integer(-1, nr + 1)]
                      for _ in range(src.integer(0, 3))], np.int64).reshape(-1, 2)
    best = np.array([src.integer(-1, 9) for _ in range(nr)], np.int64)
    sids = vfirst[:nr] if len(vfirst) >= nr and src.flag() else np.zeros(nr, np.uint64)
    _, aerr = outcome(lambda: K.assemble(vrows, spans, best, sids, segs))
    clean(aerr, "assemble", *SEG_ERRORS)
    nq = len(spans)
    ws = src.pick([None, np.ones(nq, np.int64), np.ones(nq + 1, np.int64), np.ones(nq, np.uint64),
                   np.ones((nq, 1), np.int64), [1] * nq, 1])
    _, werr = outcome(lambda: K.assemble(vrows, spans, best, sids, segs, np.zeros(nq, np.int64),
                                         ws))
    clean(werr, "assemble(with_spans)", *SEG_ERRORS)


def _u64(sid: object) -> bool:
    return type(sid) is int and 0 <= sid < 2**64


def _sid(src: Source) -> Any:
    """A segment id: mostly a few small ones (repeats), at times hostile."""
    if src.chance(90):
        return src.integer(0, 24)
    return src.pick([-1, 2**64, 2**64 - 1, "7", 1.0, None])


def _check_cache(src: Source) -> None:
    cap = src.integer(0, 12)
    c, ref = K.SegmentCache(cap), SegmentCache(cap)
    for step in range(src.integer(0, 40)):
        op = src.integer(0, 5)
        if op == 0:  # put_many: a mapping of ids to objects (None at times)
            segs = {_sid(src): (None if src.chance(3) else object())
                    for _ in range(src.integer(0, 6))}
            arg: Any = segs if src.chance(95) else list(segs)
            _, err = outcome(functools.partial(c.put_many, arg))
            _, werr = outcome(functools.partial(ref.put_many, arg))
            if not isinstance(arg, dict) or not all(_u64(k) for k in segs):
                refused(err, "put_many(hostile ids or not a mapping)", OverflowError)
            if err is not None or werr is not None:
                clean(err, "put_many", TypeError, ValueError, OverflowError)
                c.clear()  # a refused put may have applied its first entries: start over
                ref.clear()
        elif op == 1:
            sids = [_sid(src) for _ in range(src.integer(0, 8))]
            got, err = outcome(functools.partial(c.hits, sids))
            if err is not None:
                clean(err, "hits", TypeError, OverflowError)
                c.clear()
                ref.clear()
            else:
                want = ref.hits(sids)
                assert list(got[0].items()) == list(want[0].items()) and got[1] == want[1]
        elif op == 2:
            sid = _sid(src)
            assert (sid in c) == (_u64(sid) and sid in ref)
            if _u64(sid):
                assert c.get(sid) is ref.get(sid)
        elif op == 3:
            c.capacity = ref.capacity = src.integer(0, 12)
        else:
            c.clear()
            ref.clear()
        assert c.items() == ref.items() and len(c) == len(ref), step
        assert c._audit()


def _stored_value(src: Source, sid: int) -> object:
    """What a multi-get may give for segment sid: a sound value, one damaged (bytes
    flipped, torn, grown, its header's counts changed), another's, random bytes, None."""
    n, h = src.integer(1, 64), src.integer(0, 3)
    ids = src.u64s((n, 2), pool=4)
    presence = src.u64() | 1
    meta = src.u64s(n, pool=4)
    xmeta = np.unique(src.u64s(h))
    xmask = np.array([(src.u64() & presence) or 1 for _ in range(len(xmeta))], np.uint64)
    value = bytearray(encode_segment(Segment(sid if src.chance(90) else sid + 1,
                                             src.u64() >> src.integer(0, 63), presence,
                                             src.u64(), ids, meta, xmeta, xmask)))
    for _ in range(src.integer(0, 3) if src.chance(40) else 0):
        value[src.integer(0, len(value) - 1)] ^= 1 << src.integer(0, 7)
    kind = src.integer(0, 9)
    if kind == 0:
        return bytes(value[: src.integer(0, len(value))])
    if kind == 1:
        return bytes(value) + src.raw(src.integer(1, 24))
    if kind == 2:
        return src.raw(src.integer(0, 200))
    if kind == 3:
        return None if src.flag() else bytearray(value)
    return bytes(value)


def _check_values(src: Source) -> None:
    """put_values of sound and hostile stored values: the native cache holds what the
    reference's decoder accepts, no more, and decodes it to the same segment."""
    cap = src.integer(0, 12)
    c, ref = K.SegmentCache(cap), SegmentCache[Any](cap)
    c.decoder = ref.decoder = lambda sid, value: decode_segment(value, sid)
    for step in range(src.integer(1, 6)):
        sids = [src.integer(0, 24) for _ in range(src.integer(0, 8))]
        values = [_stored_value(src, sid) for sid in sids]
        got, want = c.put_values(sids, values), ref.put_values(sids, values)
        assert list(got) == list(want), step
        for sid in sids if src.flag() else []:
            a, b = c.get(sid), ref.get(sid)
            assert (a is None) == (b is None)
            if a is not None:
                assert encode_segment(a) == encode_segment(b), sid
        assert [k for k, _ in c.items()] == [k for k, _ in ref.items()] and c._audit()


def one_input(data: bytes) -> None:
    if K is None:
        return
    src = Source(data)
    src.pick([_check_route, _check_verify, _check_verify, _check_assemble, _check_merge,
              _check_match, _check_match, _check_raw, _check_raw, _check_cache,
              _check_values])(src)


@pytest.mark.skipif(K is None, reason="the match kernel is not built")
def test_replay() -> None:
    replay(one_input, seed=4, runs=300, max_len=3000)


if __name__ == "__main__":
    from tests.fuzz._common import fuzz

    fuzz(one_input, sys.argv)
