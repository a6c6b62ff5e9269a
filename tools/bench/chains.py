"""Prefix-chained 64-bit block ids, computed vectorised (numpy).

The one hashing rule the workloads (tools/bench/workloads.py) and the trace replay
(tools/bench/traces.py) share. A block's content hash is mixed into a polynomial
running hash of all earlier blocks, then finalised with its position: two sequences
sharing their first k whole blocks share their first k ids and (but for a 2^-64
chance) nothing else. The id 0 never appears.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from tools.bench.api import BLOCK_TOKENS, Ids

U64 = np.uint64

_M1 = U64(0xBF58476D1CE4E5B9)
_M2 = U64(0x94D049BB133111EB)
_GOLDEN = U64(0x9E3779B97F4A7C15)
_P = 0x100000001B3 * 2 + 1  # odd multiplier of the running hash (invertible mod 2^64)
_Q = pow(_P, -1, 1 << 64)
_ZERO_STANDIN = U64(0x5A5250B10C5EED01)  # replaces a (2^-64-likely) id 0
_MASK = (1 << 64) - 1

_powers: dict[str, npt.NDArray[np.uint64]] = {}


def mix64(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """splitmix64's finaliser, elementwise (a bijection on uint64)."""
    x = x ^ (x >> U64(30))
    x = x * _M1
    x = x ^ (x >> U64(27))
    x = x * _M2
    return x ^ (x >> U64(31))


def _power_table(n: int) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.uint64]]:
    """P^1..P^n and Q^1..Q^n (mod 2^64), grown by doubling and kept."""
    have = _powers.get("P")
    if have is None or len(have) < n:
        size = max(n, 2 * (0 if have is None else len(have)), 4096)
        _powers["P"] = np.cumprod(np.full(size, _P, dtype=U64), dtype=U64)
        _powers["Q"] = np.cumprod(np.full(size, _Q, dtype=U64), dtype=U64)
    return _powers["P"][:n], _powers["Q"][:n]


def root_state(*key: int) -> int:
    """A chain root (the running hash before the first block) for a key of ints."""
    acc = np.array([0x736172702D726F6F], dtype=U64)
    for k in key:
        acc = mix64(acc ^ U64(k & _MASK)) + _GOLDEN
    return int(mix64(acc)[0])


def chain_segments(content: npt.NDArray[np.uint64], lengths: npt.NDArray[np.int64],
                   root: int) -> Ids:
    """`chain_ids` of consecutive segments of `content` (of `lengths` blocks each),
    every segment chained from `root`, in one vectorised pass; ids concatenated.

    H_i = H_(i-1) * P + c_i (mod 2^64), H_0 = root, is P^i * (root + sum_(j<=i) c_j Q^j)
    with Q = P^-1; a segment starting at global block s rescales the global prefix sum
    by P^s. id_i = mix64(H_i + i * golden) (i from 1 in its segment), never 0."""
    n = len(content)
    if n == 0:
        return np.empty(0, dtype=U64)
    p, q = _power_table(n)
    g = np.cumsum(content * q, dtype=U64)
    starts = np.cumsum(lengths) - lengths
    base = np.where(starts > 0, g[np.maximum(starts - 1, 0)], U64(0))
    scale = np.where(starts > 0, p[np.maximum(starts - 1, 0)], U64(1))
    local = np.arange(n, dtype=np.int64) - np.repeat(starts, lengths)
    h = p[local] * ((g - np.repeat(base, lengths)) * np.repeat(scale, lengths) + U64(root))
    ids = mix64(h + (local + 1).astype(U64) * _GOLDEN)
    ids[ids == 0] = _ZERO_STANDIN
    return ids


def chain_ids(content: npt.NDArray[np.uint64], root: int) -> Ids:
    """Prefix-chained ids of blocks whose content hashes are `content`, from `root`."""
    return chain_segments(content, np.array([len(content)], dtype=np.int64), root)


def block_content(tokens: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """Content hash of each whole 16-token block of `tokens` (the tail is dropped)."""
    n = len(tokens) // BLOCK_TOKENS
    pairs = tokens[: n * BLOCK_TOKENS].astype(U64).reshape(n, BLOCK_TOKENS // 2, 2)
    packed = pairs[:, :, 0] | (pairs[:, :, 1] << U64(32))
    c = np.full(n, 0x746F6B656E73, dtype=U64)
    for k in range(BLOCK_TOKENS // 2):
        c = mix64(c ^ packed[:, k]) + _GOLDEN
    return c


def token_ids(tokens: npt.NDArray[np.uint64], root: int) -> Ids:
    """Block ids of the whole blocks of a token sequence."""
    return chain_ids(block_content(tokens), root)
