"""The fast path of request decoding: one msgpack frame -> a typed `Match` or
`Insert`, or None, in which case the full path (`wire.Decoder`'s msgpack unpacker,
then `requests.parse_message`) decodes the frame and gives every answer, errors
included. So this path never produces an error: it only has to build, for the frames
it accepts, exactly the request the full path would build (property-tested against
it in tests/protocol/test_fast.py).

How: msgspec decodes the frame into `_Fields` (typed, in C, unknown fields refused),
and the field validators of `sarpd.protocol.requests` (the one place of each rule)
check the values. `hashes` is kept as the raw msgpack bytes of its value: an array of
uint64s, each encoded as ``0xcf`` + 8 bytes big-endian (how msgpack encodes every
uint >= 2**32, so every 64-bit engine hash but one in 2**32), is read with one numpy
view, without a Python object per id; any other form goes through the full path's
`_ids`.

When it applies (`fast_frame_limit`): frames of at most
``min(max_str_bytes, max_items, max_frame_size)`` bytes (and ``max_depth >= 4``,
``max_containers >= 4``, ``max_map_len >= 15``) that are a fixmap (at most 15 pairs;
a request has fewer fields). Such a frame, once msgspec has accepted it, cannot pass
any of the full path's frame budgets: no string or array in it can be longer than the
frame, nor can its elements and pairs outnumber its bytes; its one map is the fixmap,
and the typed fields nest at most 2 deep in at most 4 containers. Everything else
(other ops, unknown fields, any value the types refuse, anything a validator refuses)
returns None.
"""

from __future__ import annotations

import msgspec
import numpy as np

from sarpd.model import IdArray, Insert, Match, Request, SeqSpec
from sarpd.protocol.requests import (
    U64_MAX,
    Limits,
    _blocks,
    _ids,
    _meta,
    _one_id,
    _tokens,
)

__all__ = ["fast_frame_limit", "fast_parse"]


class _Fields(msgspec.Struct, forbid_unknown_fields=True):
    """The fields of a match or an insert (nil = absent, as on the full path)."""

    id: int
    op: str
    ns: str | None = None
    tokens: bytes | list[int] | None = None
    hashes: msgspec.Raw = msgspec.Raw()  # empty: absent
    meta: int | bytes | list[int] | None = None
    parent: int | bytes | None = None
    with_ids: bool | None = None
    holders: int | None = None


_DECODER = msgspec.msgpack.Decoder(_Fields)
_ANY_IDS = msgspec.msgpack.Decoder(bytes | list[int | bytes])
_NIL = b"\xc0"
_UINT64 = b"\xcf"  # msgpack's uint 64 marker (then 8 bytes big-endian)


def fast_frame_limit(limits: Limits) -> int:
    """The largest frame the fast path may take under `limits` (0: none)."""
    if limits.max_depth < 4 or limits.max_containers < 4 or limits.max_map_len < 15:
        return 0
    return min(limits.max_str_bytes, limits.max_items, limits.max_frame_size)


def fast_parse(frame: bytes | memoryview, limits: Limits, protocol: int = 1) -> Request | None:
    """The `Match` or `Insert` that `requests.parse_message` would build from `frame`,
    or None (the full path then decides). `frame` must be at most
    `fast_frame_limit(limits)` bytes."""
    if not frame or not 0x80 <= frame[0] <= 0x8F:  # a fixmap: at most 15 pairs
        return None
    try:
        f = _DECODER.decode(frame)
        if not 0 <= f.id <= U64_MAX:
            return None
        if f.op == "match":
            return _match(f, limits)
        if f.op == "insert":
            return _insert(f, limits, protocol)
    except Exception:  # refused or unusual: the full path answers it (errors included)
        return None
    return None


def _match(f: _Fields, limits: Limits) -> Match | None:
    if f.parent is not None:
        return None
    holders = 0 if f.holders is None else f.holders
    if f.holders is not None and not 1 <= holders <= limits.max_match_holders:
        return None
    seq = _seq(f, limits)
    if seq is None:
        return None
    return Match(f.id, seq=seq, with_ids=bool(f.with_ids), holders=holders)


def _insert(f: _Fields, limits: Limits, protocol: int) -> Insert | None:
    seq = _seq(f, limits)
    if seq is None or f.meta is None:
        return None
    meta = _meta(f.meta, _blocks(seq, limits), limits)
    parent = None if f.parent is None else _one_id(f.parent, "parent")
    return Insert(f.id, seq=seq, meta=meta, parent=parent, add_holder=protocol >= 2)


def _seq(f: _Fields, limits: Limits) -> SeqSpec | None:
    raw = bytes(f.hashes)
    has_hashes = bool(raw) and raw != _NIL
    ns = f.ns or ""
    if ns and len(ns.encode("utf-8")) > limits.max_ns_bytes:
        return None
    if f.tokens is not None:
        if has_hashes:
            return None
        return SeqSpec(ns=ns, tokens=_tokens(f.tokens, limits))
    if not has_hashes:
        return None
    return SeqSpec(ns=ns, hashes=_hash_ids(raw, limits))


def _hash_ids(raw: bytes, limits: Limits) -> IdArray:
    """`hashes` from the raw msgpack bytes of its value (see the module docstring)."""
    head = raw[0]
    if 0x90 <= head <= 0x9F:
        n, start = head & 0x0F, 1
    elif head == 0xDC:
        n, start = int.from_bytes(raw[1:3], "big"), 3
    elif head == 0xDD:
        n, start = int.from_bytes(raw[1:5], "big"), 5
    else:
        n = start = -1
    if 0 < n <= limits.max_ids and len(raw) == start + 9 * n and \
            raw[start::9] == _UINT64 * n:  # every 9th byte from the first item's marker
        out = np.zeros((n, 2), dtype=np.uint64)
        out[:, 0] = np.ndarray((n,), ">u8", raw, start + 1, (9,))  # the values, in place
        return out
    return _ids(_ANY_IDS.decode(raw), "hashes", limits)
