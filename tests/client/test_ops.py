"""`Ops` (sarpd.client.ops): every operation's arguments checked before anything is
sent."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import pytest

from sarpd.client import (
    Client,
)
from sarpd.errors import BadRequest
from sarpd.protocol.wire import (
    Decoder,
)
from tests.client.fake_sarpd import (
    answer,
    fake_server,
    run,
)
from tests.protocol.helpers import assert_clean


def test_bad_values_fail_before_anything_is_sent() -> None:
    got: list[Any] = []

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        dec = Decoder()
        while data := await reader.read(65536):
            for req in dec.feed(data):
                got.append(req)
                writer.write(answer(req))

    async def main() -> None:
        async with fake_server(handler) as path:
            client = await Client.connect(path)
            bad: list[tuple[Awaitable[Any], str]] = [
                (client.insert(tokens=list(range(32)), meta=2**64),
                 "meta: 18446744073709551616 is not a uint64"),
                (client.match(tokens=[1, 2, 99999999999999999999999]),
                 "tokens[2]: 99999999999999999999999 is not a uint32"),
                (client.remove(tokens=[1], meta=-1), "meta: -1 is not a uint64"),
                (client.clear("n", mask=2**64), "mask: 18446744073709551616 is not a uint64"),
                (client.report("bridge", {"events": 2**70}), "counters.events: 1180591620"),
                (client.request("match", tokens=[1], after_seq={"s0": 2**64}),
                 "after_seq.s0: 18446744073709551616 is out of range"),
            ]
            for call, text in bad:
                with pytest.raises(BadRequest) as info:
                    await call
                assert text in info.value.message
                assert_clean(info.value.message, text.split(":")[0].split("[")[0])
            assert await client.ping() == {"op": "ping"}
            await client.close()
        assert [type(r).__name__ for r in got] == ["Ping"]

    run(main())


