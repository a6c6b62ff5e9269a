"""The synchronous index: ids, segments, the manifest, the routing directory,
snapshots, the verifier, the store (backend, segment cache, counters), the router
(routing points, candidates) and `SarpIndex` on top, with the write path, `check` and
`dump`. No asyncio, no sockets: the only I/O is the backend and the snapshot
directory.

The names in `__all__` are what the other rooms (the daemon, the cluster, sarpctl)
and the bench and tools may use; the submodules are the core's own. Two submodules
are public too: `sarpd.core.native` (which native code runs) and `sarpd.core.verify`
(the first-mismatch verifier), each with its `__all__`. An import-linter contract
keeps tools/ off the private submodules (pyproject.toml), tests/test_public_api.py
checks every name tools/ imports.

Each name is loaded on first use (PEP 562 `__getattr__`): importing one submodule
(say `sarpd.core.ids`, as the protocol does) or `SarpIndex` (a restart) does not
import the rest (the bulk builder, the inspection).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sarpd.core import native, verify
    from sarpd.core.bulk import BulkBuilder, BulkReport
    from sarpd.core.directory import Directory, DirectoryArrays
    from sarpd.core.ids import HASH_NAME, chain_ids, check_sequence_tokens, ns_root, salt_ids
    from sarpd.core.index import RecoveryReport, SarpIndex, WriteOp
    from sarpd.core.inspection import ChainStarts, branches, chain_starts, dump_or_error
    from sarpd.core.segment import MANIFEST_KEY, Counters, Segment, block_keys, seg_key
    from sarpd.core.shards import check_shards, shard_of
    from sarpd.core.snapshot import PendingSnapshot
    from sarpd.core.store import Activity, Store, data_paths, open_backend

__all__ = [
    "HASH_NAME",
    "MANIFEST_KEY",
    "Activity",
    "BulkBuilder",
    "BulkReport",
    "ChainStarts",
    "Counters",
    "Directory",
    "DirectoryArrays",
    "PendingSnapshot",
    "RecoveryReport",
    "SarpIndex",
    "Segment",
    "Store",
    "WriteOp",
    "block_keys",
    "branches",
    "chain_ids",
    "chain_starts",
    "check_sequence_tokens",
    "check_shards",
    "data_paths",
    "dump_or_error",
    "native",
    "ns_root",
    "open_backend",
    "salt_ids",
    "seg_key",
    "shard_of",
    "verify",
]

# name -> the submodule that defines it
_HOME = {
    "HASH_NAME": "ids", "chain_ids": "ids", "check_sequence_tokens": "ids", "ns_root": "ids",
    "salt_ids": "ids",
    "BulkBuilder": "bulk", "BulkReport": "bulk",
    "Directory": "directory", "DirectoryArrays": "directory",
    "RecoveryReport": "index", "SarpIndex": "index", "WriteOp": "index",
    "branches": "inspection", "dump_or_error": "inspection",
    "ChainStarts": "inspection", "chain_starts": "inspection",
    "MANIFEST_KEY": "segment", "Counters": "segment", "Segment": "segment",
    "block_keys": "segment", "seg_key": "segment",
    "check_shards": "shards", "shard_of": "shards",
    "PendingSnapshot": "snapshot",
    "Activity": "store", "Store": "store", "data_paths": "store", "open_backend": "store",
}


def __getattr__(name: str) -> Any:
    if name in ("native", "verify"):
        value: Any = importlib.import_module(f"{__name__}.{name}")
    elif name in _HOME:
        value = getattr(importlib.import_module(f"{__name__}.{_HOME[name]}"), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
