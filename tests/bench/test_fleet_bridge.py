"""The fleet bench's `--bridge` transport (tools/bench/fleet_bridge.py): a small fleet's
batches published in vLLM's schema, applied by a real bridge per engine into a REAL
sarpd; every per-holder answer equals the engines' true runs (shared namespace with
holders, and a namespace per worker without)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sarpd.bridge.events import decode_batch
from tests.bench.fleet_workload import WORKERS, drive, final_check, small_timeline
from tests.daemon_helpers import Launcher
from tools.bench.fleet_bridge import block_tokens, payload
from tools.bench.fleet_indexes import FleetConfig
from tools.bench.fleet_model import Batch, HolderMasks, Query, Stored
from tools.bench.fleet_sarp import SarpDirect

CFG = FleetConfig(WORKERS, WORKERS)


def test_a_batch_is_published_as_vllm_would() -> None:
    timeline = small_timeline()
    batch = next(e for e in timeline.entries if isinstance(e, Batch)
                 and any(isinstance(ev, Stored) and ev.parent is not None for ev in e.events))
    got = decode_batch(payload(batch, 16)).events
    assert len(got) == len(batch.events)
    for ours, theirs in zip(batch.events, got, strict=True):
        assert list(theirs.block_hashes) == [int(h) for h in ours.hashes]
        if isinstance(ours, Stored):
            assert theirs.parent == ours.parent and theirs.num_tokens == 16 * len(ours.hashes)
    # a block's tokens depend on its content hash only
    a, b = block_tokens(np.array([5, 9], np.uint64), 16), block_tokens(np.array([9], np.uint64), 16)
    assert a[16:] == b and a[:16] != b


@pytest.mark.parametrize("per_worker", [False, True], ids=["shared-ns", "ns-per-worker"])
def test_through_the_bridges_every_holder_is_the_model(sarpd_factory: Launcher,
                                                       tmp_path: Path, per_worker: bool) -> None:
    proc = sarpd_factory()
    timeline = small_timeline()
    index = SarpDirect(CFG, per_worker=per_worker, socket=proc.socket, bridge=True)
    index.open(tmp_path)
    try:
        masks, seen = HolderMasks(WORKERS), list[Query]()
        assert drive(index, timeline.entries, masks, seen) > timeline.totals.requests
        final_check(index, masks, seen)
    finally:
        index.close()
