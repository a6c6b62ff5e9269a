"""Helpers the backend tests share: one-key reads, whole-batch writes, the big-endian
ids of the segment key space. (They were in backends/base.py; only tests used them.)"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from backends.base import Backend, WriteBatch


def be8(i: int) -> bytes:
    """`i` as 8 big-endian bytes (a segment id in its key)."""
    return i.to_bytes(8, "big")


def get_one(backend: Backend, key: bytes) -> bytes | None:
    return backend.get_many([key])[0]


def put_all(backend: Backend, items: Iterable[tuple[bytes, bytes]], sync: bool) -> None:
    """Write every (key, value) of `items` in one batch."""
    wb = WriteBatch()
    for k, v in items:
        wb.put(k, v)
    backend.write(wb, sync)


def batch_of(puts: dict[bytes, bytes] | None = None, deletes: Sequence[bytes] = ()) -> WriteBatch:
    """A batch of `deletes`, then `puts`."""
    wb = WriteBatch()
    for k in deletes:
        wb.delete(k)
    for k, v in (puts or {}).items():
        wb.put(k, v)
    return wb
