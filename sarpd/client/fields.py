"""Request fields from Python values, checked before anything is sent (the client's
side of the rules in sarpd.protocol.requests, which the server applies; both name the
field, the value and the rule: ``tokens[2]: 99999999999999999999999 is not a uint32``).

Tokens go out as ``bin`` of little-endian uint32; ids given as bytes or an (n, 2)
uint64 array go out as ``bin`` of 16 bytes per id, any other sequence as a list of
uints and 16-byte ids; ``meta`` as one uint, a list, or ``bin`` of uint64 LE.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, TypeAlias

import numpy as np

from sarpd.errors import BadRequest
from sarpd.model import ids_to_bytes
from sarpd.protocol.requests import (
    ID_RULE,
    IDS_RULE,
    META_RULE,
    TOKENS_RULE,
    check_uint,
    first_bad,
    id_items,
    show,
    uint_array,
)

__all__ = ["Ids", "Meta", "OneId", "Result", "Tokens", "bool_arg", "decode_match", "ids_field",
           "meta_field", "one_id_field", "seq_fields", "tokens_bin", "uint_arg"]

Tokens: TypeAlias = "Sequence[int] | np.ndarray[Any, Any] | bytes"
Ids: TypeAlias = "Sequence[int | bytes] | np.ndarray[Any, Any] | bytes"
OneId: TypeAlias = "int | bytes | np.ndarray[Any, Any]"
Meta: TypeAlias = "int | Sequence[int] | np.ndarray[Any, Any] | bytes"
Result: TypeAlias = dict[str, Any]

_U32_LIMIT = 2**32
_U64_LIMIT = 2**64


def seq_fields(tokens: Tokens | None, hashes: Ids | None, ns: str) -> dict[str, Any]:
    """``ns`` plus ``tokens`` (bin of uint32 LE) and/or ``hashes``, as given."""
    if type(ns) is not str:
        raise BadRequest(f"ns: {show(ns)} is not a str (a namespace name)")
    fields: dict[str, Any] = {"ns": ns}
    if tokens is not None:
        fields["tokens"] = tokens_bin(tokens)
    if hashes is not None:
        fields["hashes"] = ids_field(hashes, "hashes")
    return fields


def _items(value: object, name: str, rule: str) -> list[Any]:
    """A sequence of values (list, tuple, range, numpy array) as a list of plain
    values (numpy ints -> ints), or a BadRequest naming `name` and `rule`."""
    if isinstance(value, np.ndarray):
        if value.ndim != 1:
            raise BadRequest(f"{name}: an array of {value.ndim} dimensions is not {rule}")
        return list(value.tolist())
    if isinstance(value, str | Mapping) or not isinstance(value, Sequence):
        raise BadRequest(f"{name}: {show(value)} is not {rule}")
    items = list(value)
    if not set(map(type, items)) <= {int}:
        items = [int(v) if isinstance(v, np.integer) else v for v in items]
    return items


def _bin(value: bytes | bytearray | memoryview, name: str, width: int, unit: str) -> bytes:
    """A field given as bin: whole items of `width` bytes, or a BadRequest."""
    raw = bytes(value)
    if len(raw) % width:
        raise BadRequest(f"{name}: bin of {len(raw)} bytes is not a multiple of {width} "
                         f"({unit})")
    return raw


def tokens_bin(tokens: Tokens) -> bytes:
    """Token ids -> bin of little-endian uint32 (bytes pass through); a BadRequest
    names the first bad token: ``tokens[2]: 99999999999999999999999 is not a uint32``."""
    if isinstance(tokens, bytes | bytearray | memoryview):
        return _bin(tokens, "tokens", 4, "uint32 LE per token")
    if isinstance(tokens, np.ndarray) and tokens.ndim == 1 and tokens.dtype.kind in "iu":
        arr = tokens  # the common case: checked with numpy, no Python object per token
        if arr.dtype != np.uint32 and arr.size and (int(arr.min()) < 0
                                                    or int(arr.max()) >= _U32_LIMIT):
            raise first_bad(arr.tolist(), "tokens", _U32_LIMIT, "uint32")
        return arr.astype("<u4").tobytes()
    items = _items(tokens, "tokens", TOKENS_RULE)
    return uint_array(items, "tokens", _U32_LIMIT, "uint32").astype("<u4").tobytes()


def ids_field(ids: Ids, name: str) -> bytes | list[Any]:
    """bytes / (n, 2) array -> bin of 16 B per id; any other sequence -> a list of
    uints and 16-byte ids, each checked (``hashes[1]: -1 is not a uint64 ...``)."""
    if isinstance(ids, bytes | bytearray | memoryview):
        return _bin(ids, name, 16, "id size")
    if isinstance(ids, np.ndarray) and ids.ndim == 2:
        if ids.shape[1] != 2 or ids.dtype.kind != "u":
            raise BadRequest(f"{name}: an array of shape {ids.shape} is not a list of ids "
                             "(an (n, 2) array of unsigned halves, or a flat list)")
        return ids_to_bytes(ids)
    items = _items(ids, name, IDS_RULE)
    out = [bytes(x) if isinstance(x, bytearray | memoryview) else x for x in items]
    id_items(out, name)  # the protocol's rule for each id: raises naming the first bad one
    return out


def one_id_field(v: OneId, name: str) -> int | bytes:
    """One block id (``parent``): a uint64, a 16-byte id or a (1, 2) / (2,) array."""
    if isinstance(v, np.ndarray) and v.dtype.kind == "u" and v.size == 2:
        return ids_to_bytes(v.reshape(1, 2))
    if isinstance(v, np.ndarray | np.integer):
        v = v.tolist()
    one = bytes(v) if isinstance(v, bytearray | memoryview) else v
    if not isinstance(one, bytes):
        one = check_uint(name, one, what=ID_RULE)
    elif len(one) != 16:
        raise BadRequest(f"{name}: bin of {len(one)} bytes is not an id (an id takes 16)")
    return one


def meta_field(meta: Meta) -> int | bytes | list[int]:
    """``meta``: one uint64 for every block, or one per block (list, array or bin)."""
    if isinstance(meta, np.integer):
        meta = int(meta)
    if isinstance(meta, bytes | bytearray | memoryview):
        return _bin(meta, "meta", 8, "uint64 LE per block")
    if isinstance(meta, np.ndarray) and meta.ndim == 1 and meta.dtype.kind in "iu":
        if meta.dtype.kind == "i" and meta.size and int(meta.min()) < 0:
            raise first_bad(meta.tolist(), "meta", _U64_LIMIT, "uint64")
        return np.ascontiguousarray(meta, dtype="<u8").tobytes()
    if isinstance(meta, np.ndarray) or (isinstance(meta, Sequence) and not isinstance(meta, str)):
        items = _items(meta, "meta", META_RULE)
        uint_array(items, "meta", _U64_LIMIT, "uint64")
        return items
    return check_uint("meta", meta)


def bool_arg(name: str, v: object) -> bool:
    if isinstance(v, bool | np.bool_):
        return bool(v)
    raise BadRequest(f"{name}: {show(v)} is not a bool (True or False)")


def uint_arg(name: str, v: object) -> int:
    """An optional uint64 argument (``from``, a holder's ``meta``, ``mask``,
    ``value``, ``holders``, ``protocol``): numpy ints taken as ints."""
    return check_uint(name, int(v) if isinstance(v, np.integer) else v)


def decode_match(result: Result) -> Result:
    """``meta`` bin -> list[int]; ``ids`` bin -> list of 16-byte ids (in place)."""
    meta = result.get("meta")
    if isinstance(meta, bytes):
        result["meta"] = np.frombuffer(meta, dtype="<u8").tolist()
    ids = result.get("ids")
    if isinstance(ids, bytes):
        result["ids"] = [ids[i : i + 16] for i in range(0, len(ids), 16)]
    return result
