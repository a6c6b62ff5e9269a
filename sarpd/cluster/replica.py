"""A replica of one shard: a deterministic state machine over the shard's log.

The replica reads its shard's stream in order (`sarpd.cluster.log.ShardReader`, from
the index's `applied_seq + 1`: the backend, not the consumer, says what is applied)
and applies each run of entries it pulled as ONE `write_many` of their ops with the
run's last sequence as `applied_seq`, so the data and the sequence are durable
together (sarpd/core/writer.py). Any two replicas that applied the same prefix of the
log answer alike (block counts, metas, holders); their internal segment ids may
differ, since they may cut the log into write batches differently.

Writes taken by this replica (`write`) go to the log first: the entry is published
with a msg id (JetStream drops a resend inside its duplicate window) and the answer
waits until the replica applied that sequence, so it carries the result the entry
had on every replica and its `seq`. `wait_applied(seq)` is what a match carrying
`after_seq` waits on.

What can go wrong, and what happens:
- a storage failure in `write_many`: the index reloads itself; the same run is
  applied again after RETRY_PAUSE_S (nothing was acknowledged to the log);
- an entry that does not decode (a newer entry format): its answer is the error,
  and the replica goes on (every replica decodes it alike);
- the log trimmed above where the replica stands (`LogGap` when the reader is
  reopened there): the replica stops applying and says so (`failed`, `halted`); it
  needs a newer checkpoint (the daemon starts again from one:
  sarpd.daemon.cluster_mode). A sequence missing from a delivery (a node went down
  with entries in flight) is not that: the reader is reopened at `applied_seq + 1`;
- NATS unreachable: `ShardReader` retries for `log.RETRY_S`, then the replica
  reopens its reader from `applied_seq + 1` and tries again.

How far behind the log it is (the metrics, `stats`): `lag_seqs`, the entries the log
holds that the replica has not applied (JetStream's count past the newest entry
pulled, plus those pulled and not applied), and `lag_s(now)`, how long ago the log
stored the oldest entry not applied (0 when caught up; between two runs it is bounded
by the newest applied entry's store time). `entries_applied` counts entries applied
since start (its rate is the apply rate), and `observe`, when given, gets each run's
apply delays: per entry, the time from the log storing it to this replica applying it.
Store times are the NATS server's clock, so across hosts they include clock offset.

What it applied (its progress report, `stats`): `applied_writes`, the inserts,
removes and clears applied from the log since start, each counted once, when applied
(a write this replica took is one of them, not one more); `size`, the index's blocks
and segments as of `applied_seq`, read in the same worker call as the write batch.

Rule heads (issue 27; `owner`, sarpd.cluster.owner): the applier fences each write
that carries a `route` against this shard's own splits as of its place in the log
(`moved`, nothing written), feeds the learner the inserts this shard took whole, and
publishes its proposals as split entries in this shard's log (`_propose`). A split
entry cuts its run: the writes before it are applied, then the split
(`_apply_split`: the kept branches and holders read from the index, the head written
to every other shard's log, the split recorded in the map's bucket, or the recorded
one taken), then the writes after it. A restart takes this shard's recorded splits
up to its applied sequence from the bucket (`load_splits`).

All of it runs on the event loop; the index is touched only through `run`, the
server's one worker thread (`Server.run_exclusive`), so the applier never overlaps a
batch of the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from nats.js import JetStreamContext

from sarpd.cluster import entry, log, mapkv
from sarpd.cluster.entry import SplitHead
from sarpd.cluster.learner import Proposal
from sarpd.cluster.owner import Owner
from sarpd.cluster.shardmap import ShardMap, Split, key_of
from sarpd.cluster.splits import Prepared, prepare_split
from sarpd.core import SarpIndex, salt_ids
from sarpd.errors import Moved, SarpError, StorageError, Unavailable
from sarpd.model import (
    Clear,
    Insert,
    InsertResult,
    Remove,
    RemoveResult,
)
from sarpd.protocol.requests import Limits

logger = logging.getLogger("sarpd.cluster.replica")

T = TypeVar("T")
Runner = Callable[[Callable[[], T]], Awaitable[T]]
Write = Insert | Remove | Clear
Result = InsertResult | RemoveResult | SarpError

RECENT_RESULTS = 65_536  # answers kept by sequence, for writers that wait on them
RETRY_PAUSE_S = 0.5
FETCH_TIMEOUT_S = 0.05  # how long one pull waits for entries (latency of an idle log)
# what the applier waits out (reopening its reader) rather than stopping for
_PASSING: tuple[type[Exception], ...] = (SarpError, OSError, *log.TRANSIENT)


@dataclass(frozen=True, slots=True)
class Applied:
    """A write's answer from the log: its result and the sequence it has there."""

    result: Result
    seq: int
    duplicate: bool  # a resend: the log had it already (applied once)


