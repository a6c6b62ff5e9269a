"""`sarpctl cluster reshard` (sarpd/cluster/reshard.py): a block0 cluster moved to the
heads rule offline, from its checkpoints. The map it makes keeps every stored sequence
on its shard (property, any shard count); on a real cluster (1 NATS node, 3 shards of
one replica: 3 does not divide 4096) it refuses while a shard's log is past its
newest checkpoint, then moves the cluster: after the replicas restart every stored
sequence answers as a single index does, and new traffic on a hot prompt is split
and spread, still exact."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sarpd.client import SyncClient
from sarpd.client.fields import tokens_bin
from sarpd.cluster.reshard import heads_map
from sarpd.core.shards import shard_of
from sarpd.errors import ConfigError
from sarpd.protocol.requests import Limits
from tests.client.test_cluster_heads import answer, expected
from tools.bench.shard_sim import apply, single_index
from tools.cluster.local import local_sarp_cluster

BT = 16
REPO = Path(__file__).resolve().parents[2]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 12), lows=st.lists(st.integers(0, 2**64 - 1), max_size=40),
       probe=st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=20))
def test_the_map_keeps_every_stored_sequence_on_its_block0_shard(
        n: int, lows: list[int], probe: list[int]) -> None:
    names = tuple(f"s{i}" for i in range(n))
    ids = np.array([[lo, 7] for lo in lows], dtype=np.uint64).reshape(-1, 2)
    firsts = {names[i]: ids[ids[:, 0] % n == i] for i in range(n)}
    smap = heads_map(names, firsts)
    assert smap.version == 2 and smap.buckets % n == 0 and smap.buckets <= 4096
    for row in ids:  # stored: found on its block0 shard
        assert smap.plan(row.reshape(1, 2)).target == shard_of(row.reshape(1, 2), n)
    for lo in probe:  # not stored: its bucket is placed on its block0 shard, or unplaced
        row = np.array([[lo, 1]], dtype=np.uint64)
        got = smap.plan(row)
        assert got.target in (None, shard_of(row, n))


def test_data_on_the_wrong_shard_is_refused() -> None:
    ids = np.array([[5, 0]], dtype=np.uint64)  # 5 % 2 == 1, stored on s0
    with pytest.raises(ConfigError, match="s0 holds a chain whose block 0 is shard s1's"):
        heads_map(("s0", "s1"), {"s0": ids})


def ctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "sarpd.ctl.main", *args], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=REPO,
                          timeout=120)


def traffic(seed: int, n: int, ns: str) -> list[tuple[str, dict[str, Any]]]:
    """Sessions on one hot prompt, some past a window (64 blocks), each inserted and
    matched."""
    rng = random.Random(seed)
    prompt = [rng.randrange(2**32) for _ in range(5 * BT)]
    out = []
    for i in range(n):
        tail = [rng.randrange(2**32) for _ in range(BT * rng.choice((2, 3, 70)))]
        seq = {"ns": ns, "tokens": tokens_bin(prompt + tail)}
        out += [("insert", {**seq, "meta": i + 1}), ("match", seq)]
    return out


def test_a_block0_cluster_moves_to_heads_and_stays_exact(tmp_path: Path) -> None:
    conf = tmp_path / "replica.toml"
    conf.write_text("[cluster]\ncheckpoint_interval_s = 0\n")  # none yet
    one, limits = single_index(BT), Limits(block_tokens=BT)
    with local_sarp_cluster(tmp_path / "cl", nats_nodes=1, replicas=1, shards=3,
                            config=conf) as lc:
        assert lc.nats is not None
        urls = ",".join(lc.nats.urls)
        with SyncClient.cluster(urls) as c:
            for op, fields in traffic(1, 40, "a") + traffic(2, 30, "b"):
                assert answer(c, op, fields) == expected(apply(one, op, fields, limits, 1))
            assert c.cluster_status()["rule"] == "block0"
        early = ctl("--cluster", urls, "cluster", "reshard", "--rule", "heads")
        assert early.returncode != 0 and "stop the writes and wait for a checkpoint" in \
            early.stderr, early.stderr
        conf.write_text("[cluster]\ncheckpoint_interval_s = 0.3\n")
        restart_all(lc)
        deadline = time.monotonic() + 60
        while True:  # every shard's log in its newest checkpoint
            with SyncClient.cluster(urls) as c:
                shards = c.cluster_status()["shards"]
            if all(sh["last_seq"] == 0 or (sh["checkpoint"] or {}).get("seq") == sh["last_seq"]
                   for sh in shards):
                break
            assert time.monotonic() < deadline, shards
            time.sleep(0.3)
        done = ctl("--cluster", urls, "cluster", "reshard", "--rule", "heads", "--json")
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["buckets"] == 4095 and report["placed"] == 2  # the 2 hot prompts
        assert sum(sh["chains"] for sh in report["shards"]) == 2
        assert sum(sh["window_starts"] for sh in report["shards"]) > 0  # all linked
        again = ctl("--cluster", urls, "cluster", "reshard", "--rule", "heads")
        assert again.returncode != 0 and "already heads" in again.stderr
        restart_all(lc)  # every replica reads the new map at start
        with SyncClient.cluster(urls) as c:
            assert c.cluster_status()["rule"] == "heads"
            for op, fields in traffic(1, 40, "a") + traffic(2, 30, "b") + traffic(3, 80, "c"):
                assert answer(c, op, fields) == expected(apply(one, op, fields, limits, 1))
            status = c.cluster_status()
            assert status["splits"] >= 1
            assert sum(1 for sh in status["shards"] if sh["blocks"]) >= 2
        status_text = ctl("--cluster", urls, "cluster", "status")
        assert "rule: heads (shard map version 2" in status_text.stdout


def restart_all(lc: Any) -> None:
    for i in range(len(lc.procs)):
        lc.kill(i)
        lc.restart(i)
