"""Cluster mode: requests from routers on other hosts, over NATS request/reply.

A replica of shard S subscribes to `sarpd.cluster.route.request_subject(S)` in the
queue group `queue_group(S)`, so NATS gives each request to one replica of the shard
and skips replicas that are down. A request message holds ONE request frame exactly
as on the socket (PROTOCOL.md), and the reply is its response frame; a client
pipelines by having many requests in flight. A write's `Sarp-Write-Id` header is its
id in the log, so that a resend (to any replica) is applied once. Each message is its
own connection to the server (`RemoteConn`): the batcher, the forwarder (writes go through the log,
`after_seq` waits) and every limit treat it as a socket's request. A remote peer has
no SO_PEERCRED: an access policy that checks credentials refuses its requests.
"""

from __future__ import annotations

import asyncio
import logging

from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from sarpd.cluster.log import MAX_MSG_ID_BYTES
from sarpd.cluster.route import WRITE_ID_HEADER, queue_group, request_subject
from sarpd.daemon.server import Connection, Server
from sarpd.errors import FrameError
from sarpd.model import Request
from sarpd.protocol.wire import BadMessage, Decoder, StreamError, encode_error

log = logging.getLogger("sarpd.daemon.nats_front")
_PUBLISHING: set[asyncio.Task[None]] = set()  # replies on their way (kept referenced)


class RemoteConn(Connection):
    """One NATS request message as a connection: its one answer is the reply."""

    def __init__(self, server: Server, nc: NATS, reply: str, write_id: str | None) -> None:
        super().__init__(server)
        self.peer = f"nats {reply}"
        self._nc, self._reply = nc, reply
        self.write_id = write_id

    def send(self, data: bytes) -> None:
        if self.closed:
            return
        self.closed = True  # one request, one answer
        task = asyncio.get_running_loop().create_task(self._nc.publish(self._reply, data))
        _PUBLISHING.add(task)
        task.add_done_callback(_PUBLISHING.discard)

    def answered(self, n: int) -> None:
        self.inflight -= n

    def close(self) -> None:
        self.closed = True


class NatsFront:
    def __init__(self, server: Server, nc: NATS, shard: str) -> None:
        self.server, self.nc, self.shard = server, nc, shard
        self._sub: Subscription | None = None

    async def start(self) -> None:
        self._sub = await self.nc.subscribe(request_subject(self.shard),
                                            queue=queue_group(self.shard), cb=self._on_msg)

    async def stop(self) -> None:
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None

    async def _on_msg(self, msg: Msg) -> None:
        if not msg.reply:
            return  # a publish, not a request: nobody to answer
        decoder = Decoder(self.server.limits)
        items: list[Request | BadMessage]
        try:
            items = decoder.feed(msg.data)
            if decoder.buffered:
                items.append(BadMessage(0, FrameError(
                    f"frame: the message ends inside a request ({decoder.buffered} bytes)")))
        except StreamError as exc:  # the requests before the bad bytes are answered
            items = [*exc.decoded, BadMessage(0, exc)]
        except FrameError as exc:
            items = [BadMessage(0, exc)]
        if len(items) != 1:
            items = [BadMessage(0, FrameError(
                f"frame: a NATS request holds one request, this one {len(items)}"))]
        write_id = (msg.headers or {}).get(WRITE_ID_HEADER) or None
        if write_id is not None and len(write_id.encode()) > MAX_MSG_ID_BYTES:
            items = [BadMessage(0, FrameError(f"{WRITE_ID_HEADER}: {len(write_id.encode())} "
                                              f"bytes exceeds {MAX_MSG_ID_BYTES}"))]
        conn = RemoteConn(self.server, self.nc, msg.reply, write_id)
        item = items[0]
        if isinstance(item, BadMessage):
            conn.send(encode_error(item.id, item.error))
        else:
            self.server.submit(conn, item)
