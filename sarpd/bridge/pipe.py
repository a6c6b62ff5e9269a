"""The requests the bridge sends to sarpd, from its translated operations.

The bridge sends a window of requests in one write with `Client.submit` (one per
request, no coroutine or task each), `Client.flush` (one write) and
`Client.outcomes` (every result or error, within the request timeout): the client's
own pipelined path, the one `Client.request` takes for a single request.

`request_of` gives the request of one operation: ids go out as msgpack uints (sarpd
zero-extends them, PROTOCOL.md `hashes`), `meta` as one uint for every block.
"""

from __future__ import annotations

from typing import Any

from sarpd.events.mapping import ClearOp, InsertOp, Op, RemoveOp

__all__ = ["request_of"]


def request_of(op: Op) -> tuple[str, dict[str, Any]]:
    """The sarpd request (op name, fields) of an insert, a removal or a clear."""
    if isinstance(op, InsertOp):
        fields: dict[str, Any] = {"ns": op.ns, "hashes": op.hashes, "meta": op.meta}
        if op.parent is not None:
            fields["parent"] = op.parent
        return "insert", fields
    if isinstance(op, RemoveOp):
        fields = {"ns": op.ns, "ids": op.ids}
        if op.meta is not None:
            fields["meta"] = op.meta
        return "remove", fields
    if isinstance(op, ClearOp):
        return "clear", {"ns": op.ns, "mask": op.mask, "value": op.value}
    raise TypeError(f"request_of: {type(op).__name__} is not one request")
