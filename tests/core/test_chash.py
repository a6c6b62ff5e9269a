"""Native block ids (sarpd/core/_chash.c) against the Python reference (sarpd/core/ids.py)
and against the chain as the ids docstring states it (`reference_chain`, computed here
with xxhash itself): the same ids bit for bit, one sequence or a batch, and the same
argument errors. Under SARPD_NO_EXTENSIONS=1 (or without libxxhash) the native halves
are skipped and the reference is checked alone."""

from __future__ import annotations

import array
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from sarpd.core import native
from sarpd.core.ids import (
    MAX_BLOCK_TOKENS,
    chain_ids,
    chain_ids_flat,
    chain_ids_many,
    id_bytes,
    ns_root,
    token_ids,
)
from sarpd.model import IdArray

U32_MAX = 2**32 - 1
NATIVE = native.pick().hash is not None
REF = native.pick(reference=True)
needs_native = pytest.mark.skipif(not NATIVE, reason="native hashing not loaded")


def reference_chain(parent: bytes, tokens: list[int], bt: int) -> bytes:
    """The chain as the ids docstring states it: 16 bytes per whole block."""
    out, prev = b"", parent
    for i in range(len(tokens) // bt):
        block = b"".join(t.to_bytes(4, "little") for t in tokens[i * bt : (i + 1) * bt])
        prev = xxhash.xxh3_128_digest(prev + block)
        out += prev
    return out


def raw(ids: IdArray) -> bytes:
    return b"".join(id_bytes(row) for row in ids)


def u32(tokens: list[int]) -> np.ndarray[Any, np.dtype[np.uint32]]:
    return np.array(tokens, dtype=np.uint32)


def impls(fn: Callable[[native.Kernels], Any]) -> list[Any]:
    """fn's result on the reference kernels, then (when loaded) on the native ones."""
    out = [fn(REF)]
    if NATIVE:
        out.append(fn(native.pick()))
    return out


def check_ids(ids: IdArray, n: int) -> None:
    assert ids.shape == (n, 2) and ids.dtype == np.uint64
    assert ids.flags.c_contiguous and ids.flags.writeable


# -- known vectors --------------------------------------------------------------------
VECTORS = [
    ("", list(range(40)), 16),  # two blocks and a partial one
    ("lora-7", list(range(64)), 16),
    ("", [U32_MAX] * 48, 16),  # the largest token
    ("", [0] * 32, 1),  # block_tokens 1, identical blocks
    ("x", [(i * 2654435761) % 2**32 for i in range(1030)], 512),  # a heap-sized block
    ("", list(range(15)), 16),  # fewer tokens than one block: no id
    ("", [], 16),  # no token
]


@pytest.mark.parametrize(("ns", "tokens", "bt"), VECTORS)
def test_known_vectors_are_todays_ids(ns: str, tokens: list[int], bt: int) -> None:
    want = reference_chain(xxhash.xxh3_128_digest(b"sarp-ns\0" + ns.encode()), tokens, bt)
    for ids in impls(lambda k: token_ids(ns, u32(tokens), bt, k)):
        check_ids(ids, len(tokens) // bt)
        assert raw(ids) == want


def test_a_known_id_is_its_digest_read_as_two_little_endian_words() -> None:
    digest = xxhash.xxh3_128_digest(ns_root("") + bytes(range(64)))
    toks = np.frombuffer(bytes(range(64)), dtype="<u4").astype(np.uint32)
    lo, hi = int.from_bytes(digest[:8], "little"), int.from_bytes(digest[8:], "little")
    for ids in impls(lambda k: token_ids("", toks, 16, k)):
        assert ids.tolist() == [[lo, hi]]


# -- parity on random and adversarial inputs ------------------------------------------
TOKEN = st.one_of(st.integers(0, U32_MAX), st.sampled_from([0, 1, U32_MAX, U32_MAX - 1]))
TOKENS = st.one_of(
    st.lists(TOKEN, max_size=700),
    st.builds(lambda t, n: [t] * n, TOKEN, st.integers(0, 600)),  # one token repeated
)
BT = st.sampled_from([1, 2, 3, 15, 16, 17, 255, 256, 257, 512])
PARENT = st.one_of(st.binary(min_size=16, max_size=16), st.just(bytes(16)),
                   st.just(b"\xff" * 16))


@settings(max_examples=150, deadline=None, derandomize=True)
@given(parent=PARENT, tokens=TOKENS, bt=BT)
def test_one_sequence_equals_the_stated_chain(parent: bytes, tokens: list[int], bt: int) -> None:
    want = reference_chain(parent, tokens, bt)
    for ids in impls(lambda k: chain_ids(parent, u32(tokens), bt, k)):
        check_ids(ids, len(tokens) // bt)
        assert raw(ids) == want


@st.composite
def batches(draw: st.DrawFn) -> tuple[bytes, list[int], list[int], int]:
    """A batch for chain_ids_flat: sequences as offsets into shared tokens (gaps,
    overlaps of nothing, empty sequences and a tail past the last one all occur)."""
    tokens = draw(st.lists(TOKEN, max_size=400))
    m = draw(st.integers(0, 12))
    offsets = sorted(draw(st.lists(st.integers(0, len(tokens)), min_size=m + 1,
                                   max_size=m + 1)))
    parents = draw(st.binary(min_size=16 * m, max_size=16 * m))
    return parents, tokens, offsets, draw(st.sampled_from([1, 3, 16, 300]))


@settings(max_examples=150, deadline=None, derandomize=True)
@given(batch=batches())
def test_a_flat_batch_equals_each_sequence_chained_alone(
        batch: tuple[bytes, list[int], list[int], int]) -> None:
    parents, tokens, offsets, bt = batch
    t, off = u32(tokens), np.array(offsets, dtype=np.int64)
    want = [reference_chain(parents[16 * j : 16 * j + 16], tokens[a:b], bt)
            for j, (a, b) in enumerate(itertools.pairwise(offsets))]
    for ids, ioff in impls(lambda k: chain_ids_flat(parents, t, off, bt, k)):
        check_ids(ids, sum(len(w) // 16 for w in want))
        assert ioff.dtype == np.int64 and ioff.tolist()[0] == 0 and len(ioff) == len(offsets)
        assert [raw(ids[a:b]) for a, b in itertools.pairwise(ioff.tolist())] == want


def test_many_sequences_in_one_call_equal_one_call_each() -> None:
    rng = np.random.default_rng(14)
    lens = rng.integers(0, 300, size=2000)
    lens[::97] = 0
    seqs = [rng.integers(0, 2**32, size=n, dtype=np.uint32) for n in lens]
    seqs[5] = np.full(200, U32_MAX, dtype=np.uint32)
    parents = [ns_root(f"ns{j % 7}") for j in range(len(seqs))]
    results = impls(lambda k: chain_ids_many(parents, seqs, 16, k))
    one_each = [chain_ids(p, s, 16, REF) for p, s in zip(parents, seqs, strict=True)]
    for many in results:
        assert len(many) == len(seqs)
        for got, want in zip(many, one_each, strict=True):
            assert got.shape == want.shape and (got == want).all()


def test_parents_may_be_an_id_array() -> None:
    toks = np.arange(96, dtype=np.uint32)
    first = token_ids("", toks[:32], 16)  # two ids, used as the parents of two chains
    off = np.array([0, 48, 96], dtype=np.int64)
    for ids, ioff in impls(lambda k: chain_ids_flat(first, toks, off, 16, k)):
        assert ioff.tolist() == [0, 3, 6]
        assert raw(ids[:3]) == reference_chain(id_bytes(first[0]), list(range(48)), 16)
        assert raw(ids[3:]) == reference_chain(id_bytes(first[1]), list(range(48, 96)), 16)
        assert (chain_ids(first[1], toks[48:], 16) == ids[3:]).all()  # a row as one parent


def test_an_empty_batch_gives_no_id() -> None:
    for ids, ioff in impls(lambda k: chain_ids_flat(b"", u32([]), np.zeros(1, np.int64), 16,
                                                    k)):
        check_ids(ids, 0)
        assert ioff.tolist() == [0]
    for many in impls(lambda k: chain_ids_many([], [], 16, k)):
        assert many == []


def test_any_uint32_buffer_is_hashed() -> None:
    toks = array.array("I", range(48))
    for ids in impls(lambda k: chain_ids(bytearray(ns_root("")), toks, 16, k)):
        assert raw(ids) == reference_chain(ns_root(""), list(range(48)), 16)


def test_read_only_tokens_are_hashed() -> None:
    toks = np.frombuffer(np.arange(64, dtype=np.uint32).tobytes(), dtype=np.uint32)
    assert not toks.flags.writeable
    for ids in impls(lambda k: chain_ids(ns_root(""), toks, 16, k)):
        assert raw(ids) == reference_chain(ns_root(""), list(range(64)), 16)


# -- argument errors: the same exception and text on both paths -----------------------
P, T = bytes(16), np.arange(64, dtype=np.uint32)
OFF = np.array([0, 32, 64], dtype=np.int64)
BAD_CALLS: list[tuple[str, Callable[[], object], type[Exception], str]] = [
    ("parent short", lambda k: chain_ids(b"x" * 15, T, 16, k), ValueError,
     "parent must be 16 bytes, got 15"),
    ("parent long", lambda k: chain_ids(b"x" * 17, T, 16, k), ValueError,
     "parent must be 16 bytes, got 17"),
    ("parent str", lambda k: chain_ids("p" * 16, T, 16, k), TypeError,
     "parent must be a 16-byte id (bytes), got str"),
    ("parent strided", lambda k: chain_ids(np.zeros(4, np.uint64)[::2], T, 16, k), ValueError,
     "parent must be C-contiguous"),
    ("tokens int64", lambda k: chain_ids(P, T.astype(np.int64), 16, k), TypeError,
     "tokens must have dtype uint32, got buffer format 'l' (itemsize 8)"),
    ("tokens big-endian", lambda k: chain_ids(P, T.astype(">u4"), 16, k), TypeError,
     "tokens must have dtype uint32, got buffer format '>I' (itemsize 4)"),
    ("tokens strided", lambda k: chain_ids(P, T[::2], 16, k), ValueError,
     "tokens must be C-contiguous (np.ascontiguousarray)"),
    ("tokens 2-D", lambda k: chain_ids(P, T.reshape(8, 8), 16, k), ValueError,
     "tokens must be 1-D, got ndim 2"),
    ("tokens list", lambda k: chain_ids(P, [1, 2, 3], 16, k), TypeError,
     "tokens must be a 1-D uint32 array, got list"),
    ("block_tokens 0", lambda k: chain_ids(P, T, 0, k), ValueError,
     f"block_tokens must be in [1, {MAX_BLOCK_TOKENS}], got 0"),
    ("block_tokens -1", lambda k: chain_ids(P, T, -1, k), ValueError,
     f"block_tokens must be in [1, {MAX_BLOCK_TOKENS}], got -1"),
    ("block_tokens huge", lambda k: chain_ids(P, T, 2**70, k), ValueError,
     f"block_tokens must be in [1, {MAX_BLOCK_TOKENS}], got {2**70}"),
    ("block_tokens float", lambda k: chain_ids(P, T, 16.0, k), TypeError,
     "block_tokens must be an int, got float"),
    ("offsets empty", lambda k: chain_ids_flat(b"", T, np.zeros(0, np.int64), 16, k), ValueError,
     "offsets must hold one entry more than there are sequences, got 0 entries"),
    ("offsets int32", lambda k: chain_ids_flat(P * 2, T, OFF.astype(np.int32), 16, k), TypeError,
     "offsets must have dtype int64, got buffer format 'i' (itemsize 4)"),
    ("offsets strided", lambda k: chain_ids_flat(P, T, np.zeros(4, np.int64)[::2], 16, k),
     ValueError, "offsets must be C-contiguous (np.ascontiguousarray)"),
    ("offsets decrease", lambda k: chain_ids_flat(P * 2, T, np.array([0, 40, 30]), 16, k),
     ValueError, "offsets[2] = 30: offsets must be non-decreasing within [0, 64] (len(tokens))"),
    ("offsets negative", lambda k: chain_ids_flat(P, T, np.array([-1, 3]), 16, k),
     ValueError, "offsets[0] = -1: offsets must be non-decreasing within [0, 64] (len(tokens))"),
    ("offsets past the end", lambda k: chain_ids_flat(P, T, np.array([0, 65]), 16, k),
     ValueError, "offsets[1] = 65: offsets must be non-decreasing within [0, 64] (len(tokens))"),
    ("parents short", lambda k: chain_ids_flat(P, T, OFF, 16, k), ValueError,
     "parents must be 16 bytes per sequence (2 sequences: 32 bytes), got 16"),
    ("parents list", lambda k: chain_ids_flat([P, P], T, OFF, 16, k), TypeError,
     "parents must be 16 bytes per sequence (bytes), got list"),
    ("flat tokens int64", lambda k: chain_ids_flat(P * 2, T.astype(np.int64), OFF, 16, k),
     TypeError,
     "tokens must have dtype uint32, got buffer format 'l' (itemsize 8)"),
    ("flat block_tokens 0", lambda k: chain_ids_flat(P * 2, T, OFF, 0, k),
     ValueError,
     f"block_tokens must be in [1, {MAX_BLOCK_TOKENS}], got 0"),
    ("many lengths", lambda k: chain_ids_many([P], [T, T], 16, k), ValueError,
     "parents and seqs must have the same length, got 1 and 2"),
    ("many parent", lambda k: chain_ids_many([P, P[:8]], [T, T], 16, k), ValueError,
     "parents[1] must be 16 bytes, got 8"),
    ("many seq dtype", lambda k: chain_ids_many([P, P], [T, T.astype(np.int64)], 16, k), TypeError,
     "seqs[1] must be a 1-D uint32 array, got dtype int64, ndim 1"),
    ("many seq list", lambda k: chain_ids_many([P], [[1, 2]], 16, k), TypeError,
     "seqs[0] must be a 1-D uint32 array, got list"),
    ("many seq 0-d", lambda k: chain_ids_many([P, P], [T, np.uint32(3)], 16, k), TypeError,
     "seqs[1] must be a 1-D uint32 array, got numpy.uint32"),
]


@pytest.mark.parametrize(("call", "exc", "message"), [c[1:] for c in BAD_CALLS],
                         ids=[c[0] for c in BAD_CALLS])
def test_bad_arguments_raise_the_same_error_naming_the_argument(
        call: Callable[[native.Kernels], object], exc: type[Exception], message: str) -> None:
    def error(k: native.Kernels) -> tuple[type[BaseException], str]:
        with pytest.raises(exc) as info:
            call(k)
        return info.type, str(info.value)

    for got in impls(error):
        assert got == (exc, message)


# -- dispatch and the install's gate --------------------------------------------------
@needs_native
def test_the_kernels_given_run(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = native.pick().hash
    calls: list[str] = []

    def spy(name: str) -> Callable[..., Any]:
        real = getattr(mod, name)
        return lambda *a: calls.append(name) or real(*a)

    monkeypatch.setattr(mod, "chain_ids", spy("chain_ids"))
    monkeypatch.setattr(mod, "chain_ids_flat", spy("chain_ids_flat"))
    ref = token_ids("", T, 16, REF), chain_ids_many([P], [T], 16, REF)[0]
    assert calls == []
    nat = token_ids("", T, 16), chain_ids_many([P], [T], 16, native.pick())[0]
    assert calls == ["chain_ids", "chain_ids_flat"]
    assert all((a == b).all() for a, b in zip(ref, nat, strict=True))
    assert native.status()["hash"]


@pytest.mark.skipif(native.compiler() is None, reason="no C compiler")
def test_hashing_is_expected_only_when_the_compiler_finds_libxxhash(tmp_path: Path) -> None:
    """A header dir that shadows xxhash.h with an #error stands for a machine without
    libxxhash-dev: the install would not build _chash, so the guard must not expect it."""
    (tmp_path / "xxhash.h").write_text("#error no libxxhash-dev here\n")
    probe = "import json; from sarpd.core import native; print(json.dumps(native.expected()))"
    env = {k: v for k, v in os.environ.items() if k != "SARPD_NO_EXTENSIONS"}

    def expected(cc: str | None) -> dict[str, bool]:
        e = dict(env, CC=cc) if cc else {k: v for k, v in env.items() if k != "CC"}
        out = subprocess.run([sys.executable, "-c", probe], env=e, capture_output=True,
                             text=True, check=True)
        got: dict[str, bool] = json.loads(out.stdout)
        return got

    cc = " ".join(native._cc())
    shadowed = expected(f"{cc} -I{tmp_path}")
    assert shadowed["verify"] and not shadowed["hash"]
    assert expected(None)["hash"] == native.xxhash_found()


# -- block_hashes: the indexer API's per-block hashes (sarpd.indexer.hashing) -------
@needs_native
@settings(max_examples=80, deadline=None)
@given(tokens=st.lists(st.integers(0, U32_MAX), max_size=90), bt=st.integers(1, 20),
       seed=st.integers(0, 2**64 - 1))
def test_block_hashes_equal_the_reference_and_xxhash(tokens: list[int], bt: int,
                                                     seed: int) -> None:
    from sarpd.indexer.hashing import _ref_local_hashes

    arr = np.array(tokens, dtype=np.uint32)
    k = native.pick().hash
    assert k is not None
    got = np.frombuffer(k.block_hashes(arr, bt, seed), dtype=np.uint64).tolist()
    assert got == _ref_local_hashes(arr, bt, seed).tolist()
    assert got == [xxhash.xxh3_64_intdigest(arr[i * bt:(i + 1) * bt].tobytes(), seed)
                   for i in range(len(tokens) // bt)]


@needs_native
@pytest.mark.parametrize(("args", "exc", "words"), [
    ((np.zeros(4, np.uint32), 0, 1), ValueError, "block_tokens must be in [1,"),
    ((np.zeros(4, np.uint32), 2, -1), ValueError, "seed must be in [0, 2**64), got -1"),
    ((np.zeros(4, np.uint32), 2, 2**64), ValueError, "seed must be in [0, 2**64)"),
    ((np.zeros(4, np.uint32), 2, 1.5), TypeError, "seed must be an int, got float"),
    ((np.zeros(4, np.int64), 2, 1), TypeError, "tokens"),
    ((np.zeros(4, np.uint32), 2), TypeError, "block_hashes takes 3 arguments"),
])
def test_block_hashes_name_a_bad_argument(args: tuple[Any, ...], exc: type[Exception],
                                          words: str) -> None:
    k = native.pick().hash
    assert k is not None
    with pytest.raises(exc) as info:
        k.block_hashes(*args)
    assert words in str(info.value)


# ------------------------------------------------- msgpack_u32: token ids off the wire

def _int_encodings(v: int) -> list[bytes]:
    """Every msgpack encoding of int v (unsigned and signed widths that hold it)."""
    out = []
    if 0 <= v <= 0x7F:
        out.append(bytes([v]))
    if -32 <= v < 0:
        out.append((v & 0xFF).to_bytes(1, "big"))
    for tag, width in ((0xCC, 1), (0xCD, 2), (0xCE, 4), (0xCF, 8)):
        if 0 <= v < 1 << 8 * width:
            out.append(bytes([tag]) + v.to_bytes(width, "big"))
    for tag, width in ((0xD0, 1), (0xD1, 2), (0xD2, 4), (0xD3, 8)):
        if -(1 << 8 * width - 1) <= v < 1 << 8 * width - 1:
            out.append(bytes([tag]) + v.to_bytes(width, "big", signed=True))
    return out


_IN_RANGE = st.integers(0, 2**32 - 1).flatmap(lambda v: st.sampled_from(_int_encodings(v)))
_ELEMENT = st.one_of(
    _IN_RANGE,
    st.sampled_from([2**32, 2**64 - 1, -1, -32, -(2**63)]).flatmap(
        lambda v: st.sampled_from(_int_encodings(v))),
    st.sampled_from([b"\xc0", b"\xc2", b"\xc3", b"\xca\x3f\x80\x00\x00", b"\xa1x", b"\x91\x01",
                     b"\x80"]))


def _array(elements: list[bytes], form: int) -> bytes:
    n = len(elements)
    head = [bytes([0x90 | n]) if n < 16 else b"\xdc" + n.to_bytes(2, "big"),
            b"\xdc" + n.to_bytes(2, "big"), b"\xdd" + n.to_bytes(4, "big")][form]
    return head + b"".join(elements)


@needs_native
@settings(max_examples=400, deadline=None)
@given(elements=st.one_of(st.lists(_IN_RANGE, max_size=40), st.lists(_ELEMENT, max_size=40)),
       form=st.integers(0, 2))
def test_msgpack_u32_is_the_reference_on_every_int_encoding(
        elements: list[bytes], form: int) -> None:
    """Arrays of ints in every msgpack width (signed encodings of positive ints too),
    out-of-range ints, other types among them: the native decoder answers as the
    reference (msgspec's list[int] and array.array): the bytes, or None."""
    import msgspec

    from sarpd.events.schema import _ref_token_bytes

    raw = _array(elements, form)
    c = native.pick().hash
    assert c is not None
    assert c.msgpack_u32(raw) == _ref_token_bytes(msgspec.Raw(raw))


@needs_native
def test_msgpack_u32_refuses_what_is_not_one_whole_array() -> None:
    c = native.pick().hash
    assert c is not None
    whole = _array([b"\x01", b"\xcd\x01\x00", b"\xce\xff\xff\xff\xff"], 0)
    assert c.msgpack_u32(whole) == array.array("I", [1, 256, 2**32 - 1]).tobytes()
    for cut in range(len(whole)):  # truncated anywhere: no value, nothing read past it
        assert c.msgpack_u32(whole[:cut]) is None
    assert c.msgpack_u32(whole + b"\x01") is None  # bytes past the array
    assert c.msgpack_u32(b"\xdd\xff\xff\xff\xff") is None  # a length past the buffer
    assert c.msgpack_u32(memoryview(whole)) == c.msgpack_u32(bytearray(whole))
    with pytest.raises(TypeError, match="raw must be a bytes-like object, got int"):
        c.msgpack_u32(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="takes 1 argument"):
        c.msgpack_u32()  # type: ignore[call-arg]
