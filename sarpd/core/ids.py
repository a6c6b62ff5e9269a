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

The chain runs natively (sarpd/core/_chash.c, linked against libxxhash) when the
kernels given (`sarpd.core.native.Kernels`: an index's own, else the process default)
have it, else in the Python reference below, bit for bit the same; both check
their arguments alike (the same exceptions, the same text).
`chain_ids` hashes one sequence; `chain_ids_flat` (concatenated tokens + offsets) and
`chain_ids_many` (a list of sequences) hash a whole batch in one native call.
"""

from __future__ import annotations

import functools
import itertools
import operator
import sys
from collections.abc import Sequence
from typing import Any, overload

import numpy as np
import numpy.typing as npt
import xxhash

from sarpd.core import native
from sarpd.core.native import Kernels
from sarpd.errors import TooLarge
from sarpd.model import IdArray, U32Array

HASH_NAME = "xxh3-128-chain-v1"
MAX_BLOCK_TOKENS = 1 << 30  # the kernel's bound on block_tokens (4 GiB of tokens per block)

I64Array = npt.NDArray[np.int64]
IdsInput = bytes | bytearray | memoryview | IdArray  # 16 bytes per id


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


# -- the chain: dispatch ---------------------------------------------------------------
def chain_ids(parent: IdsInput, tokens: U32Array, block_tokens: int,
              k: Kernels | None = None) -> IdArray:
    """Ids of the whole blocks of `tokens` (1-D C-contiguous uint32), chained after
    `parent` (16 bytes); a trailing partial block has no id. `k`: the kernels that
    hash (None: the process default, `native.pick()`)."""
    c = (k or native.pick()).hash
    if c is None:
        return _ref_chain_ids(parent, tokens, block_tokens)
    return _ids(c.chain_ids(parent, tokens, block_tokens))


def chain_ids_flat(parents: IdsInput, tokens: U32Array, offsets: I64Array,
                   block_tokens: int, k: Kernels | None = None) -> tuple[IdArray, I64Array]:
    """`chain_ids` of every sequence of a batch in one call: sequence j is
    `tokens[offsets[j]:offsets[j + 1]]` (int64 offsets, non-decreasing within
    len(tokens)) chained after `parents[j]` (16 bytes each: bytes or an (m, 2) id
    array). Returns all ids concatenated and their offsets (m + 1 rows)."""
    if isinstance(parents, np.ndarray):
        parents = np.ascontiguousarray(parents, dtype="<u8")
    c = (k or native.pick()).hash
    if c is None:
        return _ref_chain_ids_flat(parents, tokens, offsets, block_tokens)
    raw, ioff = c.chain_ids_flat(parents, tokens, offsets, block_tokens)
    return _ids(raw), np.frombuffer(ioff, dtype=np.int64)


def chain_ids_many(parents: Sequence[bytes], seqs: Sequence[U32Array],
                   block_tokens: int, k: Kernels | None = None) -> list[IdArray]:
    """`chain_ids(parents[j], seqs[j], block_tokens)` for every j, in one call (the
    results are views of one array)."""
    if len(parents) != len(seqs):
        raise ValueError(f"parents and seqs must have the same length, got {len(parents)} "
                         f"and {len(seqs)}")
    tokens = _concat(seqs)
    offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
    np.cumsum([len(s) for s in seqs], out=offsets[1:])
    joined = b"".join(parents)
    if len(joined) != 16 * len(parents):
        j = next(j for j, p in enumerate(parents) if len(p) != 16)
        raise ValueError(f"parents[{j}] must be 16 bytes, got {len(parents[j])}")
    ids, ioff = chain_ids_flat(joined, tokens, offsets, block_tokens, k)
    bounds = ioff.tolist()
    return [ids[a:b] for a, b in itertools.pairwise(bounds)]


def _concat(seqs: Sequence[U32Array]) -> U32Array:
    """The sequences' tokens end to end; a sequence that is not 1-D uint32 is named."""
    try:
        tokens: U32Array = np.concatenate(seqs) if seqs else np.zeros(0, np.uint32)
        if tokens.dtype == np.uint32 and tokens.ndim == 1:
            return tokens
    except ValueError:
        pass
    for j, s in enumerate(seqs):
        if not isinstance(s, np.ndarray) or s.dtype != np.uint32 or s.ndim != 1:
            what = f"dtype {s.dtype}, ndim {s.ndim}" if isinstance(s, np.ndarray) else _tp_name(s)
            raise TypeError(f"seqs[{j}] must be a 1-D uint32 array, got {what}")
    raise AssertionError("unreachable: every sequence is 1-D uint32")


def token_ids(ns: str, tokens: U32Array, block_tokens: int, k: Kernels | None = None
              ) -> IdArray:
    return chain_ids(ns_root(ns), tokens, block_tokens, k)


@functools.lru_cache(maxsize=4096)
def _salt_bytes(ns: str) -> bytes:
    """The namespace's salt as the 16 bytes of its two native words (a batch's salts are
    these joined: one numpy call)."""
    return _salt(ns).tobytes()


@functools.lru_cache(maxsize=4096)
def _salt_words(ns: str) -> tuple[int, int]:
    lo, hi = _salt(ns)[0].tolist()
    return lo, hi


def salt_ids(ns: str, ids: IdArray, k: Kernels | None = None) -> IdArray:
    """Caller ids -> internal ids (and back: XOR is its own inverse). The match kernel's
    `salt` (one C loop) where it runs and `ids` are uint64; else a column at a time:
    numpy's (n, 2) ^ (1, 2) broadcast runs an inner loop of two."""
    out: IdArray = np.empty((len(ids), 2), np.uint64)
    c = (k or native.pick()).match
    if c is not None and ids.dtype == np.uint64 and ids.ndim == 2:
        c.salt(ids, out, *_salt_words(ns))
        return out
    salt = _salt(ns)
    np.bitwise_xor(ids[:, 0], salt[0, 0], out=out[:, 0], casting="unsafe")
    np.bitwise_xor(ids[:, 1], salt[0, 1], out=out[:, 1], casting="unsafe")
    return out


class Joined(Sequence[IdArray]):
    """`salt_ids_many`'s answer: the sequences' ids, views one after another of ONE
    array, kept as `flat` (a batch's ids for the match kernel, without a copy), with
    their lengths (`lens`). A sequence's view is made when it is asked for: a match
    batch asks for few (the kernel reads `flat` and `lens`)."""

    __slots__ = ("ends", "flat", "lens")

    def __init__(self, flat: IdArray, lens: list[int], ends: list[int]) -> None:
        self.flat, self.ends = flat, ends
        self.lens = np.array(lens, np.int64)

    def __len__(self) -> int:
        return len(self.ends)

    @overload
    def __getitem__(self, i: int) -> IdArray: ...
    @overload
    def __getitem__(self, i: slice) -> list[IdArray]: ...
    def __getitem__(self, i: int | slice) -> IdArray | list[IdArray]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self.ends)
        if not -n <= i < n:
            raise IndexError(f"sequence {i} of a batch of {n}")
        i %= n
        return self.flat[self.ends[i - 1] if i else 0 : self.ends[i]]


