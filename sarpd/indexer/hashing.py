"""Block keys of the indexer API: the hashes Dynamo's standalone indexer computes, and
the sarp ids they chain into (sans-I/O).

    seed      = 1337 + XXH3-64(lora_name, seed 0) + XXH3-64(cache_salt, seed 1)   (mod 2**64;
                an empty or absent name or salt adds nothing)
    local[i]  = XXH3-64(token_ids[bs*i : bs*i + bs] as uint32 LE, seed)          (NOT chained)
    id[-1]    = sarpd.core.ids' namespace root of the pair's namespace
    id[i]     = XXH3-128(id[i-1] + local[i] as uint64 LE)                          (chained)

`local` is what a gateway sends to ``/query_by_hash`` (as int64: a hash >= 2**63 sent
negative) and what an engine's stored event is keyed by in Dynamo's radix tree, where
a block's place is its path from the root: the chain makes that path sarp's block id
(sarp's one chain rule, `sarpd.core.ids.chain_ids`, over 8-byte "blocks": two uint32
words per local hash), so two equal blocks after different prefixes are two blocks.
A partial last block has no hash. The indexer's block size is fixed per (model,
routing group) pair by its first registration; sarp's segments index blocks, so any
size hashes alike here (`block_size` tokens a block).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import xxhash

from sarpd.core import ids, native
from sarpd.model import IdArray, U32Array, U64Array

__all__ = ["BASE_SEED", "MASK64", "chain", "local_hashes", "root", "salt_term", "seed_of",
           "signed", "unsigned"]

BASE_SEED = 1337
MASK64 = (1 << 64) - 1
_LOCAL_TOKENS = 2  # uint32 words per local hash in the chain


def salt_term(cache_salt: str | None) -> int:
    """What a cache salt adds to the seed (0: none; an empty salt is none)."""
    return xxhash.xxh3_64_intdigest(cache_salt.encode(), 1) if cache_salt else 0


def seed_of(lora_name: str | None, cache_salt: str | None, salt: int | None = None) -> int:
    """The per-request seed: the LoRA adapter and the cache salt mixed into the base
    (`salt`: the salt's term already computed, `salt_term`, instead of `cache_salt`)."""
    seed = BASE_SEED + (salt_term(cache_salt) if salt is None else salt)
    if lora_name:
        seed += xxhash.xxh3_64_intdigest(lora_name.encode(), 0)
    return seed & MASK64


def local_hashes(tokens: U32Array, block_size: int, seed: int) -> U64Array:
    """The per-block hashes of the whole blocks of `tokens` (1-D uint32): natively
    (`sarpd.core._chash.block_hashes`) when the kernels have it, else the reference."""
    c = native.pick().hash
    if c is None:
        return _ref_local_hashes(tokens, block_size, seed)
    return np.frombuffer(c.block_hashes(np.ascontiguousarray(tokens, dtype=np.uint32),
                                        block_size, seed), dtype=np.uint64)


def _ref_local_hashes(tokens: U32Array, block_size: int, seed: int) -> U64Array:
    if block_size <= 0:
        raise ValueError(f"block_tokens must be in [1, {ids.MAX_BLOCK_TOKENS}], "
                         f"got {block_size}")
    raw = np.ascontiguousarray(tokens, dtype="<u4").tobytes()
    step = 4 * block_size
    n = len(raw) // step
    h = xxhash.xxh3_64_intdigest
    return np.fromiter((h(raw[i * step:(i + 1) * step], seed) for i in range(n)),
                       dtype=np.uint64, count=n)


def chain(parent: bytes, local: U64Array) -> IdArray:
    """The sarp ids of blocks with hashes `local` following the block with id `parent`
    (16 bytes; a namespace root for a sequence's first block)."""
    words: U32Array = np.ascontiguousarray(local, dtype="<u8").view("<u4")
    return ids.chain_ids(parent, words, _LOCAL_TOKENS)


def root(ns: str) -> bytes:
    """The id before a sequence's first block in namespace `ns`."""
    return ids.ns_root(ns)


def unsigned(values: npt.ArrayLike) -> U64Array:
    """int64 hashes as sent (negative for >= 2**63) -> uint64."""
    return np.asarray(values, dtype=np.int64).view(np.uint64)


def signed(values: U64Array) -> list[int]:
    """uint64 hashes -> the int64 a JSON client sends."""
    out: list[int] = np.asarray(values, dtype=np.uint64).view(np.int64).tolist()
    return out
