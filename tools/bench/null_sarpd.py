"""A stand-in for sarpd that answers every request at once, without indexing anything:
what the vLLM bridge sustains on its own (`tools.bench.bridge`'s
``bridge_alone_events_per_s``).

    python -m tools.bench.null_sarpd SOCKET

It speaks PROTOCOL.md's framing (msgpack maps back to back, answers by id) and says
protocol 2 with holders; `insert` answers every block as new, `remove` every id as
removed, `match` nothing matched, anything else a bare ``ok``.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any, cast

import msgpack


class _Null(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.unpacker.feed(data)
        out = [msgpack.packb(answer(m)) for m in self.unpacker]
        if out and self.transport is not None:
            self.transport.write(b"".join(out))


def answer(m: Any) -> dict[str, Any]:
    """The answer to one request map."""
    op = m.get("op") if isinstance(m, dict) else None
    res: dict[str, Any] = {"id": m.get("id", 0) if isinstance(m, dict) else 0, "ok": True}
    if op == "hello":
        res.update(protocol=2, max_protocol=2, holders=True)
    elif op == "insert":
        n = len(m.get("hashes") or ()) or len(m.get("tokens") or ()) // 16
        res.update(blocks=n, new_blocks=n, matched_blocks=0)
    elif op in ("remove", "clear"):
        res["removed"] = len(m.get("ids") or ())
    elif op == "match":
        res.update(blocks=0, tokens=0, meta=b"", holders=[])
    return res


async def serve(path: str) -> None:
    server = await asyncio.get_running_loop().create_unix_server(_Null, path)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1]))
