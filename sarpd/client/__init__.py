"""Python client of sarpd (PROTOCOL.md): `Client` (asyncio, pipelined), `SyncClient`
(blocking) and `ClusterClient` (a whole cluster, over NATS).

    client = await Client.connect("/run/sarpd/sarpd.sock")
    await client.insert(tokens=prompt_tokens, meta=worker_slot)
    hit = await client.match(tokens=prompt_tokens)   # {"blocks", "tokens", "meta": [...]}

Any number of requests may be in flight at once (``asyncio.gather`` them); responses
are matched to requests by id. Every method returns the result fields of the
response as a dict (without ``id`` and ``ok``); ``match`` decodes ``meta`` to a list
of ints and ``ids`` to a list of 16-byte ids. An error response raises the
`SarpError` subclass of its code. A lost connection fails every request in flight,
and every later one, with `ConnectionLost`.

Tokens go out as ``bin`` of little-endian uint32; ids given as bytes or an (n, 2)
uint64 array go out as ``bin`` of 16 bytes per id, a 1-D array as a list of uints,
and a list as given (ints or 16-byte ids).

The modules: `ops` (the operations, over any transport: `Ops`), `conn` (one Unix
socket: `Client`, with `submit`/`flush`/`outcomes` for a window of requests in one
write), `cluster` (`ClusterClient`), `sync` (`SyncClient`), `fields` (request
fields from Python values, checked before sending). The names below are the public
surface; everything else may change.
"""

from sarpd.client.cluster import ClusterClient
from sarpd.client.conn import Client
from sarpd.client.fields import Ids, Meta, OneId, Result, Tokens
from sarpd.client.ops import (
    REQUEST_TIMEOUT_S,
    ConnectFailed,
    ConnectionLost,
    Ops,
    RequestTimeout,
    SarpConnectionError,
)
from sarpd.client.sync import SyncClient

__all__ = [
    "REQUEST_TIMEOUT_S",
    "Client",
    "ClusterClient",
    "ConnectFailed",
    "ConnectionLost",
    "Ids",
    "Meta",
    "OneId",
    "Ops",
    "RequestTimeout",
    "Result",
    "SarpConnectionError",
    "SyncClient",
    "Tokens",
]
