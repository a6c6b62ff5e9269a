"""The fleet's peers against the model on a small fleet: Dynamo's radix tree (when the
ai-dynamo-runtime wheel is installed; skipped otherwise) and the llm-d-style index in
a real redis-server (when redis-server is installed)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.bench.fleet_workload import WORKERS, drive, final_check, small_timeline
from tools.bench.fleet_indexes import (
    DynamoRadix,
    FleetConfig,
    RedisLlmd,
    dynamo_available,
    dynamo_json,
    pod_runs,
    resp_fixed,
)
from tools.bench.fleet_model import HolderMasks, Query, Removed, Stored, Timeline

CFG = FleetConfig(WORKERS, WORKERS)
needs_dynamo = pytest.mark.skipif(not dynamo_available(), reason="ai-dynamo-runtime not installed")
needs_redis = pytest.mark.skipif(shutil.which("redis-server") is None and
                                 not Path("/usr/bin/redis-server").exists(),
                                 reason="redis-server not installed")


@pytest.fixture(scope="module")
def timeline() -> Timeline:
    return small_timeline()


@needs_dynamo
def test_dynamo_radix_answers_as_the_model(tmp_path: Path, timeline: Timeline) -> None:
    index = DynamoRadix(CFG)
    index.open(tmp_path)
    masks, seen = HolderMasks(WORKERS), list[Query]()
    drive(index, timeline.entries, masks, seen)
    final_check(index, masks, seen)
    index.close()


def test_dynamo_events_are_its_json() -> None:
    h = np.array([5, 2**64 - 1], dtype=np.uint64)
    stored = json.loads(dynamo_json(3, Stored(h, 9, h + np.uint64(1))))
    assert stored == {"event_id": 3, "data": {"stored": {"parent_hash": 9, "blocks": [
        {"block_hash": 5, "tokens_hash": 6}, {"block_hash": 2**64 - 1, "tokens_hash": 0}]}}}
    assert json.loads(dynamo_json(4, Stored(h[:1], None, h[:1])))["data"]["stored"][
        "parent_hash"] is None
    assert json.loads(dynamo_json(5, Removed(h))) == {
        "event_id": 5, "data": {"removed": {"block_hashes": [5, 2**64 - 1]}}}


@needs_redis
def test_redis_llmd_answers_as_the_model(tmp_path: Path, timeline: Timeline) -> None:
    index = RedisLlmd(CFG)
    index.open(tmp_path)
    try:
        masks, seen = HolderMasks(WORKERS), list[Query]()
        drive(index, timeline.entries, masks, seen)
        final_check(index, masks, seen)
    finally:
        index.close()


def test_resp_commands_and_pod_runs() -> None:
    keys = np.array([1, 258], dtype=np.uint64)
    assert resp_fixed(b"<", keys, b">") == (b"<" + (1).to_bytes(8, "big") + b"><"
                                            + (258).to_bytes(8, "big") + b">")
    assert pod_runs([[b"1", b"2"], [b"2"], [b"1", b"2"], []]) == {1: 1, 2: 3}
    assert pod_runs([[b"3"], [b"1"], [b"1"]]) == {3: 1}  # no pod holds blocks 0-1
    assert pod_runs([[], [b"1"]]) == {}
