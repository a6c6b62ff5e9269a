"""The fleet bench's `--bridge` transport (tools/bench/fleet_bridge.py): a batch as the
EventBatch vLLM would publish. (Through real bridges into a real sarpd, answer by
answer against the model: tests/bench/test_fleet_sarp.py, `bridge`.)"""

from __future__ import annotations

import numpy as np

from sarpd.events.schema import decode_batch
from tests.bench.fleet_workload import small_timeline
from tools.bench.fleet_bridge import block_tokens, payload
from tools.bench.fleet_model import Batch, Stored


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