def salt_ids_many(nss: Sequence[str], ids: Sequence[IdArray], k: Kernels | None = None
                  ) -> Sequence[IdArray]:
    """`salt_ids` of a batch: one pass for all of it, not two numpy calls per sequence
    (the results are disjoint views of one array: a `Joined`). The match kernel's
    `salt_into` copies and salts every sequence in one call where it runs and the ids
    are uint64 pairs; else one concatenation (numpy's unsafe cast), then the salts."""
    if len(ids) <= 1:  # a lone query: no batch to share the calls with
        return [salt_ids(ns, a, k) for ns, a in zip(nss, ids, strict=True)]
    lens = [len(a) for a in ids]
    ends = list(itertools.accumulate(lens))
    c = (k or native.pick()).match
    flat: IdArray
    if c is not None:  # one C loop over the runs, each with its namespace's salt
        salts = np.frombuffer(b"".join([_salt_bytes(ns) for ns in nss]),
                              np.uint64).reshape(-1, 2)
        flat = np.empty((ends[-1], 2), np.uint64)
        try:
            c.salt_into(ids, flat, salts)
        except (TypeError, ValueError):  # not all (n, 2) uint64: numpy's cast first
            flat = np.concatenate(ids, dtype=np.uint64, casting="unsafe").reshape(-1, 2)
            c.salt_runs(flat, flat, np.array(ends, np.int64), salts)
    else:
        flat = np.concatenate(ids, dtype=np.uint64, casting="unsafe").reshape(-1, 2)
        if len(set(nss)) == 1:
            flat ^= _salt(nss[0])
        else:
            flat ^= np.repeat(np.concatenate([_salt(ns) for ns in nss]), lens, axis=0)
    return Joined(flat, lens, ends)


def id_bytes(row: IdArray) -> bytes:
    """One id (shape (2,)) as its 16-byte little-endian form."""
    return np.ascontiguousarray(row, dtype="<u8").tobytes()


_ID = np.dtype(("<u8", (2,)))  # one id: two little-endian words (frombuffer -> (n, 2))
_LITTLE = sys.byteorder == "little"


def _ids(raw: bytes | bytearray) -> IdArray:
    """16 bytes per id (a digest's canonical form) -> (n, 2) uint64, without a copy on a
    little-endian machine (writable when `raw` is a bytearray)."""
    out: IdArray = np.frombuffer(raw, dtype=_ID)
    return out if _LITTLE else out.astype(np.uint64)


