"""Atomic snapshots of the routing directory.

File `dir-<watermark:016x>.snap` in the snapshot directory, little-endian:

    off  size  field
    0    8     magic b"SARPSNAP"
    8    4     snapshot format (1)
    12   4     segment format the entries refer to
    16   8     watermark: newest change-log version folded into this directory
    24   8     newest segment id at snapshot time
    32   8     n: number of entries
    40   4     block_tokens
    44   4     segment_blocks
    48   4     CRC-32 of the body (the directory's and, format 2, the block map's)
    52   4     CRC-32 of bytes [0, 52)
    56   8n    routing keys (sorted ascending)
    56+8n 8n   segment ids
    56+16n 8n  filters
    then (format 2) the block map (`sarpd.core.blockmap`), its live entries oldest first:
    56+24n 8    m: entries
    +8     8    zero
    +16    8m   ids' low halves, then 8m high halves, 8m head keys, 4m positions (u32)

A format 1 snapshot (no map) is read with an empty map: the data it comes from has a
locator record for every block, which is what an empty map needs.

Written to a temp name, fsync'd, renamed, and the directory fsync'd: a snapshot is
either whole or absent. Loading checks both CRCs, the sizes and the geometry; a
snapshot that fails is skipped with a warning (the caller falls back to an older
one or a full scan). The newest `keep` snapshots are kept.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import struct
import threading
import zlib
from dataclasses import dataclass
from io import BufferedReader
from pathlib import Path

import numpy as np
import numpy.typing as npt

from sarpd.core.blockmap import MapArrays
from sarpd.core.directory import DirectoryArrays
from sarpd.core.segment import SEGMENT_FORMAT, SEGMENT_FORMATS
from sarpd.errors import CorruptData, FormatVersionError, StorageError

log = logging.getLogger(__name__)

SNAP_FORMAT = 2
SNAP_FORMATS = (1, 2)  # read
MAGIC = b"SARPSNAP"
HEAD = struct.Struct("<8sIIQQQIIII")
assert HEAD.size == 56
MAP_HEAD = struct.Struct("<QQ")
MAP_ENTRY = 28  # bytes an entry


@dataclass(frozen=True, slots=True)
class SnapshotMeta:
    watermark: int
    newest_seg: int
    block_tokens: int
    segment_blocks: int


def _name(watermark: int) -> str:
    return f"dir-{watermark:016x}.snap"


def write_snapshot(directory: Path, arrays: DirectoryArrays, meta: SnapshotMeta,
                   keep: int = 2, blockmap: MapArrays | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    body = [np.ascontiguousarray(a, dtype="<u8").tobytes()
            for a in (arrays.keys, arrays.segs, arrays.filts)]
    m = blockmap if blockmap is not None else MapArrays(
        np.zeros((0, 2), np.uint64), np.zeros(0, np.uint64), np.zeros(0, np.uint32))
    mparts = [np.ascontiguousarray(a, dtype="<u8").tobytes() for a in (m.ids[:, 0], m.ids[:, 1],
                                                                       m.heads)]
    mparts.append(np.ascontiguousarray(m.pos, dtype="<u4").tobytes())
    body += [MAP_HEAD.pack(len(m.ids), 0), *mparts]
    crc = 0
    for part in body:
        crc = zlib.crc32(part, crc)
    head = HEAD.pack(MAGIC, SNAP_FORMAT, SEGMENT_FORMAT, meta.watermark, meta.newest_seg,
                     len(arrays.keys), meta.block_tokens, meta.segment_blocks, crc, 0)
    head = head[:52] + zlib.crc32(head[:52]).to_bytes(4, "little")
    final = directory / _name(meta.watermark)
    # a name of its own: a snapshot written off the worker (`PendingSnapshot`) may
    # overlap one the `snapshot` op writes for the same watermark
    tmp = directory / f"{final.name}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        with open(tmp, "wb") as fh:
            fh.write(head)
            for part in body:
                fh.write(part)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException as exc:
        tmp.unlink(missing_ok=True)  # a full disk keeps no partial snapshot
        if isinstance(exc, OSError):
            raise StorageError(f"snapshot {tmp} could not be written: {exc}") from exc
        raise
    os.replace(tmp, final)
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    for old in list_snapshots(directory)[keep:]:
        old.unlink(missing_ok=True)
    for stale in directory.glob("dir-*.snap*.tmp"):  # left by a process that died writing
        if stale.name.split(".")[-3] != str(os.getpid()):
            stale.unlink(missing_ok=True)
    return final


@dataclass(frozen=True, slots=True)
class PendingSnapshot:
    """A snapshot's content, copied while the index stood still
    (`SarpIndex.prepare_snapshot`); `write` puts it on disk from any thread, while the
    index goes on serving: the file (~24 bytes a routing entry, 28 a block map entry,
    two fsyncs) costs the writer nothing."""

    directory: Path
    arrays: DirectoryArrays  # copies: the directory updates its own in place
    blockmap: MapArrays | None
    meta: SnapshotMeta
    started: float  # time.perf_counter() when it was taken

    def write(self, keep: int = 2) -> Path:
        return write_snapshot(self.directory, self.arrays, self.meta, keep, self.blockmap)


def list_snapshots(directory: Path) -> list[Path]:
    """Snapshot files, newest first."""
    if not directory.is_dir():
        return []
    return sorted(directory.glob("dir-*.snap"), reverse=True)


def read_snapshot(path: Path) -> tuple[SnapshotMeta, DirectoryArrays]:
    """Read and check a snapshot: its directory (`read_all`: and its block map)."""
    meta, arrays, _ = read_all(path)
    return meta, arrays


def read_meta(path: Path) -> SnapshotMeta:
    """A snapshot's header alone, checked (its own CRC, magic, formats): what it holds,
    without reading the body."""
    with open(path, "rb") as fh:
        (_, _, watermark, newest, _, bt, sb, _) = _head(fh, path)
    return SnapshotMeta(watermark, newest, bt, sb)


def _head(fh: BufferedReader, path: Path) -> tuple[int, int, int, int, int, int, int, int]:
    """The header's fields after the magic, checked: (format, segment format,
    watermark, newest segment, entries, block_tokens, segment_blocks, body CRC)."""
    head = fh.read(HEAD.size)
    if len(head) < HEAD.size:
        raise CorruptData(
            f"{path}: {len(head)} bytes is shorter than the header ({HEAD.size})")
    (magic, fmt, seg_fmt, watermark, newest, n, bt, sb, crc, hcrc) = HEAD.unpack(head)
    if magic != MAGIC:
        raise CorruptData(f"{path}: bad magic {magic!r}")
    if zlib.crc32(head[:52]) != hcrc:
        raise CorruptData(f"{path}: header checksum mismatch")
    if fmt not in SNAP_FORMATS or seg_fmt not in SEGMENT_FORMATS:
        raise FormatVersionError(
            f"{path}: snapshot format {fmt}/segment format {seg_fmt}; this build reads "
            f"{SNAP_FORMAT}/{SEGMENT_FORMAT}"
        )
    return fmt, seg_fmt, watermark, newest, n, bt, sb, crc


def read_all(path: Path) -> tuple[SnapshotMeta, DirectoryArrays, MapArrays | None]:
    """Read and check a snapshot (block map None: format 1). The directory's body is
    mapped, not copied (`_map_body`): the directory takes that array over (at 1B
    blocks it is 369 MB)."""
    with open(path, "rb") as fh:
        (fmt, _, watermark, newest, n, bt, sb, crc) = _head(fh, path)
        size = os.fstat(fh.fileno()).st_size
        if size != HEAD.size + 24 * n if fmt == 1 else size < HEAD.size + 24 * n + MAP_HEAD.size:
            raise CorruptData(
                f"{path}: {size} bytes, expected {HEAD.size + 24 * n} for {n} entries"
                f"{'' if fmt == 1 else ' and the block map'}")
        arr = _map_body(fh, n)
        fh.seek(HEAD.size + 24 * n)
        rest = fh.read() if fmt > 1 else b""
    body_crc = zlib.crc32(rest, zlib.crc32(arr.data.cast("B")) if n else 0)
    if body_crc != crc:
        raise CorruptData(f"{path}: body checksum mismatch")
    blockmap = _map_arrays(path, rest) if fmt > 1 else None
    arr = arr.astype(np.uint64, copy=False)  # a no-op on little-endian hosts
    keys, segs, filts = arr[:n], arr[n : 2 * n], arr[2 * n :]
    if n > 1 and bool((keys[1:] < keys[:-1]).any()):
        raise CorruptData(f"{path}: routing keys are not sorted")
    return SnapshotMeta(watermark, newest, bt, sb), DirectoryArrays(keys, segs, filts), blockmap


def _map_body(fh: BufferedReader, n: int) -> npt.NDArray[np.uint64]:
    """The body as one writable array over a private (copy-on-write) map of the file:
    its pages are the page cache's, read once by the checksum, and only the pages the
    directory later writes (a removal marking an entry dead) are copied. No second
    copy of a body that is 369 MB at 1B blocks, and no allocation of it either."""
    if n == 0:
        return np.empty(0, dtype=np.uint64)
    mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
    with contextlib.suppress(AttributeError, OSError):  # a hint only
        mm.madvise(mmap.MADV_SEQUENTIAL)
    return np.frombuffer(mm, dtype="<u8", count=3 * n, offset=HEAD.size)


def _map_arrays(path: Path, raw: bytes) -> MapArrays:
    """The block map section (`raw`: from its count on), checked by the body's CRC."""
    m, _ = MAP_HEAD.unpack_from(raw)
    data = memoryview(raw)[MAP_HEAD.size :]
    if len(data) != MAP_ENTRY * m:
        raise CorruptData(f"{path}: block map of {len(data)} bytes, expected "
                          f"{MAP_ENTRY * m} for {m} entries")
    u64 = np.frombuffer(data, dtype="<u8", count=3 * m).astype(np.uint64)
    ids = np.stack([u64[:m], u64[m : 2 * m]], axis=1)
    pos = np.frombuffer(data, dtype="<u4", count=m, offset=24 * m).astype(np.uint32)
    return MapArrays(ids, u64[2 * m :].copy(), pos)


@dataclass(frozen=True, slots=True)
class Loaded:
    """A snapshot read back: its header, its directory, and its file."""

    meta: SnapshotMeta
    arrays: DirectoryArrays
    path: Path
    blockmap: MapArrays | None = None  # None: a format 1 snapshot


def load_newest(directory: Path, block_tokens: int, segment_blocks: int
                ) -> Loaded | str | None:
    """The newest valid snapshot; else why none could be used (None: there is none)."""
    warnings: list[str] = []
    for path in list_snapshots(directory):
        try:
            meta, arrays, blockmap = read_all(path)
        except (OSError, CorruptData, FormatVersionError) as exc:
            warnings.append(str(exc))
            log.warning("snapshot skipped: %s", exc)
            continue
        if (meta.block_tokens, meta.segment_blocks) != (block_tokens, segment_blocks):
            warnings.append(f"{path}: geometry {meta.block_tokens}/{meta.segment_blocks} "
                            f"differs from {block_tokens}/{segment_blocks}")
            continue
        return Loaded(meta, arrays, path, blockmap)
    return "; ".join(warnings) or None
