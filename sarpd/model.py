"""Typed requests and results shared by the wire codec, the index and the client.

Ids are numpy arrays of shape (n, 2) and dtype uint64: column 0 holds the low 64
bits (the routing key), column 1 the high 64 bits, i.e. the little-endian 16-byte
form of PROTOCOL.md read as two uint64. Metadata is a 1-D uint64 array.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NewType

import numpy as np
import numpy.typing as npt

__all__ = ["AFTER_SEQ_WAIT_MS", "Check", "CheckReport", "CheckpointResult", "Clear",
           "Dump", "Hello", "IdArray", "Insert", "InsertResult", "Match", "MatchResult",
           "Ping", "Remove", "RemoveResult", "Report", "Request", "RoutingKey",
           "SegmentId", "SeqSpec", "Snapshot", "SnapshotResult", "Stats", "U32Array",
           "U64Array", "ids_from_bytes", "ids_to_bytes"]

U64Array = npt.NDArray[np.uint64]
U32Array = npt.NDArray[np.uint32]
IdArray = U64Array  # shape (n, 2)

SegmentId = NewType("SegmentId", int)
RoutingKey = NewType("RoutingKey", int)


def ids_from_bytes(raw: bytes) -> IdArray:
    """16 bytes LE per id -> (n, 2) uint64 (copy, writable)."""
    return np.frombuffer(raw, dtype="<u8").reshape(-1, 2).astype(np.uint64)


def ids_to_bytes(ids: IdArray) -> bytes:
    return np.ascontiguousarray(ids, dtype="<u8").tobytes()


@dataclass(frozen=True, slots=True, eq=False)
class SeqSpec:
    """A sequence as a request carries it: exactly one of tokens / hashes."""

    ns: str
    tokens: U32Array | None = None  # 1-D uint32; a trailing partial block is ignored
    hashes: IdArray | None = None  # (n, 2) caller-computed ids from position 0 (or after parent)

    def blocks(self, block_tokens: int) -> int:
        """The whole blocks it names (a trailing partial block of tokens is not one)."""
        if self.hashes is not None:
            return len(self.hashes)
        return 0 if self.tokens is None else len(self.tokens) // block_tokens


@dataclass(frozen=True, slots=True, eq=False)
class Request:
    id: int


@dataclass(frozen=True, slots=True, eq=False)
class Hello(Request):
    protocol: int = 1  # the newest protocol the client speaks


@dataclass(frozen=True, slots=True, eq=False)
class Ping(Request):
    pass


@dataclass(frozen=True, slots=True, eq=False)
class Stats(Request):
    pass


@dataclass(frozen=True, slots=True, eq=False)
class Snapshot(Request):
    pass


AFTER_SEQ_WAIT_MS = 1000  # a match's default wait for `after_seq` (cluster mode)


@dataclass(frozen=True, slots=True, eq=False)
class Match(Request):
    seq: SeqSpec
    with_ids: bool = False
    holders: int = 0  # K > 0: also answer the K holders with the longest runs
    spans: bool = False  # also answer every holder's runs inside the matched prefix
    # cluster mode: ((shard, seq), ...): answer only once this replica's shard applied
    # its seq, waiting at most after_seq_wait_ms (else `unavailable`); ignored elsewhere
    after_seq: tuple[tuple[str, int], ...] = ()
    after_seq_wait_ms: int = AFTER_SEQ_WAIT_MS
    route: int | None = None  # cluster mode, rule heads: see `Insert.route`


@dataclass(frozen=True, slots=True, eq=False)
class Insert(Request):
    seq: SeqSpec
    # one uint64 per block of `seq`; a scalar is broadcast by the decoder/index
    meta: U64Array | int
    parent: IdArray | None = None  # (1, 2) or None
    # protocol 2: blocks already indexed get the insert's meta as one more holder
    # (protocol 1: the first insert wins)
    add_holder: bool = False
    # cluster mode, rule heads (issue 27): the depth of the deepest split the sender's
    # shard map has this sequence pass (`sarpd.cluster.shardmap.Plan.depth`); a replica
    # whose own splits say deeper answers `moved`. None: not routed by a map
    route: int | None = None


@dataclass(frozen=True, slots=True, eq=False)
class Remove(Request):
    """Either `seq` (+ `start`), or `ns` + `ids` (bare ids at any positions)."""

    seq: SeqSpec | None = None
    start: int = 0
    ns: str = ""
    ids: IdArray | None = None
    meta: int | None = None  # take only this holder off (None: every holder)
    route: int | None = None  # cluster mode, rule heads: see `Insert.route`


@dataclass(frozen=True, slots=True, eq=False)
class Clear(Request):
    """Take off every holder whose meta & mask == value, anywhere in the namespace."""

    ns: str
    mask: int = 0
    value: int = 0


@dataclass(frozen=True, slots=True, eq=False)
class Check(Request):
    """Extension op ``check``: verify the index (and repair it with ``fix``)."""

    fix: bool = False


@dataclass(frozen=True, slots=True, eq=False)
class Dump(Request):
    """Extension op ``dump``: the routing entries and segments of one sequence."""

    seq: SeqSpec


@dataclass(frozen=True, slots=True, eq=False)
class Report(Request):
    """Extension op ``report``: a client's own counters, replacing its previous ones."""

    source: str
    counters: Mapping[str, float]


@dataclass(frozen=True, slots=True, eq=False)
class MatchResult:
    blocks: int
    meta: U64Array  # uint64 per matched block: its holder with the longest run
    ids: IdArray | None = None  # the matched ids, when asked for
    holders: list[tuple[int, int]] | None = None  # (meta, run), when asked for
    # (meta, start, blocks): each holder's maximal runs in the matched prefix, when asked
    spans: list[tuple[int, int, int]] | None = None


@dataclass(frozen=True, slots=True)
class InsertResult:
    blocks: int
    new_blocks: int
    matched_blocks: int


@dataclass(frozen=True, slots=True)
class RemoveResult:
    removed: int


@dataclass(frozen=True, slots=True)
class SnapshotResult:
    segment_id: int
    seconds: float


@dataclass(frozen=True, slots=True)
class CheckpointResult:
    """A checkpoint written (`SarpIndex.checkpoint`): the log sequence it holds, its
    newest segment, how long it took."""

    applied_seq: int
    segment_id: int
    seconds: float


@dataclass(frozen=True, slots=True)
class CheckReport:
    """What `sarpctl check` found (and, with fix, repaired)."""

    segments: int = 0
    routing_points: int = 0
    problems: list[str] = field(default_factory=list)
    fixed: int = 0

    @property
    def clean(self) -> bool:
        return not self.problems
