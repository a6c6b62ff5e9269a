"""Segment-Radix's storage layout: its backend keys and its snapshot file.

Backend keys (ids big-endian, so a scan of C is ordered by parent, then first id)::

  P + node id            -> the node's ids then metas (raw little-endian uint64)
  C + parent id + first  -> child id, id of its last block, s, e (EDGE, "<QQII")
  L + version            -> node id, parent id, first (LOG: change log since the snapshot)
  M                      -> next node id, next version (META)

Snapshot (`SNAPSHOT` in the data directory, numpy .npz, replaced atomically: temp
file, fsync, rename, fsync the directory): uint64 columns id, pid, first, s, e, last
and a bool column complete of the resident nodes sorted by (s, id), parents first;
scalars format (SNAPSHOT_FORMAT), version (the change log from it on is newer),
next_id, root_complete.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from backends.base import Backend
from tools.bench.baselines._radix_node import FIELDS, Node

P, C, L, M = b"P", b"C", b"L", b"M"
EDGE = struct.Struct("<QQII")  # child id, last id, s, e
LOG = struct.Struct("<QQQ")  # node id, parent id, first id
META = struct.Struct("<QQ")  # next node id, next version
SNAPSHOT = "radix-snapshot.npz"
SNAPSHOT_FORMAT = 1

Columns = dict[str, npt.NDArray[Any]]


def after(prefix: bytes) -> bytes:
    """The first key past every key starting with the 1-byte `prefix`."""
    return bytes([prefix[0] + 1])


def edge_columns(backend: Backend) -> Columns:
    """Every edge on the backend as snapshot columns (sorted by s, then id; every node
    complete): what a cold start without a snapshot rebuilds from."""
    keys: list[bytes] = []
    recs: list[bytes] = []
    for key, rec in backend.scan(C, after(C)):
        keys.append(key[1:])
        recs.append(rec)
    kk = np.frombuffer(b"".join(keys), dtype=">u8").reshape(-1, 2).astype(np.uint64)
    rr = np.frombuffer(b"".join(recs), dtype=np.dtype(
        [("id", "<u8"), ("last", "<u8"), ("s", "<u4"), ("e", "<u4")]))
    cols: Columns = {
        "id": rr["id"].astype(np.uint64), "pid": kk[:, 0], "first": kk[:, 1],
        "s": rr["s"].astype(np.uint64), "e": rr["e"].astype(np.uint64),
        "last": rr["last"].astype(np.uint64)}
    order = np.lexsort((cols["id"], cols["s"]))
    cols = {f: a[order] for f, a in cols.items()}
    cols["complete"] = np.ones(len(order), dtype=bool)
    return cols


def read_snapshot(data_dir: Path) -> Columns:
    """The snapshot's columns and scalars; FileNotFoundError if there is none, OSError,
    ValueError or KeyError if it is unreadable (the caller then scans the edges)."""
    with np.load(data_dir / SNAPSHOT) as snap:
        return {k: snap[k] for k in snap.files}


def write_snapshot(data_dir: Path, nodes: Sequence[Node], *, root_complete: bool,
                   version: int, next_id: int) -> None:
    """Replace the snapshot with `nodes` (sorted by (s, id)), atomically and durably."""
    cols: dict[str, Any] = {
        k: np.array([getattr(n, k) for n in nodes], dtype=np.uint64) for k in FIELDS}
    cols["complete"] = np.array([n.complete for n in nodes], dtype=bool)
    cols.update(format=SNAPSHOT_FORMAT, version=version, next_id=next_id,
                root_complete=root_complete)
    path = data_dir / SNAPSHOT
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as f:
        np.savez(f, **cols)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dfd = os.open(data_dir, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
