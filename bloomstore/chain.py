"""The Bloom-filter chain of one partition, on flash, laid out bit-sliced.

File `iPPPP-GGGGGG.chain` (no header: the filter size m lives in the manifest):

    slab s, s = 0, 1, ...   at offset s * m * 8
        m little-endian u64 words; bit b of word j = bit j of the filter of page
        64 * s + b

So bit position j of 64 consecutive filters is ONE 8-byte word: a lookup reads the
same k positions of every slab (k words per 64 pages, numpy fancy indexing on a
read-only mmap of the file) and ANDs them; a set bit b of slab s marks page
64 * s + b as a candidate. Candidates are returned newest (highest page) first.

Integrity: the manifest keeps an xxh3-64 checksum of every slab, computed over its
words with the columns >= length masked off (chain bits have no redundancy: a
flipped bit could hide a page, and a hidden page would be served as an absent key).
A chain verifies each slab once per open, before its first use, and raises
CorruptionError on a mismatch; slabs it writes itself it knows.

Invariants: the filter of page f is valid iff f < `length` (the manifest's page
count of the partition). The columns >= length of the last slab may hold bits of a
flush that crashed before its manifest edit: lookups mask them off and a new filter
clears its column before setting its bits. A new filter rewrites its slab in place
(one 8*m-byte write); the bits of the older filters in it are rewritten unchanged, so
a torn write cannot alter them. A slab beyond ceil(length / 64) is garbage of the
same kind and is overwritten.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import numpy.typing as npt
import xxhash

from bloomstore.errors import CorruptionError
from bloomstore.files import DataFile
from bloomstore.filter import Ints

SLAB_FILTERS = 64
U64Array = npt.NDArray[np.uint64]
# bound the (slabs, keys, hashes) word array of one lookup step to ~32 MiB
_LOOKUP_WORDS = 4 << 20


def slab_checksum(words: U64Array, columns: int) -> int:
    """xxh3-64 of a slab's words with only its first `columns` filters kept."""
    if columns < SLAB_FILTERS:
        words = words & np.uint64((1 << columns) - 1)
    return xxhash.xxh3_64_intdigest(words.astype("<u8").tobytes())


