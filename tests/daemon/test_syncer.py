"""Group commit (sarpd/daemon/syncer.py): batches written while a sync runs share the
next one; a failed sync fails every batch it was to cover; and through a real daemon
with `--sync always`, pipelining clients' write batches share syncs and every
acknowledged insert is there after a kill -9 (tests/daemon/test_durability.py)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from sarpd.client import Client
from sarpd.daemon.syncer import Syncer
from sarpd.errors import StorageError
from tests.daemon_helpers import Launcher


def test_batches_written_during_a_sync_share_the_next() -> None:
    calls: list[float] = []
    gate = threading.Event()

    def slow_sync() -> None:
        calls.append(time.monotonic())
        gate.wait(5)

    async def main() -> None:
        s = Syncer(slow_sync)
        first = asyncio.create_task(s.durable(s.ticket()))
        await asyncio.sleep(0.05)  # the first sync is running
        later = [asyncio.create_task(s.durable(s.ticket())) for _ in range(5)]
        await asyncio.sleep(0.05)
        assert len(calls) == 1 and not first.done()
        gate.set()
        await asyncio.gather(first, *later)
        assert (s.written, s.syncs, s.synced) == (6, 2, 6)  # five batches, one sync
        await s.durable(3)  # durable already: no sync
        assert s.syncs == 2
        s.close()

    asyncio.run(main())


def test_a_failed_sync_fails_the_batches_it_was_to_cover() -> None:
    def broken() -> None:
        raise StorageError("sync (WAL fsync): I/O error")

    async def main() -> None:
        s = Syncer(broken)
        with pytest.raises(StorageError, match="I/O error"):
            await s.durable(s.ticket())
        assert s.synced == 0
        s.close()

    asyncio.run(main())


def test_pipelining_writers_are_answered_after_syncs_that_cover_them(
        sarpd_factory: Launcher) -> None:
    """Through a real daemon (--sync always): every insert answered and matched, at
    least one sync, never more syncs than batches (how many share one depends on the
    timing: the unit test above pins the sharing)."""
    proc = sarpd_factory()  # --sync always

    async def writer(c: Client, k: int) -> None:
        await asyncio.gather(*(c.insert(hashes=[2**40 + k * 1000 + i, 2**41 + i], meta=k)
                               for i in range(50)))

    async def main() -> dict[str, object]:
        async with await Client.connect(str(proc.socket)) as c:
            await asyncio.gather(*(writer(c, k) for k in range(8)))
            for k in range(8):
                got = await c.match(hashes=[2**40 + k * 1000 + 49, 2**41 + 49])
                assert got["blocks"] == 2
            return await c.stats()

    stats = asyncio.run(main())
    batches, syncs = stats["group_commit_batches"], stats["group_commit_syncs"]
    assert isinstance(batches, int) and isinstance(syncs, int)
    assert 0 < syncs <= batches
