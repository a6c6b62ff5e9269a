"""Checkpoints (sarpd/cluster/checkpoints.py): object names sort by sequence and belong
to one shard; on a real NATS server, publishing keeps the newest and trims the log,
`newest` says which is newest and when it was published, and `fetch_newest` unpacks
it. A new replica's bootstrap from one runs in tests/daemon/test_cluster.py."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from nats.js import JetStreamContext

from sarpd.cluster import checkpoints, log
from sarpd.cluster.checkpoints import object_name, seq_of
from sarpd.model import CheckpointResult
from tests.cluster_helpers import in_cluster
from tools.cluster.nats_local import local_cluster


def test_names_sort_by_sequence_and_name_their_shard() -> None:
    names = [object_name("s1", n) for n in (10, 9, 100, 2**63)]
    assert [seq_of(n, "s1") for n in sorted(names)] == [9, 10, 100, 2**63]
    assert seq_of(object_name("s1", 5), "s10") is None  # another shard's
    assert seq_of(object_name("a.b", 7), "a.b") == 7
    for bad in ("s1.12", "s1.x" + "0" * 19, "s1", ""):
        assert seq_of(bad, "s1") is None


def test_publish_keeps_the_newest_trims_the_log_and_newest_says_which(tmp_path: Path) -> None:
    async def body(js: JetStreamContext) -> None:
        assert await checkpoints.newest(js, "c0") is None  # no store yet
        await log.ensure_stream(js, "c0", 1)
        for i in range(12):
            await log.publish(js, "c0", b"e%d" % i, f"m{i}")

        def taker(seq: int) -> Callable[[Path], Awaitable[CheckpointResult]]:
            async def take(dest: Path) -> CheckpointResult:
                dest.mkdir(parents=True)
                (dest / "file").write_text(f"at {seq}")
                return CheckpointResult(seq, 0, 0.0)
            return take

        before = time.time()
        for seq in (4, 8, 11):
            assert await checkpoints.publish(js, "c0", 1, taker(seq), 2, None) == seq
        newest = await checkpoints.newest(js, "c0")
        assert newest is not None and newest.seq == 11
        assert newest.time is not None and before - 1 <= newest.time <= time.time() + 1
        assert await checkpoints.newest(js, "other") is None  # another shard's
        obs = await checkpoints.store(js, 1)
        assert await checkpoints.listed(obs, "c0") == [8, 11]  # keep 2
        info = await js.stream_info(log.stream_name("c0"))
        assert info.state.first_seq == 9  # below the older kept one + 1
        # a live replica at 9 holds the trim at 10 (the kept 11 alone would allow 12)
        assert await checkpoints.publish(js, "c0", 1, taker(12), 2, live_floor=9) == 12
        assert (await js.stream_info(log.stream_name("c0"))).state.first_seq == 10
        assert await checkpoints.fetch_newest(js, "c0", tmp_path / "boot") == 12
        assert (tmp_path / "boot" / "file").read_text() == "at 12"

    with local_cluster(tmp_path / "nats", 1) as cluster:
        in_cluster(cluster, body, js_timeout_s=5.0)
