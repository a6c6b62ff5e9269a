"""Block ids (sarpd/core/ids.py): the XXH3-128 chain from the namespace root, the
per-namespace salt of caller ids, namespace tags, and the sequence length rule."""

from __future__ import annotations

import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from sarpd.core import native
from sarpd.core.ids import (
    HASH_NAME,
    Joined,
    chain_ids,
    check_sequence_tokens,
    id_bytes,
    ns_root,
    ns_tag,
    salt_ids,
    salt_ids_many,
    token_ids,
)
from sarpd.errors import TooLarge


def reference_chain(ns: str, tokens: list[int], bt: int) -> list[bytes]:
    """The chain as the docstring states it, one block at a time."""
    prev = xxhash.xxh3_128_digest(b"sarp-ns\0" + ns.encode())
    out = []
    for i in range(len(tokens) // bt):
        block = np.array(tokens[i * bt : (i + 1) * bt], dtype="<u4").tobytes()
        prev = xxhash.xxh3_128_digest(prev + block)
        out.append(prev)
    return out


@settings(max_examples=50, deadline=None, derandomize=True)
@given(ns=st.sampled_from(["", "a", "lora-7"]),
       tokens=st.lists(st.integers(0, 2**32 - 1), max_size=100),
       bt=st.sampled_from([1, 4, 16]))
def test_chained_ids_equal_the_reference_chain(ns: str, tokens: list[int], bt: int) -> None:
    ids = token_ids(ns, np.array(tokens, dtype=np.uint32), bt)
    assert ids.shape == (len(tokens) // bt, 2) and ids.dtype == np.uint64
    assert [id_bytes(row) for row in ids] == reference_chain(ns, tokens, bt)


def test_a_partial_block_has_no_id_and_a_chain_continues_from_its_parent() -> None:
    toks = np.arange(40, dtype=np.uint32)
    ids = chain_ids(ns_root(""), toks, 16)
    assert len(ids) == 2  # 8 tokens left over: no id
    tail = chain_ids(id_bytes(ids[0]), toks[16:32], 16)
    assert (tail == ids[1:2]).all()


def test_namespaces_never_share_an_id() -> None:
    toks = np.arange(64, dtype=np.uint32)
    a, b = token_ids("a", toks, 16), token_ids("b", toks, 16)
    assert not (a == b).all(axis=1).any()
    assert ns_tag("a") != ns_tag("b")
    assert ns_tag("a") == int.from_bytes(ns_root("a")[:8], "little")


def test_salting_is_per_namespace_and_its_own_inverse() -> None:
    ids = np.array([[1, 0], [2, 0], [2**64 - 1, 5]], dtype=np.uint64)
    a = salt_ids("a", ids)
    assert not (a == ids).all(axis=1).any()
    assert (salt_ids("a", a) == ids).all()  # what `with_ids` returns is what was sent
    assert not (salt_ids("b", ids) == a).all(axis=1).any()
    salt = np.frombuffer(xxhash.xxh3_128_digest(b"sarp-hashes\0a"), dtype="<u8")
    assert (a == ids ^ salt.astype(np.uint64)).all()


_ids_arrays = st.lists(st.integers(0, 2**64 - 1), max_size=12).map(
    lambda xs: np.array(xs, dtype=np.uint64).reshape(-1, 2) if len(xs) % 2 == 0
    else np.array(xs[:-1], dtype=np.uint64).reshape(-1, 2))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["", "a", "b", "\u00e9"]), _ids_arrays), max_size=8),
       st.booleans(), st.sampled_from(["plain", "strided", "int64"]))
def test_salt_ids_many_is_salt_ids_of_each(batch: list[tuple[str, np.ndarray]],
                                           one_ns: bool, form: str) -> None:
    """The batch form equals the rule applied one sequence at a time: one namespace
    for the batch or mixed ones, empty sequences and an empty batch included, ids
    strided (every other row of a bigger array: the kernel's `salt_into` reads them as
    they are) or of another dtype (numpy's cast first). A batch's answers are views
    one after another of the one array a `Joined` keeps."""
    if one_ns:
        batch = [("a", ids) for _, ids in batch]
    if form == "strided":
        batch = [(ns, np.repeat(ids, 2, axis=0)[::2]) for ns, ids in batch]
    elif form == "int64" and len(batch) > 1:  # (a lone sequence is salt_ids': uint64)
        batch = [(ns, ids.astype(np.int64)) for ns, ids in batch]
    got = salt_ids_many([ns for ns, _ in batch], [ids for _, ids in batch])
    ref = salt_ids_many([ns for ns, _ in batch], [ids for _, ids in batch],
                        native.pick(reference=True))  # numpy's, one XOR for the batch
    assert len(got) == len(ref) == len(batch)
    for (ns, ids), g, r in zip(batch, got, ref, strict=True):
        want = salt_ids(ns, ids.astype(np.uint64))
        assert g.dtype == np.uint64 and g.shape == ids.shape
        assert (g == want).all() and (g == r).all()
    if len(batch) > 1:
        for answer in (got, ref):
            assert isinstance(answer, Joined)
            assert answer.flat.flags.c_contiguous and answer.flat.dtype == np.uint64
            assert answer.flat.tolist() == [row for g in answer for row in g.tolist()]
            assert all(np.shares_memory(g, answer.flat) for g in answer if len(g))


