"""sarpd/indexer/hashing.py: Dynamo's per-block hashes (checked by hand against xxhash
and against values Dynamo 1.6.1's indexer showed in its /dump) and their chain."""

from __future__ import annotations

import numpy as np
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from sarpd.core import ids
from sarpd.indexer import hashing as H


def test_seed_mixes_lora_and_salt_and_ignores_empty_strings() -> None:
    lora = xxhash.xxh3_64_intdigest(b"L", 0)
    salt = xxhash.xxh3_64_intdigest(b"s", 1)
    assert H.seed_of(None, None) == H.seed_of("", "") == 1337
    assert H.seed_of("L", None) == (1337 + lora) % 2**64
    assert H.seed_of("L", "s") == (1337 + lora + salt) % 2**64
    assert H.seed_of(None, "s") == (1337 + salt) % 2**64


def test_the_values_dynamo_showed() -> None:
    """tokens_hash of the block 7000..7015 in Dynamo's /dump, plain and with lora "L"."""
    t = np.arange(7000, 7016, dtype=np.uint32)
    assert H.local_hashes(t, 16, H.seed_of(None, None)).tolist() == [9202532308433378665]
    assert H.local_hashes(t, 16, H.seed_of("L", None)).tolist() == [1582440879033674325]


@settings(max_examples=50, deadline=None)
@given(tokens=st.lists(st.integers(0, 2**32 - 1), max_size=70), size=st.integers(1, 20),
       seed=st.integers(0, 2**64 - 1))
def test_each_whole_block_hashed_alone(tokens: list[int], size: int, seed: int) -> None:
    arr = np.array(tokens, dtype=np.uint32)
    got = H.local_hashes(arr, size, seed).tolist()
    want = [xxhash.xxh3_64_intdigest(arr[i * size:(i + 1) * size].tobytes(), seed)
            for i in range(len(tokens) // size)]
    assert got == want  # not chained: a partial last block has none


@settings(max_examples=30, deadline=None)
@given(local=st.lists(st.integers(0, 2**64 - 1), max_size=12), split=st.integers(0, 12))
def test_the_chain_is_sarp_s_chain_over_the_hashes_and_continues(local: list[int],
                                                                   split: int) -> None:
    arr = np.array(local, dtype=np.uint64)
    root = H.root("ns")
    whole = H.chain(root, arr)
    words = arr.astype("<u8").view("<u4")
    assert np.array_equal(whole, ids.chain_ids(root, words, 2))
    k = min(split, len(local))
    if k > 0:  # after a parent: the same ids as the whole sequence's
        tail = H.chain(whole[k - 1].astype("<u8").tobytes(), arr[k:])
        assert np.array_equal(tail, whole[k:])
    assert H.chain(H.root("other"), arr).tobytes() != whole.tobytes() or not local


def test_int64_as_sent_round_trips() -> None:
    values = [0, 1, 2**63 - 1, 2**63, 2**64 - 1]
    signed = H.signed(np.array(values, dtype=np.uint64))
    assert signed == [0, 1, 2**63 - 1, -(2**63), -1]
    assert H.unsigned(signed).tolist() == values
