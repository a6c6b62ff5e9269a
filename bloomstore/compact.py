"""Compaction of one partition: rewrite its live entries, drop the dead ones.

All pages of the partition are read newest first; the newest version of every key
wins, keys whose newest version is a tombstone are dropped (every older version of
them is in these same pages, so the tombstone has nothing left to shadow). The live
entries, sorted, become the pages of a new file generation with a new chain written
in one go; the files are fsync'd, then a manifest snapshot names the new generation
(atomic rename), then the old files are unlinked. A crash before the rename leaves
the new files as orphans that the next open removes. The write buffer is not
touched: it holds newer versions than any page and stays in the log.
Memory: the live entries of one partition (1/P of the store) at once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bloomstore.chain import SLAB_FILTERS, Chain
from bloomstore.files import DataFile
from bloomstore.filter import Ints, digests, positions
from bloomstore.manifest import PageTable, PartitionState
from bloomstore.pages import Page, PageSpec, chunk_bounds, encode, zones
from bloomstore.partition import Partition, file_names


@dataclass(frozen=True, slots=True)
class CompactResult:
    partition: int
    pages_before: int
    pages_after: int
    entries_before: int
    entries_after: int
    bytes_before: int
    bytes_after: int


def live_entries(part: Partition, read: Callable[[Partition, int], Page]
                 ) -> tuple[list[bytes], list[bytes]]:
    """The newest live version of every key on the partition's pages, sorted by key."""
    seen: set[bytes] = set()
    live: dict[bytes, bytes] = {}
    for page_no in range(len(part.state.table) - 1, -1, -1):
        page = read(part, page_no)
        for e in range(page.n):
            key = page.key(e)
            if key in seen:
                continue
            seen.add(key)
            if not page.is_tombstone(e):
                live[key] = page.value(e)
    keys = sorted(live)
    return keys, [live[k] for k in keys]


def write_generation(part: Partition, keys: list[bytes], values: list[bytes],
                     page_bytes: int, fsync: bool) -> tuple[PartitionState, DataFile, Chain]:
    """New page and chain files of generation gen + 1 holding `keys`/`values`."""
    geo = part.geometry
    gen = part.state.gen + 1
    pages_name, chain_name = file_names(part.index, gen)
    pages = DataFile(part.dirpath / pages_name, create=True, truncate=True,
                     uncached=part.uncached)
    table = PageTable()
    chain = Chain(part.dirpath / chain_name, geo.filter_bits, 0, True, table.slab_sum)
    try:
        lo, hi = digests(keys)
        pos = positions(lo, hi, geo.hashes, geo.filter_bits)
        filters: list[Ints] = []
        offset = 0
        for a, b in chunk_bounds([len(k) for k in keys], [len(v) for v in values],
                                 geo.keys_per_page, page_bytes):
            data = encode(part.index, keys[a:b], values[a:b], lo[a:b])
            pages.write(data, offset)
            table.append(PageSpec(offset, len(data), b - a, zones(keys[a:b])))
            filters.append(pos[a:b])
            offset += len(data)
        for slab, checksum in enumerate(chain.write_all(filters)):
            table.set_slab_sum(slab * SLAB_FILTERS, checksum)
        chain.length = len(filters)
        if fsync:
            pages.sync()
            chain.sync()
    except BaseException:
        discard(pages, chain)
        raise
    state = PartitionState(gen, part.state.flushed_lsn, len(keys), 0, 0, table)
    return state, pages, chain


def discard(pages: DataFile, chain: Chain) -> None:
    for path in (pages.path, chain.path):
        path.unlink(missing_ok=True)
    pages.close()
    chain.close()
