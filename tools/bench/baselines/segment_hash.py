"""Segment-Hash: 64-block segments keyed directly from the query's ids, no directory.

Two variants (RESULTS.md reports both):
- `segment-hash`: segments keyed by the id of their LAST block (strongest we found);
- `segment-hash-head`: segments keyed by the id at the segment head (the design brief's version).

Segment value (both): the window's ids from its head to its last block, then their
metas (raw little-endian uint64, 2 x L x 8 bytes). Ids are salted by namespace.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import numpy.typing as npt

from backends.base import WriteBatch
from tools.bench.api import Ids
from tools.bench.baselines._common import (
    U64,
    WINDOW,
    BackendBaseline,
    BaselineError,
    be_key,
    be_keys,
    check_insert_args,
    first_miss,
    metas_array,
    pack_u64,
    run_length,
    salted,
    unpack_u64,
)

SEG = b"S"  # S + id of the segment's last block -> ids + metas of window[head..last]
LOC = b"L"  # L + block id -> id of the last block of the segment that first held it
HEAD = b"H"  # H + head id + last id -> ids + metas (segment-hash-head)

Getter = Callable[[list[bytes]], list[bytes | None]]


def _all_metas(matched: U64, new: npt.NDArray[np.uint64]) -> U64:
    """Metas of a whole sequence: those already indexed (first insert wins), then
    the new ones."""
    return np.concatenate([matched, np.asarray(new, dtype=np.uint64)[len(matched):]])


@dataclass(slots=True)
class _State:
    """One query's progress: `m` blocks matched, `todo` the next read it needs."""

    q: U64
    parts: list[U64] = field(default_factory=list)
    m: int = 0
    todo: str = ""  # "", "window", "locate", "segment"
    seg_key: bytes = b""
    tail_keyed: bool = False  # a segment keyed by the query's last block exists

    def metas(self) -> U64:
        return metas_array(self.parts)

    def apply(self, value: bytes | None) -> None:
        """Extend the match with a segment of the window holding block `m` (its ids
        verified against the query); then decide the next read."""
        if value is None:
            raise BaselineError(f"segment-hash: segment {self.seg_key.hex()} is missing")
        seg = unpack_u64(value)
        length = len(seg) // 2
        a = self.m - self.m % WINDOW
        off = self.m - a
        n = len(self.q)
        run = run_length(seg[off:length], self.q[self.m: a + length])
        self.parts.append(seg[length + off: length + off + run])
        self.m += run
        if self.m == n:
            self.tail_keyed = a + length == n
            self.todo = ""
        elif run == 0:
            self.todo = ""  # the segment disagrees at once (a 64-bit id collision)
        elif self.m % WINDOW == 0:
            self.todo = "window"
        else:
            self.todo = "locate"


