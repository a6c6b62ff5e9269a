"""A shard's replicated log on NATS JetStream (asyncio; issue 15).

One stream per shard: `SARP_<shard>` on the subject `sarp.log.<shard>`, file storage,
`num_replicas` copies (3 on a 3-node cluster), deduplication by `Nats-Msg-Id` over
`DUPLICATE_WINDOW_S`. The servers must run with `sync_interval: always`
(`tools.cluster.nats_local` does): a PubAck then means a quorum has the entry on disk.

- `ensure_stream`: create the stream, or check that an existing one has exactly these
  settings (anything else is a `LogConfigError` naming the setting).
- `retrying`: the one retry loop for what a node failure or leader election throws.
- `publish`: one entry (`sarpd.cluster.entry` bytes) with its msg id; returns the
  stream sequence and whether JetStream saw that msg id already (a resend: same seq).
  It resends with the SAME msg id while no PubAck arrives (the window makes that
  safe), then answers `Unavailable` (the entry may or may not be stored).
- `ShardReader`: a replica's durable pull consumer (`<stream>_<replica>`), recreated at
  every `open` at the sequence the caller gives (its last applied + 1: the replica's
  own durable number, never the consumer's memory), yielding `(seq, payload)`
  strictly in order, with explicit acks the caller sends once it applied an entry.
  It also says how far behind the log it is (`pending`: entries the log holds past
  the newest one pulled, as JetStream counted them) and when the log stored an entry
  it holds (`stored_at`), which the replica's lag figures are made of.
- `trim_below`: purge the entries below a sequence (once checkpoints cover them).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    PubAck,
    StorageType,
    StreamConfig,
    StreamInfo,
)

from sarpd.errors import ConfigError, CorruptData, Unavailable

__all__ = ["ACK_WAIT_S", "DUPLICATE_IN_PROCESS", "DUPLICATE_WINDOW_S", "FETCH_BATCH",
           "MAX_ACK_PENDING", "MAX_MSG_ID_BYTES", "PUBLISH_TIMEOUT_S", "RETRY_PAUSE_S",
           "RETRY_S", "STREAM_PREFIX", "SUBJECT_PREFIX", "TRANSIENT", "LogConfigError",
           "LogGap", "ShardReader", "connect", "durable_name", "ensure_stream",
           "publish", "retrying", "stream_config", "stream_name", "subject",
           "transient", "trim_below"]

# How long JetStream remembers a msg id. A write's sender resends it, with the same msg
# id, when its PubAck did not arrive (a lost ack, a leader change, a reconnect); a
# resend after the window would be applied twice, so the window must be longer than
# any sender's retry horizon (the cluster client must give up on a write well before
# it). The cost is the servers' memory: one remembered id per write inside the window.
DUPLICATE_WINDOW_S = 300.0
PUBLISH_TIMEOUT_S = 2.0  # one attempt's wait for its PubAck
# Retrying a call that failed transiently (a node down, a leader election: seconds) until
# this deadline, then `Unavailable`. A publish resends the same msg id, so this is a
# retry horizon: it must stay well inside DUPLICATE_WINDOW_S.
RETRY_S = 15.0
RETRY_PAUSE_S = 0.1
ACK_WAIT_S = 30.0  # an entry fetched and not acked in this long is delivered again
MAX_ACK_PENDING = 4096  # entries a reader may hold unacked (bounds one fetch too)
FETCH_BATCH = 256
MAX_MSG_ID_BYTES = 256
SUBJECT_PREFIX = "sarp.log."
STREAM_PREFIX = "SARP_"
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}\Z")  # a NATS name token: no '.', '*', '>', space


T = TypeVar("T")
# what a node going down or a leader election looks like to a caller: worth retrying
# (TimeoutError: nats.errors.TimeoutError derives from it, and nats-py raises both)
TRANSIENT: tuple[type[Exception], ...] = (
    TimeoutError, nats.errors.NoRespondersError,
    nats.errors.ConnectionReconnectingError, nats.errors.StaleConnectionError,
    nats.js.errors.NoStreamResponseError, nats.js.errors.ServiceUnavailableError,
)
# JetStream's 409 while the same msg id's first attempt is still being proposed
DUPLICATE_IN_PROCESS = 10158


def transient(exc: Exception) -> bool:
    if isinstance(exc, TRANSIENT):
        return True
    return isinstance(exc, nats.js.errors.APIError) and exc.err_code == DUPLICATE_IN_PROCESS


class LogConfigError(ConfigError):
    """A stream or consumer exists with other settings than sarp's, or a bad name."""


class LogGap(CorruptData):
    """The log does not continue where the reader stands (trimmed, or out of order)."""


