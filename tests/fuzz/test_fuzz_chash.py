"""Fuzz sarpd/core/_chash.c (`chain_ids`, `chain_ids_flat`) against sarpd/core/ids.py's
`_ref_chain_ids` / `_ref_chain_ids_flat`, and `msgpack_u32` against sarpd.events.schema's
`_ref_token_bytes` (arbitrary bytes behind an array header: the same uint32 bytes, or
None where the reference finds no such array or no msgpack at all): the same ids and
id offsets bit for bit
(empty token arrays, partial blocks, block sizes from 1 to MAX_BLOCK_TOKENS, empty
batches, empty and repeated sequences, identical parents), and for every argument
either refuses (another dtype, byte order, shape or memory order, no buffer, a parent
of another length, offsets out of order or out of range, a block size that is no int
or out of range, huge or negative) the same exception with the same text."""

from __future__ import annotations

import array
import sys
from collections.abc import Callable

import msgspec
import numpy as np
import pytest

from sarpd.core import ids
from sarpd.events.schema import _ref_token_bytes
from tests.fuzz._common import HOSTILE_INTS, Source, clean, extension, outcome, replay

C = extension("hash")
MAX_BT = ids.MAX_BLOCK_TOKENS


def _tokens(src: Source) -> tuple[object, bool]:
    """Token arrays, mostly valid (1-D C-contiguous uint32), else hostile."""
    n = src.integer(0, 300)
    if src.chance(30):
        t = np.full(n, src.pick([0, 1, 2**32 - 1]), np.uint32)
    else:
        t = np.frombuffer(src.raw(4 * n), dtype="<u4").astype(np.uint32)
    k = src.integer(0, 19)
    if k <= 9:
        return t, True
    if k == 10:  # unaligned, but contiguous: readable
        buf = bytearray(t.nbytes + 1)
        buf[1:] = t.tobytes()
        return np.frombuffer(buf, np.uint32, offset=1), True
    if k == 11:
        return array.array("I", t.tolist()), True
    if k == 12:
        return memoryview(t.tobytes()).cast("I"), True
    hostile: list[Callable[[], object]] = [
        lambda: t.astype(np.int32), lambda: t.astype(np.uint64), lambda: t.astype(np.uint16),
        lambda: t.view(np.float32), lambda: t.astype(">u4"), lambda: t.reshape(1, -1),
        lambda: np.repeat(t, 2)[::2], lambda: t.tolist(), lambda: t.tobytes(),
        lambda: None, lambda: array.array("Q", [1, 2])]
    return src.pick(hostile)(), False


def _block_tokens(src: Source) -> object:
    if src.chance(80):
        return src.pick([1, 2, 3, 15, 16, 17, 64, 255, 256, 257, 300])
    return src.pick([0, MAX_BT, MAX_BT + 1, *HOSTILE_INTS])


def _parent(src: Source, m: int) -> object:
    """16 m bytes, mostly; else another length or something that holds no bytes."""
    if src.chance(85):
        raw = src.raw(16) * m if src.chance(20) else src.raw(16 * m)  # identical parents
        forms: list[Callable[[bytes], object]] = [bytes, bytearray,
                                                  lambda b: np.frombuffer(b, "<u8")]
        return src.pick(forms)(raw)
    return src.pick([b"", bytes(16 * m + 1), bytes(max(16 * m - 1, 0)),
                     memoryview(bytes(32 * m + 32))[::2], "x" * 16, None, 16])


def _offsets(src: Source, n_tokens: int) -> object:
    m = src.integer(0, 8)
    cuts = sorted(src.integer(0, n_tokens) for _ in range(m + 1))
    off = np.array(cuts, np.int64)
    k = src.integer(0, 14)
    if k <= 8:
        return off
    if k == 9 and m:  # out of order
        off[src.integer(0, m)] = src.pick([-1, n_tokens + 1, 2**63 - 1, -(2**63)])
        return off
    return src.pick([np.zeros(0, np.int64), off.astype(np.uint64), off.astype(np.int32),
                     off.reshape(1, -1), off.tolist(), off[::-1]])


Outcome = tuple[object | None, BaseException | None]


def _compare(name: str, native: Outcome, ref: Outcome) -> None:
    """native and reference outcomes: the same bytes, or the same exception and text."""
    (got, err), (want, ref_err) = native, ref
    clean(err, name)
    if ref_err is not None or err is not None:
        assert type(err) is type(ref_err) and str(err) == str(ref_err), (
            f"{name}: native {err!r}, reference {ref_err!r}")
        return
    assert got == want, f"{name}: ids differ"


def _msgpack_u32(src: Source) -> None:
    """A header (fixarray, array16, array32; a length that may not fit), then bytes:
    mostly small ints, else anything."""
    n = src.integer(0, 40)
    head = src.pick([bytes([0x90 | min(n, 15)]), b"\xdc" + n.to_bytes(2, "big"),
                     b"\xdd" + n.to_bytes(4, "big"), b""])
    body = bytes(b & 0x7F for b in src.raw(n)) if src.chance(50) else src.raw(src.integer(0, 80))
    raw = head + body
    try:
        want = _ref_token_bytes(msgspec.Raw(raw))
    except msgspec.DecodeError:  # not one msgpack value: no array of ints either
        want = None
    got = C.msgpack_u32(raw)
    assert got == want, f"msgpack_u32({raw!r}): native {got!r}, reference {want!r}"


def one_input(data: bytes) -> None:
    if C is None:
        return
    src = Source(data)
    if src.chance(25):
        _msgpack_u32(src)
        return
    tokens, _ = _tokens(src)
    bt = _block_tokens(src)
    if src.flag():
        parent = _parent(src, 1)
        native = outcome(lambda: bytes(C.chain_ids(parent, tokens, bt)))
        ref = outcome(lambda: ids._ref_chain_ids(parent, tokens, bt).tobytes())
        _compare("chain_ids", native, ref)
        return
    n = len(tokens) if isinstance(tokens, np.ndarray | array.array | list) else 0
    offsets = _offsets(src, n)
    m = max(len(offsets) - 1, 0) if isinstance(offsets, np.ndarray | list) else 0
    parents = _parent(src, m)

    def native_flat() -> tuple[bytes, list[int]]:
        raw, ioff = C.chain_ids_flat(parents, tokens, offsets, bt)
        return bytes(raw), np.frombuffer(ioff, np.int64).tolist()

    def ref_flat() -> tuple[bytes, list[int]]:
        got, ioff = ids._ref_chain_ids_flat(parents, tokens, offsets, bt)
        return got.tobytes(), ioff.tolist()

    _compare("chain_ids_flat", outcome(native_flat), outcome(ref_flat))


@pytest.mark.skipif(C is None, reason="native hashing is not built")
def test_replay() -> None:
    replay(one_input, seed=2, runs=1200, max_len=1500)


if __name__ == "__main__":
    from tests.fuzz._common import fuzz

    fuzz(one_input, sys.argv)
