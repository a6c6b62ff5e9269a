"""Read-only inspection: one sequence for the `dump` op (`sarpctl dump`), the
branches after a chain (`branches`: what a cluster's region owner keeps when it splits
a shared head, issue 27), and every chain's first block (`chain_starts`: what
`sarpctl cluster reshard` places).

For each 64-block window of the sequence, from window 0: every lattice offset's
routing key and its posting list in the routing directory (live entries only), the
candidate segments a match would read (`Router.route_window`), and the decoded
contents of those segments, with the verified run of each against the query. It
stops after the first window with no routing hit (a match cannot get past it) or
after `MAX_WINDOWS` windows. Nothing is changed: no counters, no directory, no
segment cache beyond what `Store.fetch` does for any read.

Ids are shown in the external form (what `match` with `with_ids` returns and what
`hashes`/`ids`/`parent` take): salted per namespace for both token and hash
sequences (docs/DECISIONS.md, "Ids and namespaces").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from sarpd.core import verify
from sarpd.core.directory import DEAD
from sarpd.core.ids import id_bytes, salt_ids
from sarpd.core.index import SarpIndex
from sarpd.core.segment import (
    LINK_PREFIX,
    SEG_PREFIX,
    Segment,
    decode_segment,
    seg_id_of_key,
)
from sarpd.errors import SarpError
from sarpd.model import IdArray, SeqSpec, ids_from_bytes, ids_to_bytes

MAX_WINDOWS = 64  # windows reported at most
SCAN_BATCH = 4096  # segments between two progress calls (chain_starts)
MAX_POSTINGS = 32  # posting entries listed per routing key (the count is always given)


def dump_sequence(index: SarpIndex, seq: SeqSpec) -> dict[str, Any]:
    """The `dump` result: a msgpack-able map (see PROTOCOL.md, `dump`)."""
    q = index.store.seq_ids(seq)
    sb = index.router.geo.sb
    windows: list[dict[str, Any]] = []
    matched = 0
    for w in range(min(MAX_WINDOWS, -(-len(q) // sb))):
        qw = q[w * sb : (w + 1) * sb]
        entry, run = _window(index, seq.ns, qw, w)
        windows.append(entry)
        if matched == w * sb:  # still gap-free: extend the prefix
            matched += run
        if not entry["candidates"]:
            break
    return {
        "ns": seq.ns,
        "blocks": len(q),
        "matched_blocks": matched,
        "windows": windows,
        "truncated": len(q) > len(windows) * sb,
    }


def _window(index: SarpIndex, ns: str, qw: IdArray, w: int) -> tuple[dict[str, Any], int]:
    probes = []
    offsets = [o for o in index.router.geo.offsets if o < len(qw)]
    hits = index.dir.probe(qw[offsets, 0].astype(np.uint64))
    for o, hit in zip(offsets, hits, strict=True):
        key = int(qw[o, 0])
        segs, filts = index.dir.posting(key) if hit else (np.empty(0), np.empty(0))
        live = segs != DEAD
        segs, filts = segs[live], filts[live]
        probes.append({
            "offset": o,
            "key": key,
            "postings": int(segs.size),
            "entries": [[int(s), int(f)] for s, f in
                        zip(segs[:MAX_POSTINGS].tolist(), filts[:MAX_POSTINGS].tolist(),
                            strict=True)],
        })
    candidates = [int(s) for s in index.router.route_window(qw, w)]
    fetched = index.store.fetch(candidates)
    segments = [_segment(index, ns, sid, fetched.get(sid), qw, w) for sid in candidates]
    best = max((s.get("run", 0) for s in segments), default=0)
    entry = {
        "window": w,
        "blocks": len(qw),
        "probes": probes,
        "candidates": candidates,
        "segments": segments,
        "run": best,
    }
    return entry, best


def _segment(index: SarpIndex, ns: str, sid: int, seg: Segment | None, qw: IdArray, w: int
             ) -> dict[str, Any]:
    if seg is None:
        return {"id": sid, "error": "missing or failed its checks (see sarpctl check)"}
    run = 0
    if seg.window == w:
        n = min(seg.nblocks, len(qw))
        same = verify.first_mismatch(seg.ids[:n], qw[:n], index.k)
        run = min(same, seg.present_run(0))
    return {
        "id": sid,
        "window": seg.window,
        "nblocks": seg.nblocks,
        "presence": seg.presence,
        "ns_tag": seg.ns_tag,
        "run": run,
        "ids": ids_to_bytes(salt_ids(ns, seg.ids)),
        "meta": np.ascontiguousarray(seg.meta, dtype="<u8").tobytes(),
    }


def dump_or_error(index: object, seq: SeqSpec) -> dict[str, Any] | SarpError:
    if not isinstance(index, SarpIndex):
        return SarpError(f"dump: the index ({type(index).__name__}) cannot be inspected")
    return dump_sequence(index, seq)


def branches(index: SarpIndex, head: IdArray) -> IdArray:
    """Every block stored right after the chain `head` ((d, 2) internal ids from block
    0): the ids at position d of the stored chains that go on from it, present or not
    (a block removed since keeps its id in its segment), each once, sorted.

    Inside a window they are in the segments under the window's head key (every
    segment of a window starts at the window's first block). A block that starts a
    window (d a multiple of segment_blocks) is in a segment of its own window, which
    does not name the block before it: those come from the branch links, written only
    with `[index] branch_links` (ValueError without them)."""
    d, sb = len(head), index.router.geo.sb
    if d == 0:
        raise ValueError("branches: a head of no block")
    if d % sb:
        w, at = (d - 1) // sb, (d - 1) % sb
        sids = [s for s in index.dir.posting(int(head[w * sb, 0]))[0].tolist() if s != DEAD]
        last = head[-1]
        found = [seg.ids[at + 1] for seg in index.store.fetch(sids).values()
                 if seg is not None and seg.window == w and seg.nblocks > at + 1
                 and bool((seg.ids[at] == last).all())]
        out = np.array(found, dtype=np.uint64).reshape(-1, 2)
    else:
        if not index.store.cfg.branch_links:
            raise ValueError(f"branches: a head of {d} blocks ends at a window start and "
                             "this index keeps no branch links ([index] branch_links)")
        start = LINK_PREFIX + id_bytes(head[-1])  # every link key after it: + 16 bytes
        keys = [k for k, _ in index.store.scan(start, start + b"\xff" * 17)]
        out = ids_from_bytes(b"".join(k[len(start):] for k in keys if k.startswith(start)))
    return np.unique(out, axis=0) if len(out) else out


@dataclass(frozen=True, slots=True, eq=False)
class ChainStarts:
    """What `chain_starts` found: every chain's block 0 and the branch links' cover."""

    firsts: IdArray  # internal ids at position 0, present or not, each once, sorted
    window_starts: int  # distinct blocks at a window start past window 0
    unlinked: int  # those no branch link names as a child (data written without links)


def chain_starts(index: SarpIndex, progress: Callable[[int], None] | None = None,
                 ) -> ChainStarts:
    """One pass over every segment (offline work: a reshard). `progress`: called with
    the segments read so far, every SCAN_BATCH."""
    firsts: list[IdArray] = []
    starts: list[IdArray] = []
    # a segment's window and first block never change (its later records, issue 24,
    # extend or refill it): its base record says both
    for n, (key, value) in enumerate(index.store.scan(SEG_PREFIX, b"T"), 1):
        seg = decode_segment(value, seg_id_of_key(key), index.store.k)
        (firsts if seg.window == 0 else starts).append(seg.ids[:1])
        if progress is not None and n % SCAN_BATCH == 0:
            progress(n)
    linked = {k[1 + 16:] for k, _ in index.store.scan(LINK_PREFIX, LINK_PREFIX + b"\xff")}
    heads = _unique(firsts)
    window = _unique(starts)
    unlinked = sum(1 for row in window if id_bytes(row) not in linked)
    return ChainStarts(heads, len(window), unlinked)


def _unique(rows: list[IdArray]) -> IdArray:
    if not rows:
        return np.zeros((0, 2), dtype=np.uint64)
    return np.unique(np.concatenate(rows), axis=0)