# -- the chain: the Python reference (argument checks as _chash.c's, in the same order) --
def _ref_chain_ids(parent: object, tokens: object, block_tokens: object) -> IdArray:
    if (type(block_tokens) is int and 1 <= block_tokens <= MAX_BLOCK_TOKENS
            and type(parent) is bytes and len(parent) == 16 and _plain_u32(tokens)):
        return _ids(_chain(parent, tokens, block_tokens))  # type: ignore[arg-type]
    bt = _block_tokens(block_tokens)  # the general case, and the errors
    p = _contiguous(parent, "parent", "a 16-byte id (bytes)")
    if len(p) != 16:
        raise ValueError(f"parent must be 16 bytes, got {len(p)}")
    return _ids(_chain(p, _array(tokens, "tokens", np.uint32, "IL"), bt))


def _plain_u32(tokens: object) -> bool:
    """The common case, checked fast: a 1-D C-contiguous native uint32 ndarray."""
    return (type(tokens) is np.ndarray and tokens.dtype == np.uint32 and tokens.ndim == 1
            and tokens.flags.c_contiguous)


def _ref_chain_ids_flat(parents: object, tokens: object, offsets: object,
                        block_tokens: object) -> tuple[IdArray, I64Array]:
    bt = _block_tokens(block_tokens)
    off = _array(offsets, "offsets", np.int64, "ql")
    m = len(off) - 1
    if m < 0:
        raise ValueError("offsets must hold one entry more than there are sequences, "
                         "got 0 entries")
    p = _contiguous(parents, "parents", "16 bytes per sequence (bytes)")
    if len(p) != 16 * m:
        raise ValueError(f"parents must be 16 bytes per sequence ({m} sequences: {16 * m} "
                         f"bytes), got {len(p)}")
    t = _array(tokens, "tokens", np.uint32, "IL")
    bad = (off < np.concatenate(([0], off[:-1]))) | (off > len(t))
    if bad.any():
        j = int(bad.argmax())
        raise ValueError(f"offsets[{j}] = {int(off[j])}: offsets must be non-decreasing within "
                         f"[0, {len(t)}] (len(tokens))")
    bounds = off.tolist()
    raw = bytearray().join(_chain(p[16 * j : 16 * j + 16], t[bounds[j] : bounds[j + 1]], bt)
                           for j in range(m))
    ioff = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(np.diff(off) // bt, out=ioff[1:])
    return _ids(raw), ioff


def _chain(parent: bytes, tokens: npt.NDArray[np.uint32], bt: int) -> bytearray:
    """The chain itself: one XXH3-128 digest per whole block."""
    n = len(tokens) // bt
    buf = tokens[: n * bt].astype("<u4", copy=False).tobytes()
    step = 4 * bt
    out = bytearray(16 * n)
    digest = xxhash.xxh3_128_digest
    prev = parent
    for i in range(n):
        prev = digest(prev + buf[i * step : (i + 1) * step])
        out[16 * i : 16 * i + 16] = prev
    return out


def _tp_name(obj: object) -> str:
    """A type's name as C's tp_name spells it (builtins bare, others module-qualified)."""
    t = type(obj)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _view(obj: object, name: str, what: str) -> memoryview:
    try:
        return memoryview(obj)  # type: ignore[arg-type]  # any buffer; else TypeError
    except TypeError:
        raise TypeError(f"{name} must be {what}, got {_tp_name(obj)}") from None


def _contiguous(obj: object, name: str, what: str) -> bytes:
    v = _view(obj, name, what)
    if not v.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous")
    return v.tobytes()


_NATIVE_PREFIXES = "@=<" if _LITTLE else "@="


def _array(obj: object, name: str, dtype: type[np.uint32] | type[np.int64],
           formats: str) -> npt.NDArray[Any]:
    """`obj` as a 1-D C-contiguous array of `dtype`, whose buffer format (native
    order) is one of `formats`."""
    want = np.dtype(dtype)
    v = _view(obj, name, f"a 1-D {want.name} array")
    f = v.format[1:] if v.format[:1] and v.format[0] in _NATIVE_PREFIXES else v.format
    if v.itemsize != want.itemsize or f not in tuple(formats):
        raise TypeError(f"{name} must have dtype {want.name}, got buffer format "
                        f"'{v.format}' (itemsize {v.itemsize})")
    if v.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got ndim {v.ndim}")
    if not v.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (np.ascontiguousarray)")
    return np.frombuffer(v, dtype=dtype)


def _block_tokens(obj: object) -> int:
    try:
        bt = operator.index(obj)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(f"block_tokens must be an int, got {_tp_name(obj)}") from None
    if not 1 <= bt <= MAX_BLOCK_TOKENS:
        raise ValueError(f"block_tokens must be in [1, {MAX_BLOCK_TOKENS}], got {bt}")
    return bt