@dataclass(frozen=True, slots=True)
class Size:
    """The index's present blocks and its segments, as of a replica's applied seq."""

    blocks: int
    segments: int


WRITE_KINDS = ("inserts", "removes", "clears")  # the keys of `Replica.applied_writes`


def write_kind(op: Write) -> str:
    """The `applied_writes` key counting `op`."""
    if isinstance(op, Insert):
        return "inserts"
    return "removes" if isinstance(op, Remove) else "clears"


class Replica:
    def __init__(self, index: SarpIndex, js: JetStreamContext, shard: str,
                 replica_id: str, limits: Limits, run: Runner[object],
                 publish_retry_s: float = log.RETRY_S,
                 observe: Callable[[Sequence[float]], None] | None = None,
                 smap: ShardMap | None = None) -> None:
        self.index, self.js, self.shard, self.replica_id = index, js, shard, replica_id
        self.limits = limits  # an entry's checks, and block_tokens
        self.publish_retry_s = publish_retry_s
        self._run = run
        self._applied = index.applied_seq  # mirrors the index's, advanced by the applier
        self._recent: OrderedDict[int, Result] = OrderedDict()
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self._reader: log.ShardReader | None = None
        self._observe = observe
        self.entries_applied = 0  # since start
        self.applied_writes = dict.fromkeys(WRITE_KINDS, 0)  # since start, by kind
        counters = index.counters
        self.size = Size(counters.blocks, counters.segments)  # as of applied_seq
        self._behind_since: float | None = None  # store time bounding the oldest unapplied
        self.failed = ""  # why the applier stopped for good (a gap in the log)
        # rule heads: this shard's splits, the fence and the learner (None: rule block0)
        self.owner = None if smap is None or smap.version == 1 else Owner(
            smap, shard, index.seq_ids)
        self._tasks: set[asyncio.Task[None]] = set()  # split proposals being published
        self.halted = asyncio.Event()  # set with `failed` (what a re-bootstrap waits on)

    @property
    def applied_seq(self) -> int:
        return self._applied

    @property
    def lag_seqs(self) -> int:
        """Entries the log holds that this replica has not applied."""
        reader = self._reader
        if reader is None:
            return 0
        return max(0, reader.next_seq - 1 - self._applied) + reader.pending

    def lag_s(self, now: float) -> float:
        """Seconds since the log stored the oldest entry not applied (epoch `now`)."""
        since = self._behind_since
        if since is None or self.lag_seqs == 0:
            return 0.0
        return max(0.0, now - since)

    async def start(self) -> None:
        """Open the reader at `applied_seq + 1` and apply in the background."""
        self._reader = await log.ShardReader.open(self.js, self.shard, self.replica_id,
                                                  self._applied + 1)
        self._task = asyncio.create_task(self._apply_loop(self._reader))

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # -- writes --------------------------------------------------------------------
    async def write(self, req: Write, msg_id: str | None = None,
                    timeout_s: float = 30.0) -> Applied:
        """Publish `req` to the shard's log and answer once this replica applied it.
        `msg_id`: the sender's id of this write (a resend with the same id inside the
        duplicate window is applied once); a fresh one when None."""
        raw = entry.encode(req, self.limits)  # BadRequest for a write no replica takes
        seq, duplicate = await log.publish(self.js, self.shard, raw,
                                           msg_id or uuid.uuid4().hex,
                                           retry_s=self.publish_retry_s)
        if duplicate:
            logger.info("shard %s: %s is a resend of seq %d", self.shard, msg_id, seq)
        await self.wait_applied(seq, timeout_s)
        result = self._recent.get(seq)
        if result is None:  # a resend of a write applied long ago: it adds nothing now
            result = _nothing_new(req, self.limits.block_tokens)
        return Applied(result, seq, duplicate)

    async def wait_applied(self, seq: int, timeout_s: float) -> None:
        """Return once `applied_seq >= seq`; `Unavailable` after `timeout_s`."""
        if self._applied >= seq:
            return
        try:
            async with asyncio.timeout(timeout_s), self._changed:
                await self._changed.wait_for(lambda: self._applied >= seq or bool(self.failed))
        except TimeoutError:
            raise Unavailable(f"shard {self.shard}: replica {self.replica_id} applied "
                              f"seq {self._applied}, not {seq}, within {timeout_s:g} s") from None
        if self._applied < seq:
            raise Unavailable(f"shard {self.shard}: replica {self.replica_id} stopped "
                              f"applying: {self.failed}")

    # -- the applier -----------------------------------------------------------------
    async def _apply_loop(self, reader: log.ShardReader) -> None:
        while True:
            try:
                run = await reader.fetch(timeout_s=FETCH_TIMEOUT_S)
            except _PASSING as exc:  # a LogGap too: a delivery cut by a node going down
                # skips entries the log still holds; reopening at applied_seq + 1 tells
                # (the reopen fails with LogGap only when the log was trimmed there)
                logger.warning("shard %s: reading the log failed (%s); reopening at %d",
                               self.shard, exc, self._applied + 1)
                again = await self._reopen(reader)
                if again is None:
                    return
                reader = self._reader = again
                continue
            if run:
                await self._apply(reader, run)

    async def _reopen(self, reader: log.ShardReader) -> log.ShardReader | None:
        """A new reader at `applied_seq + 1` (None: the log has a gap there)."""
        with contextlib.suppress(Exception):
            await reader.close()
        while True:
            await asyncio.sleep(RETRY_PAUSE_S)
            try:
                return await log.ShardReader.open(self.js, self.shard, self.replica_id,
                                                  self._applied + 1)
            except log.LogGap as exc:
                await self._fail(str(exc))
                return None
            except _PASSING as exc:
                logger.warning("shard %s: reopening the reader failed: %s", self.shard, exc)

    async def _apply(self, reader: log.ShardReader, run: list[tuple[int, bytes]]) -> None:
        """Apply a run of entries: its writes as one write batch, cut at each split
        entry (applied alone, in order: the writes after it are fenced by it)."""
        decoded: list[tuple[int, Write | SplitHead | SarpError]] = []
        for seq, raw in run:
            try:
                decoded.append((seq, entry.decode(raw, self.limits)))
            except SarpError as exc:
                logger.error("shard %s: entry %d does not decode: %s", self.shard, seq, exc)
                decoded.append((seq, exc))
        piece: list[tuple[int, Write | SarpError]] = []
        for seq, op in decoded:
            if isinstance(op, SplitHead):
                if piece:
                    await self._apply_writes(reader, piece)
                    piece = []
                await self._apply_split(reader, seq, op)
            else:
                piece.append((seq, op))
        if piece:
            await self._apply_writes(reader, piece)

    async def _apply_writes(self, reader: log.ShardReader,
                            run: list[tuple[int, Write | SarpError]]) -> None:
        seqs = [seq for seq, _ in run]
        stored = [reader.stored_at(seq) for seq in seqs]
        self._behind_since = stored[0]
        owner = self.owner

        def write() -> tuple[list[Result], Size, list[Proposal]]:  # the worker thread
            slots: list[Result | None] = []  # None: the write batch answers it
            ops: list[Write] = []
            for _, op in run:
                moved = None if owner is None or isinstance(op, SarpError | Clear) \
                    else owner.fence(op)
                slots.append(op if isinstance(op, SarpError) else moved)
                if not isinstance(op, SarpError) and moved is None:
                    ops.append(op)
            results = iter(self.index.write_many(ops, applied_seq=seqs[-1]))
            answers = [next(results) if a is None else a for a in slots]
            proposals = [] if owner is None else [
                p for (_, op), res in zip(run, answers, strict=True)
                if isinstance(op, Insert) and isinstance(res, InsertResult)
                and (p := owner.observe(op, res)) is not None]
            counters = self.index.counters
            return answers, Size(counters.blocks, counters.segments), proposals

        while True:
            try:
                done = await self._run(write)
                break
            except StorageError as exc:  # the index reloaded itself: apply the run again
                logger.error("shard %s: applying seqs %d-%d failed: %s; retrying",
                             self.shard, seqs[0], seqs[-1], exc)
                await asyncio.sleep(RETRY_PAUSE_S)
        assert isinstance(done, tuple)
        answers, size, proposals = done
        for seq, result in zip(seqs, answers, strict=True):
            self._remember(seq, result)
        now = time.time()
        await self._advance(reader, seqs[-1], size)
        self.entries_applied += len(seqs)
        for (_, op), result in zip(run, answers, strict=True):
            if not isinstance(op, SarpError) and not isinstance(result, Moved):
                self.applied_writes[write_kind(op)] += 1
        self._behind_since = stored[-1]  # entry seqs[-1] + 1 was stored no earlier
        if self._observe is not None:
            self._observe([now - t for t in stored if t is not None])
        for prop in proposals:
            self._spawn(self._propose(prop))

    async def _advance(self, reader: log.ShardReader, seq: int, size: Size) -> None:
        await reader.ack(seq)
        async with self._changed:
            self._applied, self.size = seq, size
            self._changed.notify_all()

    # -- splits (rule heads: sarpd.cluster.owner) --------------------------------------
    async def load_splits(self) -> None:
        """This shard's splits recorded in the map at or below the applied sequence
        (those above it are applied again from the log)."""
        owner = self.owner
        smap = await mapkv.read_shard_map(self.js)
        if owner is None or smap is None:
            return
        for split in smap.splits.values():
            if split.owner == owner.me and split.at <= self._applied:
                owner.adopt(split)

    async def _propose(self, prop: Proposal) -> None:
        """A split the learner proposes, as an entry in this shard's log (its msg id
        names the head: replicas proposing it alike add one entry)."""
        ext = salt_ids(prop.ns, prop.head)
        last = key_of(prop.head[-1])
        try:
            await log.publish(self.js, self.shard, entry.encode_split(prop.ns, ext),
                              f"split.{last:032x}", retry_s=self.publish_retry_s)
        except Exception as exc:  # a later proposal tries again
            logger.warning("shard %s: proposing a split failed: %s", self.shard, exc)
            assert self.owner is not None
            self.owner.learner.declined(last)

    async def _apply_split(self, reader: log.ShardReader, seq: int, op: SplitHead) -> None:
        """A split entry: the head's kept branches and holders read from the index as
        of this point of the log, its blocks written to every other shard's log, the
        split recorded in the map; only then is the entry applied (a replica stopped
        half-way does it again from the log). Retried until it is done."""
        while True:  # every step is idempotent (msg ids, KV create): try it again
            try:
                split = await self._make_split(op, seq)
                break
            except Exception as exc:  # the entry cannot be skipped: never the applier's end
                logger.warning("shard %s: applying split entry %d failed (%r); retrying",
                               self.shard, seq, exc)
                await asyncio.sleep(RETRY_PAUSE_S)
        owner = self.owner
        if split is not None and owner is not None:
            owner.adopt(split)
            logger.info("shard %s: split a head of %d blocks at seq %d, %d branches kept",
                        self.shard, split.depth, seq, len(split.kept))

        def mark() -> Size:
            self.index.write_many([], applied_seq=seq)
            counters = self.index.counters
            return Size(counters.blocks, counters.segments)

        size = await self._run(mark)
        assert isinstance(size, Size)
        self._remember(seq, RemoveResult(0))
        await self._advance(reader, seq, size)
        self.entries_applied += 1

    async def _make_split(self, op: SplitHead, seq: int) -> Split | None:
        owner = self.owner
        if owner is None:
            logger.error("shard %s: split entry %d in a cluster of rule block0: ignored",
                         self.shard, seq)
            return None
        head = salt_ids(op.ns, op.ids)
        last = key_of(head[-1])
        if owner.has(last):
            return None
        names = owner.own.names
        recorded = await mapkv.recorded_split(self.js, last, len(names))
        if recorded is not None:
            return recorded
        prepared = await self._run(lambda: prepare_split(self.index, op.ns, head, owner.me))
        if prepared is None:  # a hole in the head: not split now
            owner.learner.declined(last)
            return None
        assert isinstance(prepared, Prepared)
        seeds: dict[str, int] = {}
        for name in names:
            if name == self.shard:
                continue
            for i, write in enumerate(prepared.seed):
                seeds[name], _ = await log.publish(
                    self.js, name, entry.encode(write, self.limits),
                    f"seed.{last:032x}.{i}", retry_s=self.publish_retry_s)
        split = replace(prepared.split, seeds=seeds, at=seq)
        return await mapkv.record_split(self.js, split, len(names))

    def _spawn(self, coro: Coroutine[object, object, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _remember(self, seq: int, result: Result) -> None:
        self._recent[seq] = result
        while len(self._recent) > RECENT_RESULTS:
            self._recent.popitem(last=False)

    async def _fail(self, why: str) -> None:
        logger.error("shard %s: replica %s stops applying: %s", self.shard,
                     self.replica_id, why)
        async with self._changed:
            self.failed = why
            self._changed.notify_all()
        self.halted.set()


def _nothing_new(req: Write, block_tokens: int) -> Result:
    """The answer of a write applied before whose own answer is no longer kept (a
    resend after RECENT_RESULTS later writes): an insert's blocks are all there, a
    removal removes nothing more."""
    if isinstance(req, Insert):
        seq = req.seq
        if seq.hashes is not None:
            n = len(seq.hashes)
        else:
            n = 0 if seq.tokens is None else len(seq.tokens) // block_tokens
        return InsertResult(n, 0, n)
    return RemoveResult(0)
