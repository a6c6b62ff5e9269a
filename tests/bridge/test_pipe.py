"""The bridge's connection (sarpd.bridge.pipe): a window of requests in one write,
answered in order with the results and errors `Client.request` gives, against a real
sarpd; a lost connection fails every request of the window."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from sarpd.bridge.mapping import ClearOp, InsertOp, RemoveOp
from sarpd.bridge.pipe import PipeClient, request_of, result_of
from sarpd.client import ConnectionLost
from sarpd.errors import UnknownParent
from tests.daemon_helpers import SarpdProc


def test_request_of_each_op() -> None:
    assert request_of(InsertOp("a", (1, 2), None, 7)) == (
        "insert", {"ns": "a", "hashes": (1, 2), "meta": 7})
    assert request_of(InsertOp("", (2,), 1, 7))[1]["parent"] == 1
    assert request_of(RemoveOp("a", (1,), 7)) == ("remove", {"ns": "a", "ids": (1,), "meta": 7})
    assert "meta" not in request_of(RemoveOp("a", (1,)))[1]
    assert request_of(ClearOp("a", 3, 1)) == ("clear", {"ns": "a", "mask": 3, "value": 1})
    with pytest.raises(TypeError, match="is not one request"):
        request_of("insert")  # type: ignore[arg-type]


def test_a_window_in_one_write(sarpd_proc: SarpdProc) -> None:
    async def main() -> list[object]:
        client = await PipeClient.connect(sarpd_proc.socket)
        try:
            await client.hello(protocol=2)
            ops = [InsertOp("", (1, 2, 3), None, 7), InsertOp("", (4,), 3, 7),
                   InsertOp("", (9,), 99, 7), RemoveOp("", (4,), 7)]  # fmt: skip
            futs = [client.submit(*request_of(op)) for op in ops]
            assert not any(f.done() for f in futs)  # nothing sent before flush
            await client.flush()
            out = [result_of(r) for r in await asyncio.gather(*futs, return_exceptions=True)]
            hit = await client.match(hashes=[1, 2, 3, 4])
            return [*out, hit["blocks"]]
        finally:
            await client.close()

    first, second, orphan, removal, blocks = asyncio.run(main())
    assert first == {"blocks": 3, "new_blocks": 3, "matched_blocks": 0}
    assert isinstance(second, dict) and second["new_blocks"] == 1
    assert isinstance(orphan, UnknownParent)
    assert removal == {"removed": 1}
    assert blocks == 3  # applied in order: the removal after the insert of block 4


def test_a_lost_connection_fails_the_window(sarpd_proc: SarpdProc) -> None:
    async def main() -> list[object]:
        client = await PipeClient.connect(sarpd_proc.socket)
        await client.close()
        futs = [client.submit(*request_of(ClearOp("", 0, 0))) for _ in range(3)]
        await client.flush()
        return list(await asyncio.gather(*futs, return_exceptions=True))

    assert all(isinstance(r, ConnectionLost) for r in asyncio.run(main()))


def test_an_unanswered_window_is_dropped_after_the_request_timeout(tmp_path: Path) -> None:
    """A sarpd that takes the connection and never answers: the window fails with
    ConnectionLost naming the timeout (the bridge retries it), never hangs."""
    path = tmp_path / "mute.sock"
    mute = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mute.bind(str(path))
    mute.listen()

    async def main() -> list[object]:
        client = await PipeClient.connect(path, request_timeout=0.2)
        try:
            futs = [client.submit(*request_of(ClearOp("", 0, 0))) for _ in range(3)]
            await client.flush()
            return list(await asyncio.wait_for(client.outcomes(futs), 10))
        finally:
            await client.close()

    try:
        out = asyncio.run(main())
    finally:
        mute.close()
    assert len(out) == 3 and all(isinstance(r, ConnectionLost) for r in out), out
    assert "3 requests unanswered after 0.2 s" in str(out[0])
