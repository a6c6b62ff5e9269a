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

from pathlib import Path
from typing import TYPE_CHECKING

from backends.base import WriteBatch
from sarpd.core.segment import (
    COUNTERS_KEY,
    SEG_PREFIX,
    Counters,
    Segment,
    decode_segment,
    seg_id_of_key,
)
from sarpd.core.snapshot import list_snapshots, read_snapshot
from sarpd.core.writer import WriteTxn
from sarpd.errors import CorruptData, FormatVersionError
from sarpd.model import CheckReport

if TYPE_CHECKING:
    from sarpd.core.index import SarpIndex

MAX_LISTED = 50


def run_check(ix: SarpIndex, fix: bool) -> CheckReport:
    problems: list[str] = []
    keys_of: dict[int, set[int]] = {}
    corrupt: list[bytes] = []
    unrouted: list[Segment] = []
    max_sid = 0
    try:
        for key, value in ix.backend.scan(SEG_PREFIX, b"T"):
            sid = seg_id_of_key(key)
            max_sid = max(max_sid, sid)
            try:
                seg = decode_segment(value, sid)
            except (CorruptData, FormatVersionError) as exc:
                problems.append(f"segment {sid}: {exc}")
                corrupt.append(key)
                continue
            keys_of[sid] = {int(seg.ids[o, 0]) for o in ix.geo.offsets if o < seg.nblocks}
            if not ix.dir.has(int(seg.ids[0, 0]), sid):
                problems.append(f"segment {sid} (window {seg.window}) is not routed")
                unrouted.append(seg)
    except CorruptData as exc:
        problems.append(f"backend: {exc.message} (segments after {max_sid} not examined; "
                        "nothing else is checked or fixed until the engine is repaired)")
        return _report(ix, len(keys_of), problems, 0)
    bad_snaps = _check_snapshots(ix, problems)
    bad_entries: list[tuple[int, int]] = []
    for rkey, sid, _f in ix.dir.iter_entries():
        owned = keys_of.get(sid)
        if owned is None:
            problems.append(f"routing key {rkey:016x} points at missing segment {sid}")
            bad_entries.append((rkey, sid))
        elif rkey not in owned:
            problems.append(f"routing key {rkey:016x} is not a routing point of segment {sid}")
            bad_entries.append((rkey, sid))
    c = ix.counters
    if len(keys_of) + len(corrupt) != c.segments or (max_sid and c.next_seg <= max_sid):
        problems.append(f"counters: {c.segments} segments, next id {c.next_seg}; found "
                        f"{len(keys_of) + len(corrupt)} segments, newest {max_sid}")
    fixed = 0
    if fix and problems:
        for path in bad_snaps:
            path.unlink(missing_ok=True)
        fixed = len(bad_snaps) + _repair(ix, corrupt, unrouted, bad_entries, len(keys_of),
                                         max_sid)
    return _report(ix, len(keys_of), problems, fixed)


def _report(ix: SarpIndex, segments: int, problems: list[str], fixed: int) -> CheckReport:
    return CheckReport(
        segments=segments, routing_points=ix.dir.entries,
        problems=problems[:MAX_LISTED] + (
            [f"... and {len(problems) - MAX_LISTED} more"] if len(problems) > MAX_LISTED else []),
        fixed=fixed,
    )


def _check_snapshots(ix: SarpIndex, problems: list[str]) -> list[Path]:
    """Snapshot files that fail their checks (each reported)."""
    bad: list[Path] = []
    if ix.snapshot_dir is None:
        return bad
    for path in list_snapshots(ix.snapshot_dir):
        try:
            read_snapshot(path)
        except (OSError, CorruptData, FormatVersionError) as exc:
            problems.append(f"snapshot {path.name}: {exc}")
            bad.append(path)
    return bad


def _repair(ix: SarpIndex, corrupt: list[bytes], unrouted: list[Segment],
            bad_entries: list[tuple[int, int]], segments: int, max_sid: int) -> int:
    fixed = 0
    ix._seg_cache.clear()
    for rkey, sid in bad_entries:
        fixed += ix.dir.drop(rkey, sid)
    txn = WriteTxn(ix)
    for seg in unrouted:
        txn.cache[seg.seg_id] = seg
        ix.register(seg, txn)
        fixed += 1
    wb = WriteBatch()
    for key in corrupt:
        wb.delete(key)
        fixed += 1
    c = ix.counters
    counters = Counters(max(c.next_seg, max_sid + 1), c.next_version, c.blocks, segments)
    if counters != c:
        wb.put(COUNTERS_KEY, counters.encode())
        fixed += 1
    ix.backend.write(wb, True)
    ix.counters = counters
    ix.dir.merge()
    return fixed
