"""Helpers shared by the protocol tests: msgpack in and out, one-message decoding."""

from __future__ import annotations

import re
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


# ------------------------------------------------ what a bad-input message must not say

# numpy dtypes, Python exception types, msgpack internals (issue 22); `int64` as a
# word of its own: the protocol's `uint64` is the rule a message should name
FORBIDDEN = ("<U", "(?<!u)int64", "object", "dtype", "float64", "OverflowError", "TypeError",
             "ValueError", "msgpack", "Traceback", "invalid literal")
# text that can never spell a FORBIDDEN word (so a message that shows it stays clean)
SAFE_TEXT = "abcxyz XYZ019-_é\u00e9\u4e2d"


def assert_clean(message: str, field: str) -> None:
    """A bad-input message names `field` and leaks no internals."""
    assert field in message, (field, message)
    leaked = [w for w in FORBIDDEN if re.search(w, message)]
    assert not leaked, (leaked, message)
