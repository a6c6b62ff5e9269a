"""Chained 128-bit block ids.

    id[-1] = H(b"sarp-ns\\0" + namespace)             (the namespace root)
    id[i]  = H(id[i-1] + tokens[16 i : 16 i + 16] as uint32 LE)

with H = XXH3-128 (16-byte digest). The scheme's name, `HASH_NAME`, is reported by
`hello`; a change of scheme is a new name. The low 64 bits of an id (its first 8
bytes read little-endian) are the in-memory routing key.

Ids a caller computed itself (`hashes`, e.g. an engine's block hashes) are folded
into the namespace by XOR with a per-namespace 128-bit salt, so two namespaces never
share a block while the caller's ids stay recoverable (`with_ids` returns them as
sent).
"""

from __future__ import annotations

import functools

import numpy as np
import xxhash

from sarpd.errors import TooLarge
from sarpd.model import IdArray, U32Array

HASH_NAME = "xxh3-128-chain-v1"


@functools.lru_cache(maxsize=4096)
def ns_root(ns: str) -> bytes:
    return xxhash.xxh3_128_digest(b"sarp-ns\0" + ns.encode())


@functools.lru_cache(maxsize=4096)
def _salt(ns: str) -> IdArray:
    s = np.frombuffer(xxhash.xxh3_128_digest(b"sarp-hashes\0" + ns.encode()), dtype="<u8")
    return s.astype(np.uint64).reshape(1, 2)


def check_sequence_tokens(n_tokens: int, limit: int) -> None:
    """THE sequence length rule: a sequence of more than `limit` tokens is refused."""
    if n_tokens > limit:
        raise TooLarge(f"tokens: {n_tokens} tokens exceeds max_sequence_tokens ({limit})")


def ns_tag(ns: str) -> int:
    """64-bit namespace tag stored in segment headers (for `clear`)."""
    return int.from_bytes(ns_root(ns)[:8], "little")


def chain_ids(parent: bytes, tokens: U32Array, block_tokens: int) -> IdArray:
    """Ids of the whole blocks of `tokens`, chained after `parent` (16 bytes)."""
    n = len(tokens) // block_tokens
    buf = np.ascontiguousarray(tokens[: n * block_tokens], dtype="<u4").tobytes()
    step = 4 * block_tokens
    out = bytearray(16 * n)
    digest = xxhash.xxh3_128_digest
    prev = parent
    for i in range(n):
        prev = digest(prev + buf[i * step : (i + 1) * step])
        out[16 * i : 16 * i + 16] = prev
    return np.frombuffer(bytes(out), dtype="<u8").reshape(n, 2).astype(np.uint64)


def token_ids(ns: str, tokens: U32Array, block_tokens: int) -> IdArray:
    return chain_ids(ns_root(ns), tokens, block_tokens)


def salt_ids(ns: str, ids: IdArray) -> IdArray:
    """Caller ids -> internal ids (and back: XOR is its own inverse)."""
    out: IdArray = np.bitwise_xor(ids.astype(np.uint64), _salt(ns))
    return out


def id_bytes(row: IdArray) -> bytes:
    """One id (shape (2,)) as its 16-byte little-endian form."""
    return np.ascontiguousarray(row, dtype="<u8").tobytes()