class SegmentHash(BackendBaseline):
    """Segment-Hash, keyed by the last block: every 64-block window of an inserted
    sequence is one backend value (the window's ids + metas from its head to the
    sequence's last block in it), keyed by the salted id of that last block (block 63
    for a full window, the last block for a partial tail). Each new block also gets a
    small locator key (block id -> key of the segment that first held it), written in
    the same batch; they make the match exact where a query leaves a stored segment
    in the middle of a window (e.g. a new session sharing a system prompt of 20
    blocks), which no key derived from the query alone can reach.
    Match, batched over all prompts: round 1 is ONE multi-get of the block-63 key of
    every full window the prompt covers plus the keys of every position of its partial
    last window; windows are taken in order, a hit is verified against the prompt's
    ids and the next window is used only if this one matched fully; in a partial
    window the deepest hit wins. Where the match stops inside a window, one multi-get
    of the key of every position of that window (at most 64; misses cost a Bloom
    probe) finds the deepest segment, then the locator of the first unmatched block
    is read (a Bloom-cheap miss when the block is new); a hit reads its segment and
    the match continues from there. Insert: the same match (one batch for all
    sequences; a sequence that shares blocks new in the batch is matched again
    against the pending writes), then one write batch with a segment per window
    holding new blocks (already indexed blocks keep their metas) and a locator per new
    block. No memory per entry."""

    name = "segment-hash"

    def _open_state(self) -> None:
        self._open_backend()

    # -- match -------------------------------------------------------------------

    def _round1(self, states: list[_State], get: Getter) -> None:
        keys: list[bytes] = []
        for st in states:
            n = len(st.q)
            full = n // WINDOW
            keys += be_keys(st.q[WINDOW - 1: full * WINDOW: WINDOW], SEG)
            keys += be_keys(st.q[full * WINDOW: n], SEG)
        values = get(keys) if keys else []
        off = 0
        for st in states:
            n = len(st.q)
            full = n // WINDOW
            fulls = values[off: off + full]
            tail = values[off + full: off + n - full * WINDOW + full]
            off += full + len(tail)
            self._take_round1(st, fulls, tail)

    @staticmethod
    def _take_round1(st: _State, fulls: list[bytes | None], tail: list[bytes | None]) -> None:
        """Full windows in order, the hits verified in one numpy op; then the tail."""
        j = first_miss(fulls)
        hits = cast("list[bytes]", fulls[:j])
        if hits:
            seg = unpack_u64(b"".join(hits))
            if len(seg) != j * 2 * WINDOW:  # not all full segments: verify one by one
                for v in hits:
                    st.apply(v)
                    if st.todo != "window":
                        return
            else:
                seg = seg.reshape(j, 2 * WINDOW)
                ok = (seg[:, :WINDOW] == st.q[: j * WINDOW].reshape(j, WINDOW)).all(axis=1)
                k = int(ok.argmin()) if not ok.all() else j
                st.parts.append(seg[:k, WINDOW:].ravel())
                st.m = k * WINDOW
                if k < j:  # a 64-bit id collision: let the window's own path decide
                    st.apply(hits[k])
                    return
        n = len(st.q)
        if st.m == n:
            st.tail_keyed, st.todo = n > 0, ""
        elif j < len(fulls):
            st.todo = "window"
        else:
            st.todo = ""
            _take_deepest(st, tail)

    def _match(self, qs: list[U64], get: Getter) -> list[_State]:
        states = [_State(q) for q in qs]
        self._round1(states, get)
        while todo := [st for st in states if st.todo]:
            keys: list[list[bytes]] = []
            for st in todo:
                if st.todo == "window":
                    a = st.m
                    keys.append(be_keys(st.q[a: min(a + WINDOW, len(st.q))], SEG))
                elif st.todo == "locate":
                    keys.append([be_key(LOC, int(st.q[st.m]))])
                else:
                    keys.append([st.seg_key])
            values = get([k for ks in keys for k in ks])
            off = 0
            for st, ks in zip(todo, keys, strict=True):
                vs = values[off: off + len(ks)]
                off += len(ks)
                if st.todo == "window":
                    _take_deepest(st, vs)
                elif st.todo == "locate":
                    if vs[0] is None:
                        st.todo = ""
                    else:
                        st.seg_key, st.todo = SEG + vs[0], "segment"
                else:
                    st.apply(vs[0])
        return states

    def match_many(self, prompts: Sequence[Ids], ns: Sequence[str]) -> list[U64]:
        qs = [salted(p, n) for p, n in zip(prompts, ns, strict=True)]
        return [st.metas() for st in self._match(qs, self.backend.get_many)]

    # -- insert ------------------------------------------------------------------

    def insert_many(self, seqs: Sequence[Ids], ns: Sequence[str],
                    metas: Sequence[npt.NDArray[np.uint64]]) -> None:
        check_insert_args(seqs, ns, metas, self.name)
        qs = [salted(s, n) for s, n in zip(seqs, ns, strict=True)]
        found = self._match(qs, self.backend.get_many)
        puts: dict[bytes, bytes] = {}
        pending: set[int] = set()

        def overlay(keys: list[bytes]) -> list[bytes | None]:
            vals = self.backend.get_many(keys)
            return [puts.get(k, v) for k, v in zip(keys, vals, strict=True)]

        for q, st, new in zip(qs, found, metas, strict=True):
            if pending and st.m < len(q) and int(q[st.m]) in pending:
                st = self._match([q], overlay)[0]
            _plan(q, st, new, puts)
            pending.update(q[st.m:].tolist())
        self.backend.write(WriteBatch(puts=puts), self.sync)
        self.remember_probe(seqs, ns)


def _take_deepest(st: _State, values: list[bytes | None]) -> None:
    """Values of the segment keys of window positions m, m+1, ...: the deepest hit
    wins; where the match stops inside the window, the locator takes over."""
    for i in range(len(values) - 1, -1, -1):
        if values[i] is not None:
            st.apply(values[i])
            return
    st.todo = "locate"


def _plan(q: U64, st: _State, new: npt.NDArray[np.uint64], puts: dict[bytes, bytes]) -> None:
    """The writes of one sequence whose first `st.m` blocks are indexed."""
    n, m = len(q), st.m
    if m == n:
        if n and not st.tail_keyed:  # a new tail key for blocks held by a longer segment
            a = (n - 1) - (n - 1) % WINDOW
            puts[be_key(SEG, int(q[n - 1]))] = pack_u64(q[a:n], st.metas()[a:n])
        return
    allm = _all_metas(st.metas(), new)
    for a in range(m - m % WINDOW, n, WINDOW):
        last = min(a + WINDOW, n) - 1
        last_key = int(q[last]).to_bytes(8, "big")
        puts[SEG + last_key] = pack_u64(q[a: last + 1], allm[a: last + 1])
        for k in be_keys(q[max(a, m): last + 1], LOC):
            puts[k] = last_key


# ---------------------------------------------------------------------------------