@settings(max_examples=100, deadline=None)
@given(_ids_arrays, st.sampled_from(["", "a", "\u00e9"]), st.booleans())
def test_salt_ids_is_the_same_natively_and_in_numpy(ids: np.ndarray, ns: str,
                                                     strided: bool) -> None:
    """The match kernel's `salt` (C) and the numpy reference agree, on strided input
    too (every other row of a bigger array)."""
    if strided:
        ids = np.repeat(ids, 2, axis=0)[::2]
    got = salt_ids(ns, ids, native.pick())
    want = salt_ids(ns, ids, native.pick(reference=True))
    assert got.dtype == want.dtype == np.uint64 and (got == want).all()


@pytest.mark.skipif(native.pick().match is None, reason="the match kernel is not built")
def test_the_salt_kernel_refuses_a_bad_out_by_name() -> None:
    c = native.pick().match
    assert c is not None
    ids = np.zeros((3, 2), np.uint64)
    with pytest.raises(ValueError, match="out must be writable with the 3 rows of ids, got 2"):
        c.salt(ids, np.zeros((2, 2), np.uint64), 1, 2)
    frozen = np.zeros((3, 2), np.uint64)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        c.salt(ids, frozen, 1, 2)
    with pytest.raises(OverflowError, match="hi must be in"):
        c.salt(ids, np.zeros((3, 2), np.uint64), 1, 2**64)
    out, salts = np.zeros((3, 2), np.uint64), np.ones((2, 2), np.uint64)
    for ends in ([1, 2], [2, 1], [1, 4]):  # short of the rows, descending, past them
        with pytest.raises(ValueError, match="ends ascending to 3"):
            c.salt_runs(ids, out, np.array(ends, np.int64), salts)
    with pytest.raises(ValueError, match="salts one row per run"):
        c.salt_runs(ids, out, np.array([3], np.int64), salts)
    c.salt_runs(ids, out, np.array([1, 3], np.int64), np.array([[1, 2], [3, 4]], np.uint64))
    assert out.tolist() == [[1, 2], [3, 4], [3, 4]]
    two = np.array([[1, 2], [3, 4]], np.uint64)
    with pytest.raises(ValueError, match="one row per sequence \\(2\\), got 1"):
        c.salt_into([ids, ids], np.zeros((6, 2), np.uint64), two[:1])
    with pytest.raises(ValueError, match="out has 5 rows, the sequences more"):
        c.salt_into([ids, ids], np.zeros((5, 2), np.uint64), two)
    with pytest.raises(ValueError, match="out has 7 rows, the sequences 6"):
        c.salt_into([ids, ids], np.zeros((7, 2), np.uint64), two)
    with pytest.raises((TypeError, ValueError), match="ids"):
        c.salt_into([ids, ids.astype(np.int64)], np.zeros((6, 2), np.uint64), two)
    with pytest.raises(ValueError, match="read-only"):
        c.salt_into([ids], frozen, two[:1])
    out = np.zeros((3, 2), np.uint64)
    c.salt_into([ids[:1] + 5, (ids + 6)[::2]], out, two)  # the second strided
    assert out.tolist() == [[5 ^ 1, 5 ^ 2], [6 ^ 3, 6 ^ 4], [6 ^ 3, 6 ^ 4]]


def test_id_bytes_is_the_little_endian_form() -> None:
    row = np.array([1, 2], dtype=np.uint64)
    assert id_bytes(row) == (1).to_bytes(8, "little") + (2).to_bytes(8, "little")
    assert HASH_NAME == "xxh3-128-chain-v1"


def test_the_sequence_length_rule_names_the_value_and_the_limit() -> None:
    check_sequence_tokens(100, 100)
    with pytest.raises(TooLarge, match=r"^tokens: 101 tokens exceeds max_sequence_tokens \(100\)$"):
        check_sequence_tokens(101, 100)


def test_a_joined_batch_is_a_sequence_of_views_made_when_asked() -> None:
    parts = [np.arange(2 * n, dtype=np.uint64).reshape(n, 2) + 100 * n for n in (3, 0, 2)]
    got = salt_ids_many(["a", "b", "a"], parts)
    assert isinstance(got, Joined) and len(got) == 3 and got.lens.tolist() == [3, 0, 2]
    for i in range(-3, 3):
        assert (got[i] == salt_ids(["a", "b", "a"][i], parts[i])).all()
        assert np.shares_memory(got[i], got.flat) or not len(got[i])
    assert [len(v) for v in got[1:]] == [0, 2] and len(got[::-1]) == 3
    for bad in (3, -4):
        with pytest.raises(IndexError, match="of a batch of 3"):
            got[bad]
