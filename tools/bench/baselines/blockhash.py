"""One entry per block: DRAM-BlockHash (a Python dict, vLLM style, rebuilt from a
per-block store on restart) and SSD-BlockHash (the same entries on the backend only).

Per-block store layout (both): key = salted block id, 8 bytes big-endian; value =
metadata, 8 bytes little-endian. Nothing else is stored.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import cast

import numpy as np
import numpy.typing as npt

from backends.base import WriteBatch
from tools.bench.api import Ids
from tools.bench.baselines._common import (
    U64,
    BackendBaseline,
    be_keys,
    check_insert_args,
    first_absent,
    first_miss,
    le_values,
    salted,
)

_SCAN_END = b"\xff" * 9  # past every 8-byte key
_SMALL_INTS = range(-5, 257)  # CPython's shared int objects


class SsdBlockHash(BackendBaseline):
    """SSD-BlockHash: every block is one backend key (salted id, 8 B big-endian) ->
    its metadata (8 B), and nothing is kept in memory. Match: ONE backend multi-get of
    every id of every prompt of the batch (misses cost a Bloom-filter probe on
    RocksDB), then per prompt the first miss ends the match. Insert: the first block
    not yet indexed, found per sequence in two or three rounds of one multi-get each
    (up to 64 evenly spaced positions per sequence, then the narrowed gap: presence is
    prefix-closed, nothing is ever removed), then one write batch (one fsync under
    sync=always) of the blocks from there on, the first occurrence in the batch
    winning. Recovery: a fresh process reopens the backend and answers the first
    match. Memory: the engine's (its cache, memtables); reads: one per id looked up."""

    name = "ssd-blockhash"

    def _open_state(self) -> None:
        self._open_backend()

    def match_many(self, prompts: Sequence[Ids], ns: Sequence[str]) -> list[U64]:
        keys: list[bytes] = []
        for p, n in zip(prompts, ns, strict=True):
            keys += be_keys(salted(p, n))
        values = self.backend.get_many(keys) if keys else []
        out: list[U64] = []
        off = 0
        for p in prompts:
            vs = values[off: off + len(p)]
            off += len(p)
            k = first_miss(vs)
            hits = cast("list[bytes]", vs[:k])
            out.append(np.frombuffer(b"".join(hits), dtype="<u8").astype(np.uint64))
        return out

    def insert_many(self, seqs: Sequence[Ids], ns: Sequence[str],
                    metas: Sequence[npt.NDArray[np.uint64]]) -> None:
        check_insert_args(seqs, ns, metas, self.name)
        qs = [salted(s, n) for s, n in zip(seqs, ns, strict=True)]
        get = self.backend.get_many
        firsts = first_absent(qs, lambda ids: [v is not None for v in get(be_keys(ids))])
        puts: dict[bytes, bytes] = {}
        for q, m, k0 in zip(qs, metas, firsts, strict=True):
            if k0 < len(q):
                for k, mb in zip(be_keys(q[k0:]), le_values(m[k0:]), strict=True):
                    puts.setdefault(k, mb)  # the first occurrence in the batch wins
        self.backend.write(WriteBatch(puts=puts), self.sync)
        self.remember_probe(seqs, ns)



class DramBlockHash(BackendBaseline):
    """DRAM-BlockHash: vLLM-style prefix caching index, a Python dict
    salted block id (int) -> metadata (int). Match: `map(dict.get, ids)` (C speed),
    the first None ends the match. Insert: first insert wins (`not in dict` -> add);
    the new entries are also written, in the same `insert_many`, as one write batch
    (one key per block, the SSD-BlockHash layout) to the run's backend, durable as the
    run's sync policy says. Recovery: a fresh process opens the backend, scans the
    whole per-block store into a new dict (keys and values decoded with numpy, then
    `dict(zip(...))`) and answers the first match. memory_bytes (its whole
    footprint): sys.getsizeof of the dict (its hash table) plus every key int object
    plus every value int object that is not one of CPython's shared small ints
    (computed by a walk when asked), plus the engine memory of its backend. A match
    reads nothing from the backend."""

    name = "dram-blockhash"

    def __init__(self, *, sync: bool = False) -> None:
        super().__init__(sync=sync)
        self._dict: dict[int, int] = {}
        self.load_detail = ""

    def _open_state(self) -> None:
        backend = self._open_backend()
        keys: list[bytes] = []
        values: list[bytes] = []
        for k, v in backend.scan(b"", _SCAN_END):
            keys.append(k)
            values.append(v)
        ids = np.frombuffer(b"".join(keys), dtype=">u8").tolist()
        metas = np.frombuffer(b"".join(values), dtype="<u8").tolist()
        self._dict = dict(zip(ids, metas, strict=True))
        self.load_detail = f"{len(self._dict)} entries loaded into the dict"

    def _close_state(self) -> None:
        self._dict = {}
        super()._close_state()

    def match_many(self, prompts: Sequence[Ids], ns: Sequence[str]) -> list[U64]:
        get = self._dict.get
        out: list[U64] = []
        for p, n in zip(prompts, ns, strict=True):
            vals = list(map(get, salted(p, n).tolist()))
            out.append(np.array(vals[: first_miss(vals)], dtype=np.uint64))
        return out

    def insert_many(self, seqs: Sequence[Ids], ns: Sequence[str],
                    metas: Sequence[npt.NDArray[np.uint64]]) -> None:
        check_insert_args(seqs, ns, metas, self.name)
        d = self._dict
        new_ids: list[U64] = []
        new_metas: list[U64] = []
        for s, n, m in zip(seqs, ns, metas, strict=True):
            ids = salted(s, n)
            ks = ids.tolist()
            present = list(map(d.__contains__, ks))
            try:
                k0 = present.index(False)
            except ValueError:
                continue
            fresh: list[int] = []
            for i, k, meta in zip(range(k0, len(ks)), ks[k0:], m[k0:].tolist(), strict=True):
                if k not in d:
                    d[k] = meta
                    fresh.append(i)
            new_ids.append(ids[fresh])
            new_metas.append(np.asarray(m, dtype=np.uint64)[fresh])
        puts: dict[bytes, bytes] = {}
        if new_ids:
            puts = dict(zip(be_keys(np.concatenate(new_ids)),
                            le_values(np.concatenate(new_metas)), strict=True))
        self.backend.write(WriteBatch(puts=puts), self.sync)
        self.remember_probe(seqs, ns)

    def memory_bytes(self) -> int:
        d = self._dict
        total = sys.getsizeof(d) + sum(map(sys.getsizeof, d))
        total += sum(sys.getsizeof(v) for v in d.values() if v not in _SMALL_INTS)
        return total + super().memory_bytes()

    def __len__(self) -> int:
        return len(self._dict)
