"""Helpers shared by the protocol tests: msgpack in and out, one-message decoding."""

from __future__ import annotations

from typing import Any

import msgpack
import numpy as np

from sarpd.protocol.wire import Decoder, Limits

ID_A = bytes(range(16))
ID_B = bytes(range(100, 116))
SMALL = Limits(max_sequence_tokens=64)  # max_ids 4, max_items 128


def pack(obj: Any) -> bytes:
    raw: bytes = msgpack.packb(obj, use_bin_type=True)
    return raw


def unpack(raw: bytes) -> Any:
    return msgpack.unpackb(raw, raw=False)


def decode1(obj: Any, limits: Limits | None = None) -> Any:
    out = Decoder(limits).feed(pack(obj))
    assert len(out) == 1
    return out[0]


def u32(values: list[int]) -> bytes:
    return np.array(values, dtype="<u4").tobytes()


def m(op: str, **fields: Any) -> dict[str, Any]:
    return {"id": 7, "op": op, **fields}
