"""Group commit (issue 24): write batches that wait for the fsync share one.

With ``sync = "always"`` the worker writes each batch without syncing
(`SarpIndex.write_many(..., sync=False)`) and goes on to the next batch; the batch's
answers wait in `Syncer.durable` for a sync that began after its write. One sync, on
a thread of its own, makes durable every batch written before it began, so while a
sync runs the next batches are written and then share the following one. A batch's
answers go out only once it is durable, and in batch order (`sarpd.daemon.server`),
so no client sees a write before it is durable on the disk. A failed sync fails
every batch it was to cover (their writes answer ``unavailable``) and leaves the index
to reload from the disk before its next write (`SarpIndex.sync`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

__all__ = ["Syncer"]


class Syncer:
    """Hands out tickets for written batches and makes them durable in groups."""

    def __init__(self, sync: Callable[[], None]) -> None:
        self._sync = sync
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="sarpd-sync")
        self._lock = asyncio.Lock()
        self.written = 0  # batches written (tickets handed out)
        self.synced = 0  # every ticket up to this one is durable
        self.syncs = 0  # syncs run (each covers one or more batches)

    def ticket(self) -> int:
        """A ticket for a batch just written (call it once the write returned)."""
        self.written += 1
        return self.written

    async def durable(self, ticket: int) -> None:
        """Return once the batch of `ticket` is durable; raise what the sync raised."""
        async with self._lock:  # one sync at a time; a waiter it covered returns at once
            if self.synced >= ticket:
                return
            target = self.written  # every batch written before the sync begins
            await asyncio.get_running_loop().run_in_executor(self._executor, self._sync)
            self.syncs += 1
            self.synced = target

    def close(self) -> None:
        self._executor.shutdown(wait=True)