class Chain:
    """One partition's chain file. `length` is set by the owner from the manifest and
    advanced only once a new filter's manifest edit is written; `expected(s)` gives
    the manifest's checksum of slab s."""

    def __init__(self, path: Path, bits: int, length: int, create: bool,
                 expected: Callable[[int], int]) -> None:
        self.path = path
        self.bits = bits
        self.length = length
        self.expected = expected
        self._verified = 0  # slabs [0, _verified) passed their checksum
        self.file = DataFile(path, create=create, truncate=create)
        self._map: mmap.mmap | None = None
        self._slabs: U64Array = np.empty((0, bits), np.uint64)
        self._remap()

    @property
    def slab_bytes(self) -> int:
        return self.bits * 8

    def _remap(self) -> None:
        count = self.file.size() // self.slab_bytes
        self._slabs = np.empty((0, self.bits), np.uint64)
        self._map = None  # an exported view keeps the old map alive until dropped
        if count:
            self._map = mmap.mmap(self.file.fd, count * self.slab_bytes, prot=mmap.PROT_READ)
            self._slabs = np.frombuffer(self._map, dtype="<u8").reshape(count, self.bits)

    def close(self) -> None:
        self._slabs = np.empty((0, self.bits), np.uint64)
        self._map = None
        self.file.close()

    def mapped_bytes(self) -> int:
        return int(self._slabs.nbytes)

    # -- writing ---------------------------------------------------------------------
    def write_filter(self, page: int, pos: Ints) -> int:
        """Set column `page` to the filter of the keys with bit positions `pos`; return
        the slab's new checksum (for the manifest). Does not change `length`."""
        self.verify()
        s, b = divmod(page, SLAB_FILTERS)
        fresh = s >= len(self._slabs)
        slab = np.zeros(self.bits, np.uint64) if fresh else self._slabs[s].copy()
        bit = np.uint64(1 << b)
        slab &= ~bit
        slab[np.unique(pos.ravel())] |= bit
        self.file.write(slab.astype("<u8").tobytes(), s * self.slab_bytes)
        if fresh:
            self._remap()
        return slab_checksum(slab, b + 1)

    def write_all(self, filters: list[Ints]) -> list[int]:
        """A new chain holding `filters` (page 0 first), written in one go; return the
        checksum of every slab."""
        count = (len(filters) + SLAB_FILTERS - 1) // SLAB_FILTERS
        slabs = np.zeros((count, self.bits), np.uint64)
        for page, pos in enumerate(filters):
            s, b = divmod(page, SLAB_FILTERS)
            slabs[s, np.unique(pos.ravel())] |= np.uint64(1 << b)
        if count:
            self.file.write(slabs.astype("<u8").tobytes(), 0)
        self._remap()
        self._verified = count
        return [slab_checksum(slabs[s], min(SLAB_FILTERS, len(filters) - s * SLAB_FILTERS))
                for s in range(count)]

    def verify(self) -> None:
        """Check the slabs not checked yet against the manifest's checksums."""
        count = (self.length + SLAB_FILTERS - 1) // SLAB_FILTERS
        if count > len(self._slabs):
            raise CorruptionError(f"{self.path}: {len(self._slabs)} slabs, the manifest "
                                  f"lists {self.length} filters ({count} slabs)")
        for s in range(self._verified, count):
            columns = min(SLAB_FILTERS, self.length - s * SLAB_FILTERS)
            if slab_checksum(self._slabs[s], columns) != self.expected(s):
                raise CorruptionError(f"{self.path}: slab {s} (filters {s * SLAB_FILTERS}.."
                                      f"{s * SLAB_FILTERS + columns - 1}) fails its checksum")
        self._verified = max(self._verified, count)

    def sync(self) -> None:
        self.file.sync()

    # -- lookup ----------------------------------------------------------------------
    def _words(self, pos: Ints) -> U64Array:
        """(slabs, n) AND of the k words of every key, columns >= length masked."""
        count = (self.length + SLAB_FILTERS - 1) // SLAB_FILTERS
        if count == 0 or len(pos) == 0:
            return np.zeros((0, len(pos)), np.uint64)
        self.verify()
        slabs = self._slabs[:count]
        step = max(1, _LOOKUP_WORDS // (count * pos.shape[1]))
        parts = [np.bitwise_and.reduce(slabs[:, pos[i : i + step]], axis=2)
                 for i in range(0, len(pos), step)]
        acc = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=1)
        tail = self.length % SLAB_FILTERS
        if tail:
            acc[count - 1] &= np.uint64((1 << tail) - 1)
        return acc

    def candidates(self, pos: Ints) -> list[list[int]]:
        """For each key (row of `pos`), the pages whose filter holds all its bits,
        newest first: a superset of the pages that hold the key."""
        acc = self._words(pos)
        out: list[list[int]] = [[] for _ in range(len(pos))]
        slab_idx, key_idx = np.nonzero(acc)
        words = acc[slab_idx, key_idx].tolist()
        for s, i, w in zip(reversed(slab_idx.tolist()), reversed(key_idx.tolist()),
                           reversed(words), strict=True):
            base = s * SLAB_FILTERS
            found = out[i]
            while w:
                b = w.bit_length() - 1
                found.append(base + b)
                w ^= 1 << b
        return out

    def any_candidate(self, pos: Ints) -> npt.NDArray[np.bool_]:
        """Whether any filter of the chain may hold each key (no page read)."""
        acc = self._words(pos)
        if acc.shape[0] == 0:
            return np.zeros(len(pos), np.bool_)
        return np.asarray((acc != 0).any(axis=0))