def _check_name(value: str, what: str) -> str:
    if not isinstance(value, str) or _NAME.match(value) is None:
        raise LogConfigError(f"{what}: {value!r} must be 1-64 of [A-Za-z0-9_-] "
                             "(a NATS stream/subject token)")
    return value


def stream_name(shard: str) -> str:
    return STREAM_PREFIX + _check_name(shard, "shard")


def subject(shard: str) -> str:
    return SUBJECT_PREFIX + _check_name(shard, "shard")


def durable_name(shard: str, replica: str) -> str:
    return f"{stream_name(shard)}_{_check_name(replica, 'replica')}"


def stream_config(shard: str, replicas: int) -> StreamConfig:
    if type(replicas) is not int or not 1 <= replicas <= 5:
        raise LogConfigError(f"replicas: {replicas!r} must be an int in 1..5 (JetStream's limit)")
    return StreamConfig(name=stream_name(shard), subjects=[subject(shard)],
                        storage=StorageType.FILE, num_replicas=replicas,
                        duplicate_window=DUPLICATE_WINDOW_S)


async def connect(urls: list[str], *, name: str = "sarpd") -> NATS:
    """A client to the cluster that keeps reconnecting (to any node of `urls`)."""
    return await nats.connect(servers=urls, name=name, connect_timeout=2,
                              reconnect_time_wait=0.2, max_reconnect_attempts=-1)


async def retrying(call: Callable[[], Awaitable[T]], what: str,
                   retry_s: float = RETRY_S) -> T:
    """`call()`, again after each TRANSIENT failure until `retry_s` passed, then
    `Unavailable` naming `what` and the last failure."""
    deadline = time.monotonic() + retry_s
    while True:
        try:
            return await call()
        except Exception as exc:
            if not transient(exc):
                raise
            if time.monotonic() + RETRY_PAUSE_S >= deadline:
                raise Unavailable(f"{what}: JetStream did not answer within {retry_s}s "
                                  f"({type(exc).__name__}: {exc})") from exc
        await asyncio.sleep(RETRY_PAUSE_S)


async def ensure_stream(js: JetStreamContext, shard: str, replicas: int) -> StreamInfo:
    """The shard's stream: created, or an existing one checked to have our settings."""
    want = stream_config(shard, replicas)
    name = want.name
    assert name is not None

    async def get_or_add() -> StreamInfo:
        try:
            return await js.stream_info(name)
        except nats.js.errors.NotFoundError:
            pass
        try:
            return await js.add_stream(want)
        except nats.js.errors.BadRequestError:  # created meanwhile by another replica
            return await js.stream_info(name)

    info = await retrying(get_or_add, f"stream {name}")
    _check_config(info.config, want)
    return info


def _check_config(have: StreamConfig, want: StreamConfig) -> None:
    for name in ("subjects", "storage", "num_replicas", "duplicate_window"):
        h, w = getattr(have, name), getattr(want, name)
        if h != w:
            raise LogConfigError(f"stream {want.name}: {name} is {h!r}, expected {w!r} "
                                 "(sarp does not change an existing stream: fix or delete it)")


async def publish(js: JetStreamContext, shard: str, payload: bytes, msg_id: str, *,
                  timeout_s: float = PUBLISH_TIMEOUT_S,
                  retry_s: float = RETRY_S) -> tuple[int, bool]:
    """Append one entry; return (stream seq, duplicate) once a quorum stored it.
    Resends (same msg id) while JetStream does not answer, up to `retry_s`; then
    `Unavailable`: the entry may or may not be stored, a later resend with the same
    msg id inside the window tells (duplicate=True, the same seq)."""
    if not msg_id or len(msg_id.encode()) > MAX_MSG_ID_BYTES:
        raise LogConfigError(f"msg_id: {msg_id!r} must be 1..{MAX_MSG_ID_BYTES} bytes")
    if retry_s >= DUPLICATE_WINDOW_S:
        raise LogConfigError(f"retry_s: {retry_s} must be below DUPLICATE_WINDOW_S "
                             f"({DUPLICATE_WINDOW_S})")
    subj, stream = subject(shard), stream_name(shard)
    headers = {"Nats-Msg-Id": msg_id}

    async def once() -> PubAck:
        return await js.publish(subj, payload, timeout=timeout_s, stream=stream,
                                headers=dict(headers))

    ack = await retrying(once, f"shard {shard}: publish {msg_id!r}", retry_s)
    return ack.seq, bool(ack.duplicate)


async def trim_below(js: JetStreamContext, shard: str, seq: int) -> None:
    """Purge every entry with a stream sequence below `seq` (>= 1; 1 purges nothing)."""
    if type(seq) is not int or seq < 1:
        raise LogConfigError(f"seq: {seq!r} must be an int >= 1 (0 would purge everything)")
    if seq > 1:
        name = stream_name(shard)
        await retrying(lambda: js.purge_stream(name, seq=seq), f"trim {name} below {seq}")


