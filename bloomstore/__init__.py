"""BloomStore: a Bloom-filter based, memory-efficient key-value store on flash.

A standalone re-implementation of Lu, Nam and Du, "BloomStore: Bloom-filter based
memory-efficient key-value store for indexing of data deduplication on flash"
(MSST 2012), with a write-ahead log, ordered range scans and compaction added. It
imports nothing of sarp; `backends/bloomstore.py` adapts it to sarp's Backend
protocol. See bloomstore/README.md.
"""

from bloomstore.config import Geometry, Tuning
from bloomstore.errors import (
    BloomStoreError,
    ConfigError,
    CorruptionError,
    FormatError,
    StoreClosedError,
    StoreIOError,
    StoreLockedError,
)
from bloomstore.store import BloomStore

__all__ = [
    "BloomStore",
    "BloomStoreError",
    "ConfigError",
    "CorruptionError",
    "FormatError",
    "Geometry",
    "StoreClosedError",
    "StoreIOError",
    "StoreLockedError",
    "Tuning",
]
