"""sarp's budget split, its open, and the recovery child the bench spawns.

The child (`python -m tools.bench.sarp_recover --data-dir D ...`) is what a cold
restart of sarp costs: it imports only what opening the index and answering a match
need (not the bench harness, not the bulk builder), opens the backend, loads the
snapshot, re-routes what changed after it, answers one match, and prints one JSON
line `{"seconds": S, "rerouted": N, "full_scan": bool}` (S from after its imports).
The parent (tools.bench.sarp_index) times the spawn itself.

The budget: sarp's decoded-segment cache is its own cache, so it is sized from the
run's budget (OWN_CACHE_SHARE of it, at SEGMENT_BYTES per full decoded segment), and
so are its block map and its segments with delta records (BLOCK_MAP_SHARE,
DELTA_SHARE: issue 24); the engine gets the rest as its `cache_bytes`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from sarpd.config import IndexConfig
from sarpd.core import SarpIndex, open_backend
from sarpd.core import native as native_paths
from sarpd.core.native import Kernels
from sarpd.model import Match, SeqSpec

OWN_CACHE_SHARE = 0.35  # of the budget, for the decoded-segment cache; the engine gets the rest
BLOCK_MAP_SHARE = 0.1  # ... for the block map (`[index] block_map_bytes`)
DELTA_SHARE = 0.05  # ... for the segments with delta records (`[index] delta_bytes`)
ARRAY_HEADER = sys.getsizeof(np.zeros(0))  # a numpy array's header
# one full decoded segment: the object, its ids (64 x 16 B) and metas (64 x 8 B)
SEGMENT_BYTES = 200 + 2 * ARRAY_HEADER + 64 * 24


def split_budget(cache_bytes: int) -> tuple[int, int]:
    """(the engine's budget: its cache_bytes, decoded segments sarp may keep) for a
    budget."""
    own = int(cache_bytes * OWN_CACHE_SHARE)
    rest = cache_bytes - own - int(cache_bytes * BLOCK_MAP_SHARE) - int(cache_bytes * DELTA_SHARE)
    return rest, own // SEGMENT_BYTES


def within_budget(config: IndexConfig, cache_bytes: int) -> IndexConfig:
    """`config` with its block map and delta memory sized from the run's budget."""
    return replace(config, block_map_bytes=int(cache_bytes * BLOCK_MAP_SHARE),
                   delta_bytes=int(cache_bytes * DELTA_SHARE))


def open_index(data_dir: Path, backend: str, cache_bytes: int, config: IndexConfig,
               sync: bool, direct_io: bool, kernels: Kernels | None = None) -> SarpIndex:
    """sarp on `data_dir/backend` within `cache_bytes` (split_budget), not recovered;
    `kernels`: the index's (sarp-py: `native.pick(reference=True)`)."""
    engine, segments = split_budget(cache_bytes)
    be = open_backend(backend, data_dir / backend, cache_bytes=engine, direct_io=direct_io)
    ix = SarpIndex(be, within_budget(config, cache_bytes), data_dir / "snapshots", sync=sync,
                   kernels=kernels)
    ix.store.cache_segments = segments
    return ix


def recover_once(data_dir: Path, backend: str, cache_bytes: int, block_locators: bool,
                 direct_io: bool, kernels: Kernels | None = None
                 ) -> tuple[SarpIndex, dict[str, float | int | bool]]:
    """Open, recover, answer one match: (the open index, seconds from the call to the
    answer and what recovery did). The caller closes the index after reporting."""
    t0 = time.perf_counter()
    ix = open_index(data_dir, backend, cache_bytes, IndexConfig(block_locators=block_locators),
                    False, direct_io, kernels)
    rep = ix.recover()
    probe = np.zeros((4, 2), dtype=np.uint64)
    probe[:, 0] = np.arange(1, 5, dtype=np.uint64)
    ix.match_many([Match(0, SeqSpec("", hashes=probe))])
    seconds = time.perf_counter() - t0
    return ix, {"seconds": seconds, "rerouted": rep.segments_rerouted, "full_scan": rep.full_scan}


def main() -> None:
    """The child: one timed recovery, one JSON line on stdout."""
    p = argparse.ArgumentParser(description="One timed cold recovery of sarp (bench child).")
    p.add_argument("--data-dir", type=Path, required=True)
    p.add_argument("--backend", default="rocksdb")
    p.add_argument("--cache-bytes", type=int, default=8 << 20)
    p.add_argument("--no-block-locators", action="store_true")
    p.add_argument("--direct-io", action="store_true")
    p.add_argument("--references", action="store_true",
                   help="Every native path replaced by its reference (sarp-py).")
    a = p.parse_args()
    ix, out = recover_once(a.data_dir, a.backend, a.cache_bytes, not a.no_block_locators,
                           a.direct_io, native_paths.pick(reference=a.references))
    print(json.dumps(out), flush=True)  # the parent's clock stops at this line
    ix.close()


if __name__ == "__main__":
    main()
