"""The write-ahead log: one record per write batch, so buffers survive kill -9.

File `wal-GGGGGG.log` (little-endian):

    file header (24 B): magic b"BSWL", version u16 (1), reserved u16, generation u64,
                        first_lsn u64 (the lsn of the first record)
    record:     header (24 B): payload bytes u32, op count u32, lsn u64,
                               xxh3-64 of (header bytes [0, 16) + payload)
                payload: per op: kind u8 (1 put, 2 delete), key bytes u32,
                         value bytes u32, key, value

Invariants: records carry consecutive lsns from first_lsn; a batch is applied only
whole. Replay stops at the first record that is incomplete, fails its checksum or
breaks the lsn sequence (a torn tail from a crash, or an append that failed), and the
file is cut there so new records follow the last good one. A torn tail is the END of
the log: when an intact record follows the bad one (the bad record is intact itself
but out of sequence, or a record with one of the next 64 lsns verifies after it), the
middle of the log is damaged; replay then raises CorruptionError and cuts nothing,
rather than drop acknowledged batches. Every append goes at the
tracked end offset (never O_APPEND), so a failed append's partial bytes are cut or
overwritten. The log of a generation is deleted once a checkpoint has flushed every
buffer to pages and a manifest snapshot names the next generation.
"""

from __future__ import annotations

import contextlib
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import xxhash

from bloomstore.errors import CorruptionError, FormatError, version_message
from bloomstore.files import DataFile

MAGIC = b"BSWL"
VERSION = 1
FILE_HEADER = struct.Struct("<4sHHQQ")
RECORD = struct.Struct("<IIQQ")
OP = struct.Struct("<BII")
PUT, DELETE = 1, 2

Op = tuple[bytes, bytes | None]  # (key, value), None = delete


def wal_name(gen: int) -> str:
    return f"wal-{gen:06d}.log"


def encode_record(lsn: int, ops: list[Op]) -> bytes:
    parts: list[bytes] = []
    for key, value in ops:
        if value is None:
            parts += (OP.pack(DELETE, len(key), 0), key)
        else:
            parts += (OP.pack(PUT, len(key), len(value)), key, value)
    payload = b"".join(parts)
    head = struct.pack("<IIQ", len(payload), len(ops), lsn)
    return head + struct.pack("<Q", xxhash.xxh3_64_intdigest(head + payload)) + payload


def _decode_ops(payload: memoryview, count: int) -> list[Op] | None:
    ops: list[Op] = []
    pos = 0
    for _ in range(count):
        if pos + OP.size > len(payload):
            return None
        kind, klen, vlen = OP.unpack_from(payload, pos)
        pos += OP.size
        key = bytes(payload[pos : pos + klen])
        pos += klen
        if kind == PUT:
            ops.append((key, bytes(payload[pos : pos + vlen])))
            pos += vlen
        elif kind == DELETE and vlen == 0:
            ops.append((key, None))
        else:
            return None
    return ops if pos == len(payload) else None


LOOKAHEAD = 64  # later lsns searched for after a bad record


def _verified_lsn(data: memoryview, pos: int) -> int | None:
    """The lsn of the record at `pos` if its length fits and its checksum verifies."""
    if pos < 0 or pos + RECORD.size > len(data):
        return None
    plen, _count, rec_lsn, checksum = RECORD.unpack_from(data, pos)
    body = pos + RECORD.size
    if body + plen > len(data):
        return None
    digest = xxhash.xxh3_64(data[pos : pos + 16])
    digest.update(data[body : body + plen])
    return int(rec_lsn) if digest.intdigest() == checksum else None


def _intact_after(data: memoryview, pos: int, lsn: int) -> str | None:
    """Why the log is damaged in the middle at `pos` (expected lsn `lsn`), or None when
    what follows is a torn tail."""
    found = _verified_lsn(data, pos)
    if found is not None:
        return f"it is intact with lsn {found} (out of sequence)"
    raw = bytes(data)
    for k in range(1, LOOKAHEAD + 1):
        needle = struct.pack("<Q", lsn + k)
        at = raw.find(needle, pos + 1)
        while at >= 0:
            q = at - 8  # the lsn field is at offset 8 of a record header
            if q > pos and _verified_lsn(data, q) == lsn + k:
                return f"record lsn {lsn + k} at offset {q} after it is intact"
            at = raw.find(needle, at + 1)
    return None


@dataclass(frozen=True, slots=True)
class Record:
    lsn: int
    ops: list[Op]


class Wal:
    def __init__(self, dirpath: Path, gen: int, first_lsn: int, create: bool) -> None:
        self.path = dirpath / wal_name(gen)
        self.gen = gen
        self.first_lsn = first_lsn
        self.dirty = False
        self.file = DataFile(self.path, create=create, truncate=create)
        if create:
            self.file.write(FILE_HEADER.pack(MAGIC, VERSION, 0, gen, first_lsn), 0)
            self.end = FILE_HEADER.size
        else:
            self.end = self.file.size()
        self.records_replayed = 0
        self.bytes_dropped = 0

    def replay(self) -> Iterator[Record]:
        """The good records, in order; cuts the file after the last one."""
        size = self.file.size()
        data = memoryview(self.file.read(size, 0)) if size else memoryview(b"")
        if len(data) < FILE_HEADER.size:
            raise CorruptionError(f"{self.path}: {len(data)} bytes, no log header")
        magic, version, _, gen, first = FILE_HEADER.unpack_from(data)
        if magic == MAGIC and version != VERSION:
            raise FormatError(version_message(str(self.path), "log", version, VERSION))
        if magic != MAGIC or gen != self.gen:
            raise CorruptionError(
                f"{self.path}: header magic {bytes(magic)!r} version {version} "
                f"generation {gen} (expected {MAGIC!r} {VERSION} {self.gen})")
        self.first_lsn = first
        pos, lsn = FILE_HEADER.size, first
        while pos + RECORD.size <= len(data):
            plen, count, rec_lsn, checksum = RECORD.unpack_from(data, pos)
            body = pos + RECORD.size
            if rec_lsn != lsn or body + plen > len(data):
                break
            digest = xxhash.xxh3_64(data[pos : pos + 16])
            digest.update(data[body : body + plen])
            if digest.intdigest() != checksum:
                break
            ops = _decode_ops(data[body : body + plen], count)
            if ops is None:
                break
            yield Record(rec_lsn, ops)
            self.records_replayed += 1
            pos, lsn = body + plen, lsn + 1
        if pos < len(data):
            damage = _intact_after(data, pos, lsn)
            if damage is not None:
                raise CorruptionError(
                    f"{self.path}: the record at offset {pos} (lsn {lsn}) is damaged but "
                    f"{damage}: the log is corrupt, not torn at its tail; refusing to drop "
                    "the batches after it (nothing was cut)")
        self.bytes_dropped = len(data) - pos
        self.end = pos
        if self.bytes_dropped:
            os.ftruncate(self.file.fd, pos)

    def append(self, record: bytes) -> None:
        """Write one encoded record at the end; on failure cut the partial bytes (the
        error propagates)."""
        try:
            self.file.write(record, self.end)
        except BaseException:
            self.cut()
            raise
        self.end += len(record)
        self.dirty = True

    def cut(self) -> None:
        """Best effort: remove bytes past the last good record."""
        with contextlib.suppress(OSError):  # else the next append overwrites them
            os.ftruncate(self.file.fd, self.end)

    def sync(self) -> None:
        if self.dirty:
            self.file.sync()
            self.dirty = False

    def close(self) -> None:
        self.file.close()
