"""backends/base.py: WriteBatch (a later operation on a key wins) and the Backend
protocol's runtime check (what the registry refuses)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from backends.base import Backend, WriteBatch
from backends.memory import MemoryBackend

KEYS = st.sampled_from([b"a", b"b", b"c", b"S\x00", b""])
OPS = st.lists(st.tuples(KEYS, st.none() | st.binary(max_size=4)), max_size=20)


def test_put_then_delete_and_delete_then_put() -> None:
    wb = WriteBatch()
    wb.put(b"x", b"1")
    wb.delete(b"x")
    wb.delete(b"y")
    wb.put(b"y", b"2")
    assert wb.puts == {b"y": b"2"} and wb.deletes == {b"x"}
    assert len(wb) == 2


def test_put_many_overrides_earlier_deletes() -> None:
    wb = WriteBatch()
    wb.delete(b"a")
    wb.delete(b"b")
    wb.put_many({b"a": b"1", b"c": b"3"})
    assert wb.puts == {b"a": b"1", b"c": b"3"} and wb.deletes == {b"b"}
    assert len(wb) == 3 and len(WriteBatch()) == 0


@given(OPS)
def test_a_batch_equals_its_operations_applied_in_order(ops: list[tuple[bytes, bytes | None]]
                                                        ) -> None:
    wb, state = WriteBatch(), {}
    for key, value in ops:
        if value is None:
            wb.delete(key)
            state[key] = None
        else:
            wb.put(key, value)
            state[key] = value
    assert wb.puts == {k: v for k, v in state.items() if v is not None}
    assert wb.deletes == {k for k, v in state.items() if v is None}
    assert not set(wb.puts) & wb.deletes


def test_backend_protocol_is_checked_at_runtime() -> None:
    assert isinstance(MemoryBackend(), Backend)
    assert not isinstance(object(), Backend)

    class NoResume:  # everything but resume() and persistent
        name = "x"

        def get_many(self, keys: object) -> list[None]:
            return []

        def write(self, batch: WriteBatch, sync: bool) -> None: ...
        def scan(self, start: bytes, end: bytes) -> None: ...
        def sync(self) -> None: ...
        def close(self) -> None: ...
        def stats(self) -> dict[str, int]:
            return {}

    assert not isinstance(NoResume(), Backend)