@dataclass(slots=True)
class ShardReader:
    """A replica's in-order view of its shard's log (open it with `ShardReader.open`)."""

    js: JetStreamContext
    shard: str
    replica: str
    next_seq: int  # the next sequence the reader pulls from the log
    _sub: JetStreamContext.PullSubscription
    _unacked: dict[int, Msg] = field(default_factory=dict)
    _ready: deque[tuple[int, bytes]] = field(default_factory=deque)  # pulled, not yielded
    # entries the log held past the newest pulled one (JetStream's num_pending of it);
    # 0 after a pull that found nothing
    pending: int = 0

    @classmethod
    async def open(cls, js: JetStreamContext, shard: str, replica: str,
                   start_seq: int) -> ShardReader:
        """A reader yielding `start_seq`, `start_seq + 1`, ...: the replica's durable
        consumer, recreated at `start_seq` (`LogGap` if the log was trimmed above it)."""
        if type(start_seq) is not int or start_seq < 1:
            raise LogConfigError(f"start_seq: {start_seq!r} must be an int >= 1")
        stream, durable = stream_name(shard), durable_name(shard, replica)
        info = await retrying(lambda: js.stream_info(stream), f"stream {stream}")
        if info.state.first_seq > start_seq:
            raise LogGap(f"shard {shard}: replica {replica} starts at seq {start_seq}, "
                         f"the log was trimmed below {info.state.first_seq} (start from a "
                         "newer checkpoint)")

        async def recreate() -> JetStreamContext.PullSubscription:
            with contextlib.suppress(nats.js.errors.NotFoundError):
                await js.delete_consumer(stream, durable)
            config = ConsumerConfig(
                durable_name=durable, deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                opt_start_seq=start_seq, ack_policy=AckPolicy.EXPLICIT,
                ack_wait=ACK_WAIT_S, max_ack_pending=MAX_ACK_PENDING,
                filter_subject=subject(shard))
            return await js.pull_subscribe(subject(shard), durable=durable, stream=stream,
                                           config=config)

        sub = await retrying(recreate, f"consumer {durable}")
        return cls(js, shard, replica, start_seq, sub)

    async def fetch(self, timeout_s: float = 1.0,
                    batch: int = FETCH_BATCH) -> list[tuple[int, bytes]]:
        """The next entries in order (none if nothing arrived within `timeout_s`)."""
        if not self._ready:
            await self._pull(timeout_s, batch)
        out = list(self._ready)
        self._ready.clear()
        return out

    async def entries(self, timeout_s: float = 1.0) -> AsyncIterator[tuple[int, bytes]]:
        """Every entry from `next_seq` on, forever (waits for new ones). Leaving the
        loop loses nothing: entries pulled and not yet yielded stay for the next call."""
        while True:
            if not self._ready:
                await self._pull(timeout_s, FETCH_BATCH)
            while self._ready:
                yield self._ready.popleft()

    async def _pull(self, timeout_s: float, batch: int) -> None:
        try:
            msgs = await self._sub.fetch(min(batch, MAX_ACK_PENDING), timeout=timeout_s)
        except TimeoutError:  # nothing arrived (nats-py raises its own subclass, or this)
            self.pending = 0
            return
        except nats.js.errors.ServiceUnavailableError:  # 503: the consumer has no leader
            # yet (just created on a replicated stream, or its node went down): nothing
            # to read for now
            await asyncio.sleep(min(timeout_s, RETRY_PAUSE_S))
            return
        for msg in msgs:
            seq = msg.metadata.sequence.stream
            if seq < self.next_seq:  # delivered again (ack_wait ran out): pulled already
                continue
            if seq != self.next_seq:
                raise LogGap(f"shard {self.shard}: replica {self.replica} expected seq "
                             f"{self.next_seq}, the log gave {seq}")
            self._unacked[seq] = msg
            self.next_seq = seq + 1
            self.pending = msg.metadata.num_pending
            self._ready.append((seq, msg.data))

    def stored_at(self, seq: int) -> float | None:
        """When the log stored entry `seq` (epoch seconds, the NATS server's clock), for
        an entry pulled and not yet acked; None otherwise."""
        msg = self._unacked.get(seq)
        return None if msg is None else msg.metadata.timestamp.timestamp()

    async def ack(self, seq: int) -> None:
        """The caller applied every entry up to `seq`: ack them (explicit acks)."""
        for s in sorted(s for s in self._unacked if s <= seq):
            await self._unacked.pop(s).ack()

    async def close(self) -> None:
        """Stop reading; the durable consumer stays (the next `open` recreates it)."""
        await self._sub.unsubscribe()
