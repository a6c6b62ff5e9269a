"""The batcher's queue (sans-I/O): the requests waiting for the worker, and which of
them the next batch takes.

Two lanes, each in arrival order:

    read lane   a read (`match`, `ping`, `stats`...; `service.kind_of`) of a connection
                with nothing in the main lane
    main lane   everything else: writes, barriers (`snapshot`, `check`, `dump`), and a
                read queued behind its own connection's earlier requests

A batch comes from one lane. The read lane goes next when it holds requests and the
batch before was not its own, or when the main lane has nothing to give; so a read
waits behind at most one batch of writes, and a stream of reads never starves the
writes. From the main lane a batch takes requests in order, up to `batch_max` of
them and up to `batch_max_blocks` blocks of writes (at least one request: a larger
write goes alone; a `clear`, a scan of the whole namespace, counts as the limit),
and stops before a request whose connection still has reads in the read lane (they
go first). So a batch's writes stay short, and a query is not held for the tens of
milliseconds a batch of a fleet's events took before (issue 26).

A connection's requests still take effect, and are answered, in the order it sent
them: a read moves ahead only of other connections' requests, which nothing orders
against it (answers leave in batch order, after the group commit's sync of every
write before them: `sarpd.daemon.server`).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Hashable
from typing import Generic, TypeVar

from sarpd.model import Clear, Insert, Remove, Request

__all__ = ["BatchQueue", "write_blocks"]

C = TypeVar("C", bound=Hashable)  # a connection


Item = tuple[C, Request, int, float]  # (connection, request, its bytes, received at)


def write_blocks(req: Request, block_tokens: int, limit: int) -> int:
    """The blocks a write names (0 for anything else); a `clear`: `limit`."""
    if isinstance(req, Insert):
        return req.seq.blocks(block_tokens)
    if isinstance(req, Remove):
        named = req.seq.blocks(block_tokens) if req.seq is not None else 0
        return named + (0 if req.ids is None else len(req.ids))
    if isinstance(req, Clear):
        return limit
    return 0


class BatchQueue(Generic[C]):
    """The queued requests of every connection (`Item`s)."""

    def __init__(self, max_blocks: int, block_tokens: int) -> None:
        self.max_blocks = max_blocks
        self.block_tokens = block_tokens
        self.reads: deque[Item[C]] = deque()
        self.main: deque[Item[C]] = deque()
        self.nbytes = 0  # decoded array bytes of the queued requests
        self._in_main: Counter[C] = Counter()
        self._in_reads: Counter[C] = Counter()
        self._reads_last = False  # the last batch came from the read lane

    def __len__(self) -> int:
        return len(self.reads) + len(self.main)

    def push(self, item: Item[C], read: bool) -> None:
        """Queue `item`; `read`: its request is a read (`kind_of(req) == "read"`)."""
        conn = item[0]
        if read and not self._in_main[conn]:
            self.reads.append(item)
            self._in_reads[conn] += 1
        else:
            self.main.append(item)
            self._in_main[conn] += 1
        self.nbytes += item[2]

    def take(self, limit: int) -> list[Item[C]]:
        """The next batch (module docstring): at most `limit` requests, never empty
        while anything is queued."""
        batch = [] if self.reads and not self._reads_last else self._take_main(limit)
        if not batch:
            batch = self._take_reads(limit)
        self.nbytes -= sum(size for _, _, size, _ in batch)
        return batch

    def _take_reads(self, limit: int) -> list[Item[C]]:
        out = [self.reads.popleft() for _ in range(min(limit, len(self.reads)))]
        for conn, *_ in out:
            _drop(self._in_reads, conn)
        self._reads_last = True
        return out

    def _take_main(self, limit: int) -> list[Item[C]]:
        out: list[Item[C]] = []
        blocks = 0
        while self.main and len(out) < limit:
            conn, req, *_ = self.main[0]
            if self._in_reads[conn]:
                break  # its earlier reads go first
            n = write_blocks(req, self.block_tokens, self.max_blocks)
            if out and blocks + n > self.max_blocks:
                break
            blocks += n
            out.append(self.main.popleft())
            _drop(self._in_main, conn)
        if out:
            self._reads_last = False
        return out


def _drop(counts: Counter[C], conn: C) -> None:
    counts[conn] -= 1
    if counts[conn] <= 0:
        del counts[conn]
