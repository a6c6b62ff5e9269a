"""`check`: an fsck of the index (what `sarpctl check [--fix]` runs in the daemon).

Reports, and changes nothing unless `fix`:
- segments that fail their checksum or layout checks (never served; with fix they
  are deleted, and their blocks are no longer matched);
- segments not routed at offset 0 of their window (with fix: registered);
- directory entries that point at a missing segment, or whose key is not the id of
  a block of that segment at a routing offset (with fix: dropped);
- counters that disagree with the segments (with fix: rewritten);
- snapshot files that fail their checks (recovery skips them; with fix: deleted);
- an engine that reports corruption while the segments are scanned (e.g. a BloomStore
  page that fails its checksum): reported; the directory and counter checks, and every
  repair, are then skipped, since the segments after the damage are unknown.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from backends.base import WriteBatch
from sarpd.core.delta import DELTA_PREFIX, by_segment, merge
from sarpd.core.native import Kernels
from sarpd.core.router import Router
from sarpd.core.segment import (
    COUNTERS_KEY,
    SEG_PREFIX,
    Counters,
    Segment,
    decode_segment,
    encode_segment,
    seg_id_of_key,
)
from sarpd.core.snapshot import list_snapshots, read_snapshot
from sarpd.core.store import Store
from sarpd.errors import CorruptData, FormatVersionError
from sarpd.model import CheckReport

MAX_LISTED = 50


@dataclass(slots=True)
class _Scan:
    """What a pass over the segments found."""

    keys_of: dict[int, set[int]] = field(default_factory=dict)  # sid -> its routing keys
    corrupt: list[bytes] = field(default_factory=list)  # keys of values failing checks
    unrouted: list[Segment] = field(default_factory=list)
    max_sid: int = 0


def run_check(store: Store, router: Router, snapshot_dir: Path | None,
              fix: bool) -> CheckReport:
    """Check (and with `fix` repair) the index made of `store` and `router`."""
    problems: list[str] = []
    found = _Scan()
    try:
        _scan_segments(store, router, found, problems)
    except CorruptData as exc:
        problems.append(f"backend: {exc.message} (segments after {found.max_sid} not "
                        "examined; nothing else is checked or fixed until the engine is "
                        "repaired)")
        return _report(router, len(found.keys_of), problems, 0)
    keys_of, corrupt, max_sid = found.keys_of, found.corrupt, found.max_sid
    bad_snaps = _check_snapshots(snapshot_dir, problems)
    bad_entries: list[tuple[int, int]] = []
    for rkey, sid, _f in router.dir.iter_entries():
        owned = keys_of.get(sid)
        if owned is None:
            problems.append(f"routing key {rkey:016x} points at missing segment {sid}")
            bad_entries.append((rkey, sid))
        elif rkey not in owned:
            problems.append(f"routing key {rkey:016x} is not a routing point of segment {sid}")
            bad_entries.append((rkey, sid))
    c = store.counters
    if len(keys_of) + len(corrupt) != c.segments or (max_sid and c.next_seg <= max_sid):
        problems.append(f"counters: {c.segments} segments, next id {c.next_seg}; found "
                        f"{len(keys_of) + len(corrupt)} segments, newest {max_sid}")
    fixed = 0
    if fix and problems:
        for path in bad_snaps:
            path.unlink(missing_ok=True)
        fixed = len(bad_snaps) + _repair(store, router, found, bad_entries)
    return _report(router, len(keys_of), problems, fixed)


def _merged(seg: Segment, records: list[tuple[int, bytes]], memory: Segment | None,
            k: Kernels) -> str:
    """What is wrong with a segment's delta records ('' when nothing): they apply to its
    base (`sarpd.core.delta.merge`) and give what the index serves."""
    try:
        seg = merge(seg, records)
    except CorruptData as exc:
        return str(exc)
    if memory is None or encode_segment(memory, k) != encode_segment(seg, k):
        return "base + delta records differ from what the index serves"
    return ""


def _scan_segments(store: Store, router: Router, found: _Scan, problems: list[str]) -> None:
    geo, d = router.geo, router.dir
    deltas = by_segment(store.scan(DELTA_PREFIX, DELTA_PREFIX + b"\xff"))
    for key, value in store.scan(SEG_PREFIX, b"T"):
        sid = seg_id_of_key(key)
        found.max_sid = max(found.max_sid, sid)
        try:
            seg = decode_segment(value, sid, store.k)
        except (CorruptData, FormatVersionError) as exc:
            problems.append(f"segment {sid}: {exc}")
            found.corrupt.append(key)
            continue
        if sid in deltas:  # issue 24: the segment is its base and its records
            wrong = _merged(seg, deltas.pop(sid), store.pending.get(sid), store.k)
            if wrong:
                problems.append(f"segment {sid}: {wrong}")
                continue
            seg = store.pending[sid] or seg
        found.keys_of[sid] = {int(seg.ids[o, 0]) for o in geo.offsets if o < seg.nblocks}
        doubled = _doubled_holders(seg)
        if doubled:
            problems.append(f"segment {sid}: block {doubled[0]} lists its first holder "
                            f"{doubled[1]:#x} again in the holder table (reported, not fixed)")
        if not d.has(int(seg.ids[0, 0]), sid):
            problems.append(f"segment {sid} (window {seg.window}) is not routed")
            found.unrouted.append(seg)
    problems.extend(f"segment {sid}: {len(recs)} delta records without a segment"
                    for sid, recs in deltas.items())


def _doubled_holders(seg: Segment) -> tuple[int, int] | None:
    """(block, holder) of a holder-table entry that repeats the block's first holder:
    the one holder-table invariant decoding does not check (it reads per block)."""
    for m, mask in zip(seg.xmeta.tolist(), seg.xmask.tolist(), strict=True):
        for i in range(seg.nblocks):
            if (mask >> i) & 1 and int(seg.meta[i]) == m:
                return i, m
    return None


def _report(router: Router, segments: int, problems: list[str], fixed: int) -> CheckReport:
    return CheckReport(
        segments=segments, routing_points=router.dir.entries,
        problems=problems[:MAX_LISTED] + (
            [f"... and {len(problems) - MAX_LISTED} more"] if len(problems) > MAX_LISTED else []),
        fixed=fixed,
    )


def _check_snapshots(snapshot_dir: Path | None, problems: list[str]) -> list[Path]:
    """Snapshot files that fail their checks (each reported)."""
    bad: list[Path] = []
    if snapshot_dir is None:
        return bad
    for path in list_snapshots(snapshot_dir):
        try:
            read_snapshot(path)
        except (OSError, CorruptData, FormatVersionError) as exc:
            problems.append(f"snapshot {path.name}: {exc}")
            bad.append(path)
    return bad


def _repair(store: Store, router: Router, found: _Scan,
            bad_entries: list[tuple[int, int]]) -> int:
    fixed = 0
    store.forget_segments()
    for rkey, sid in bad_entries:
        fixed += router.dir.drop(rkey, sid)
    cache: dict[int, Segment | None] = {}
    load = store.loader(cache)
    for seg in found.unrouted:
        cache[seg.seg_id] = seg
        router.register(seg, load)
        fixed += 1
    wb = WriteBatch()
    for key in found.corrupt:
        wb.delete(key)
        fixed += 1
    c = store.counters
    counters = Counters(max(c.next_seg, found.max_sid + 1), c.next_version, c.blocks,
                        len(found.keys_of), c.holdings)
    if counters != c:
        wb.put(COUNTERS_KEY, counters.encode())
        fixed += 1
    store.commit(wb, True, counters)
    router.dir.merge()
    return fixed
