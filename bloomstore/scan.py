"""Ordered range scans over hash-partitioned pages.

Hash partitioning loses key order, so a scan merges: the buffers' entries in range,
then, partition by partition, the pages that may hold keys in range, newest first
(the first version of a key seen wins; a tombstone hides older versions). Which
pages may hold keys in [start, end) comes from the zone map of the page table (RAM,
per page): the prefix8 bounds of each run of keys that share a first byte (at most
8 runs per page). sarp's key spaces each have their own first byte, so a page
contributes one zone per key space; a b"L" range scan after a snapshot (change-log
versions only grow) touches only the pages flushed since the change log reached
the snapshot's watermark, not every page. A b"S" full scan reads every page holding
a segment. Cost: the pages read once (verified, through the page cache), then one
sorted list of the keys in range held in RAM; the values are read when yielded
(from the cached page, else by one pread of the value alone).

A scan sees the store as of its first step; later writes do not show up in it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bloomstore.files import DataFile
from bloomstore.filter import prefix8
from bloomstore.pages import Page
from bloomstore.partition import Partition


@dataclass(frozen=True, slots=True)
class ValueRef:
    """Where a value is: a page (its cache key) and the bytes within its file."""

    page_key: tuple[int, int, int]
    file: DataFile
    page_offset: int  # of the page in the file
    offset: int  # of the value in the page
    length: int


Found = bytes | ValueRef


def collect(parts: list[Partition], start: bytes, end: bytes,
            read: Callable[[Partition, int], Page]) -> list[tuple[bytes, Found]]:
    """Every live key in [start, end) with its value or where to read it, sorted."""
    low, high = prefix8(start), prefix8(end)
    items: dict[bytes, Found] = {}
    for part in parts:
        found: dict[bytes, Found | None] = {
            k: v for k, v in part.buffer.items() if start <= k < end}
        table = part.state.table
        for page_no in table.pages_overlapping(low, high):
            page = read(part, page_no)
            entries = page.key_range(start, end)
            if not entries:
                continue
            assert part.pages is not None
            base, _ = table.location(page_no)
            page_key = (part.index, part.state.gen, page_no)
            for e in entries:
                key = page.key(e)
                if key in found:
                    continue
                if page.is_tombstone(e):
                    found[key] = None
                else:
                    offset, length = page.value_span(e)
                    found[key] = ValueRef(page_key, part.pages, base, offset, length)
        items.update((k, v) for k, v in found.items() if v is not None)
    return sorted(items.items(), key=lambda kv: kv[0])
