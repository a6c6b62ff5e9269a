"""One partition ("instance" in the paper): its write buffer, its KV page file and its
Bloom-filter chain, and the flush of the buffer into pages.

A flush writes the buffer's entries, sorted by key, as one or more pages (at most
`keys_per_page` entries each, so that no filter holds more keys than it was sized
for) at the end of the `.pages` file, and each page's filter as the next column of
the chain. Nothing of it is visible until the owner has appended the manifest edits
and calls `commit`; a flush that fails leaves bytes past the committed end, which the
next flush overwrites.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bloomstore.chain import Chain
from bloomstore.config import Geometry, Tuning
from bloomstore.errors import CorruptionError
from bloomstore.files import DataFile
from bloomstore.filter import Ints, digests, positions
from bloomstore.manifest import FlushEdit, PartitionState, apply_flush
from bloomstore.pages import Page, PageSpec, chunk_bounds, encode, zones

# Python's dict entry, two bytes objects and their headers: the RAM of one buffered
# entry beyond its key and value bytes (measured with sys.getsizeof, rounded up).
ENTRY_OVERHEAD = 128


def file_names(index: int, gen: int) -> tuple[str, str]:
    stem = f"p{index:04d}-{gen:06d}"
    return stem + ".pages", stem + ".chain"


class Partition:
    def __init__(self, index: int, state: PartitionState, dirpath: Path,
                 geometry: Geometry, uncached: bool = False) -> None:
        self.index = index
        self.uncached = uncached  # page reads bypass the OS page cache (DataFile)
        self.state = state
        self.dirpath = dirpath
        self.geometry = geometry
        self.buffer: dict[bytes, bytes | None] = {}
        self.buffer_bytes = 0  # keys and values
        self.pages: DataFile | None = None
        self.chain: Chain | None = None
        self.file_gen = state.gen
        if state.gen:
            self._open(state.gen, create=False)

    # -- files -----------------------------------------------------------------------
    def _open(self, gen: int, create: bool) -> None:
        pages_name, chain_name = file_names(self.index, gen)
        pages_path = self.dirpath / pages_name
        if not create and not pages_path.exists():
            raise CorruptionError(f"{pages_path}: missing (the manifest lists "
                                  f"{len(self.state.table)} pages in it)")
        self.pages = DataFile(pages_path, create=create, truncate=create,
                              uncached=self.uncached)
        self.chain = Chain(self.dirpath / chain_name, self.geometry.filter_bits,
                           len(self.state.table), create, self.slab_sum)
        self.file_gen = gen

    def slab_sum(self, slab: int) -> int:
        return self.state.table.slab_sum(slab)

    def close(self) -> None:
        if self.pages is not None:
            self.pages.close()
        if self.chain is not None:
            self.chain.close()

    def sync_files(self) -> None:
        assert self.pages is not None and self.chain is not None
        self.pages.sync()
        self.chain.sync()

    def where(self, page: int) -> str:
        path = self.pages.path if self.pages is not None else self.dirpath
        offset, length = self.state.table.location(page)
        return f"{path} page {page} ({length} bytes at {offset})"

    def read_page(self, page: int) -> Page:
        """Read and verify one page (CorruptionError if it fails a check)."""
        assert self.pages is not None
        offset, length = self.state.table.location(page)
        try:
            data = self.pages.read(length, offset)
        except EOFError as exc:
            raise CorruptionError(f"{self.where(page)}: {exc}") from exc
        return Page(data, self.where(page), self.index)

    # -- buffer ----------------------------------------------------------------------
    def put(self, key: bytes, value: bytes | None) -> None:
        old = self.buffer.get(key, b"")
        if key in self.buffer:
            self.buffer_bytes -= len(key) + len(old or b"")
        self.buffer[key] = value
        self.buffer_bytes += len(key) + len(value or b"")

    def due(self, tuning: Tuning) -> bool:
        return (len(self.buffer) >= self.geometry.keys_per_page
                or self.buffer_bytes >= tuning.page_bytes)

    def buffer_ram(self) -> int:
        return self.buffer_bytes + ENTRY_OVERHEAD * len(self.buffer)

    # -- flush -----------------------------------------------------------------------
    def write_buffer(self, lsn: int, tuning: Tuning) -> list[FlushEdit]:
        """Write the buffer as pages and filters past the committed end; return the
        manifest edits that make them visible (see `commit`)."""
        geo = self.geometry
        if self.chain is None:
            self._open(self.state.gen + 1, create=True)
        assert self.pages is not None and self.chain is not None
        keys = sorted(self.buffer)
        values = [self.buffer[k] for k in keys]
        lo, hi = digests(keys)
        pos = positions(lo, hi, geo.hashes, geo.filter_bits)
        older = self.chain.any_candidate(pos)
        chance = 1.0 - (1.0 - geo.target_fp_rate) ** self.chain.length
        bounds = chunk_bounds([len(k) for k in keys], [len(v or b"") for v in values],
                              geo.keys_per_page, tuning.page_bytes)
        edits: list[FlushEdit] = []
        offset, page = self.state.table.end(), len(self.state.table)
        for a, b in bounds:
            data = encode(self.index, keys[a:b], values[a:b], lo[a:b])
            self.pages.write(data, offset)
            slab_sum = self.chain.write_filter(page, pos[a:b])
            tombs = sum(v is None for v in values[a:b])
            overwrites = max(0, round(int(older[a:b].sum()) - (b - a) * chance))
            spec = PageSpec(offset, len(data), b - a, zones(keys[a:b]))
            # only the last page of the flush moves the flushed lsn: if a crash keeps
            # only some of these edits, the log replays the whole buffer again
            done = lsn if b == len(keys) else self.state.flushed_lsn
            edits.append(FlushEdit(self.index, self.file_gen, page, spec, done,
                                   overwrites + tombs, tombs, slab_sum))
            offset, page = offset + len(data), page + 1
        return edits

    def commit(self, edits: list[FlushEdit]) -> None:
        """The edits are in the manifest: the pages are now part of the partition."""
        assert self.chain is not None
        for edit in edits:
            try:
                apply_flush(self.state, edit)
            except ValueError as exc:  # a bug: the edit was built from this very state
                raise AssertionError(str(exc)) from exc
        self.chain.length = len(self.state.table)
        self.buffer.clear()
        self.buffer_bytes = 0

    def dead_ratio(self) -> float:
        return self.state.dead / self.state.entries if self.state.entries else 0.0

    # -- replacement by compaction ---------------------------------------------------
    def adopt(self, state: PartitionState, pages: DataFile, chain: Chain) -> None:
        """Switch to a compacted generation; the old files are unlinked (a scan that
        holds the old page file keeps reading it)."""
        old_pages, old_chain = self.pages, self.chain
        self.state, self.pages, self.chain, self.file_gen = state, pages, chain, state.gen
        for old in (old_pages, old_chain):
            if old is not None:
                path = old.path
                if isinstance(old, Chain):
                    old.close()
                path.unlink(missing_ok=True)

    def candidates(self, lo: np.ndarray, hi: np.ndarray) -> list[list[int]]:
        """Candidate pages of keys (their digest halves), newest first."""
        if self.chain is None or not self.chain.length:
            return [[] for _ in range(len(lo))]
        pos: Ints = positions(lo, hi, self.geometry.hashes, self.geometry.filter_bits)
        return self.chain.candidates(pos)