@dataclass(slots=True)
class _HeadMatch:
    m: int
    parts: list[U64]
    best_key: bytes = b""  # the deepest candidate of the window where the match ended
    best_whole: bool = False  # ... fully matched (a prefix of the query's window)
    best_window: int = -1


def _best(cands: list[tuple[bytes, bytes]], qw: U64) -> tuple[int, int, U64, int]:
    """(index, run, metas of the run, its length) of the candidate segment agreeing
    longest with the query window `qw`; all candidates verified in one numpy op."""
    if len(cands) == 1:
        seg = unpack_u64(cands[0][1])
        length = len(seg) // 2
        run = run_length(seg[:length], qw)
        return 0, run, seg[length: length + run], length
    lens = np.array([len(v) for _, v in cands], dtype=np.int64) // 16
    buf = unpack_u64(b"".join(v for _, v in cands))
    starts = np.concatenate([[0], np.cumsum(2 * lens)[:-1]])
    rows = np.repeat(np.arange(len(cands)), lens)
    cols = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
    width = len(qw)
    keep = cols < width
    eq = np.zeros((len(cands), width + 1), dtype=bool)
    eq[rows[keep], cols[keep]] = buf[(np.repeat(starts, lens) + cols)[keep]] == qw[cols[keep]]
    runs = eq.argmin(axis=1)
    c = int(runs.argmax())
    run = int(runs[c])
    s, length = int(starts[c]), int(lens[c])
    return c, run, buf[s + length: s + length + run], length


class SegmentHashHead(BackendBaseline):
    """Segment-Hash, keyed by the segment head (the design brief's version): every segment
    of window w is stored under key `H + id(head of w) + id(its last block)`, so all
    segments sharing a head are one contiguous key range. Match: per window in order,
    one range scan of the query's head id reads every segment under that head; all are
    verified against the query in one numpy operation; the deepest wins and the next
    window is used only if this one matched fully. Insert: match, then per window
    holding new blocks one segment (a branch copies the shared head of the window; an
    extended partial tail replaces the old one, which is deleted), in one write batch.
    On a hot shared prefix every query reads one segment per session under that
    head: this is the weakness RESULTS.md shows next to `segment-hash`."""

    name = "segment-hash-head"

    def _open_state(self) -> None:
        self._open_backend()

    def _match_one(self, q: U64,
                   scan: Callable[[bytes], Iterable[tuple[bytes, bytes]]]) -> _HeadMatch:
        res = _HeadMatch(0, [])
        for a in range(0, len(q), WINDOW):
            qw = q[a: a + WINDOW]
            cands = list(scan(be_key(HEAD, int(q[a]))))
            if not cands:
                break
            c, run, metas, length = _best(cands, qw)
            res.parts.append(metas)
            res.m = a + run
            res.best_key, res.best_whole, res.best_window = cands[c][0], run == length, a
            if run < WINDOW:
                break
        return res

    def _scan(self, prefix: bytes) -> list[tuple[bytes, bytes]]:
        end = (int.from_bytes(prefix, "big") + 1).to_bytes(len(prefix), "big")
        return list(self.backend.scan(prefix, end))

    def match_many(self, prompts: Sequence[Ids], ns: Sequence[str]) -> list[U64]:
        return [metas_array(self._match_one(salted(p, n), self._scan).parts)
                for p, n in zip(prompts, ns, strict=True)]

    def insert_many(self, seqs: Sequence[Ids], ns: Sequence[str],
                    metas: Sequence[npt.NDArray[np.uint64]]) -> None:
        check_insert_args(seqs, ns, metas, self.name)
        wb = WriteBatch()
        by_head: dict[bytes, set[bytes]] = {}

        def scan(prefix: bytes) -> list[tuple[bytes, bytes]]:
            items = self._scan(prefix)
            mine = by_head.get(prefix)
            if not mine:
                return items
            found = dict(items)
            for k in mine:
                if k in wb.deletes:
                    found.pop(k, None)
                else:
                    found[k] = wb.puts[k]
            return list(found.items())

        for s, n, new in zip(seqs, ns, metas, strict=True):
            q = salted(s, n)
            res = self._match_one(q, scan)
            if res.m == len(q):
                continue
            allm = _all_metas(metas_array(res.parts), new)
            first = res.m - res.m % WINDOW
            if res.best_whole and res.best_window == first:
                wb.delete(res.best_key)  # a partial tail the new segment extends
                by_head.setdefault(res.best_key[:9], set()).add(res.best_key)
            for a in range(first, len(q), WINDOW):
                last = min(a + WINDOW, len(q)) - 1
                key = be_key(HEAD, int(q[a]), int(q[last]))
                wb.put(key, pack_u64(q[a: last + 1], allm[a: last + 1]))
                by_head.setdefault(key[:9], set()).add(key)
        self.backend.write(wb, self.sync)
        self.remember_probe(seqs, ns)
