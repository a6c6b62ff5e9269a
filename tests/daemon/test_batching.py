"""The batcher's queue (sarpd.daemon.batching): reads ahead of other connections'
writes, write batches bounded in blocks, every connection's order kept."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sarpd.daemon.batching import BatchQueue, write_blocks
from sarpd.daemon.service import kind_of
from sarpd.model import Clear, Insert, Match, Ping, Remove, Request, SeqSpec, Snapshot

BT = 16


def insert(rid: int, blocks: int) -> Insert:
    return Insert(rid, SeqSpec("", hashes=np.zeros((blocks, 2), np.uint64)), meta=1)


def match(rid: int) -> Match:
    return Match(rid, SeqSpec("", tokens=np.zeros(2 * BT, np.uint32)))


def push(q: BatchQueue[str], conn: str, req: Request) -> None:
    q.push((conn, req, 8, 0.0), kind_of(req) == "read")


def ids(batch: list[tuple[str, Request, int, float]]) -> list[int]:
    return [req.id for _, req, _, _ in batch]


def test_write_blocks_counts_what_a_write_names() -> None:
    assert write_blocks(insert(1, 7), BT, 100) == 7
    assert write_blocks(Insert(1, SeqSpec("", tokens=np.zeros(5 * BT + 3, np.uint32)), 1),
                        BT, 100) == 5
    assert write_blocks(Remove(1, ns="", ids=np.zeros((4, 2), np.uint64)), BT, 100) == 4
    assert write_blocks(Clear(1, ns=""), BT, 100) == 100  # a scan: a batch of its own
    assert write_blocks(match(1), BT, 100) == 0


def test_a_read_goes_ahead_of_other_connections_writes_but_not_its_own() -> None:
    q: BatchQueue[str] = BatchQueue(max_blocks=10, block_tokens=BT)
    push(q, "w", insert(1, 6))
    push(q, "w", insert(2, 6))
    push(q, "a", match(3))  # nothing of "a" queued: the read lane
    push(q, "w", match(4))  # behind its own writes: stays in the main lane
    assert len(q) == 4 and q.nbytes == 32
    assert ids(q.take(256)) == [3]
    assert ids(q.take(256)) == [1]  # 6 + 6 blocks pass 10: one write
    assert ids(q.take(256)) == [2, 4]
    assert not q and q.nbytes == 0


def test_reads_wait_behind_one_batch_of_writes_at_most_and_never_starve_them() -> None:
    q: BatchQueue[str] = BatchQueue(max_blocks=4, block_tokens=BT)
    for i in range(6):
        push(q, "w", insert(i, 4))
    taken = []
    for i in range(6):  # a reader whose next query comes as soon as it is answered
        push(q, f"r{i}", match(100 + i))
        taken.append(ids(q.take(256)))
        taken.append(ids(q.take(256)))
    assert taken == [[100], [0], [101], [1], [102], [2], [103], [3], [104], [4], [105], [5]]


def test_a_large_write_goes_alone_and_a_clear_too() -> None:
    q: BatchQueue[str] = BatchQueue(max_blocks=8, block_tokens=BT)
    push(q, "w", insert(1, 50))
    push(q, "w", insert(2, 1))
    push(q, "x", Clear(3, ns=""))
    push(q, "x", insert(4, 1))
    push(q, "y", Snapshot(5))
    assert [ids(q.take(256)) for _ in range(3)] == [[1], [2], [3]]
    assert ids(q.take(256)) == [4, 5]


def test_the_main_lane_stops_before_a_connection_whose_reads_are_queued() -> None:
    """'a' read (read lane), then wrote: the write must not run before that read."""
    q: BatchQueue[str] = BatchQueue(max_blocks=100, block_tokens=BT)
    push(q, "w", insert(1, 1))
    first = q.take(256)  # the main lane's turn came; the read lane is empty
    assert ids(first) == [1]
    push(q, "a", match(2))
    push(q, "w", insert(3, 1))
    push(q, "a", insert(4, 1))
    push(q, "w", insert(5, 1))
    assert ids(q.take(256)) == [2]
    assert ids(q.take(256)) == [3, 4, 5]
    push(q, "b", match(6))
    push(q, "b", insert(7, 1))
    q._reads_last = True  # as after a batch of reads: the main lane's turn
    assert ids(q.take(256)) == [6]  # "b"'s write waits for its read: reads go now
    assert ids(q.take(256)) == [7]


def test_batch_max_bounds_either_lane() -> None:
    q: BatchQueue[str] = BatchQueue(max_blocks=1000, block_tokens=BT)
    for i in range(5):
        push(q, f"r{i}", Ping(i))
    for i in range(5, 10):
        push(q, "w", insert(i, 1))
    assert [ids(q.take(3)) for _ in range(4)] == [[0, 1, 2], [5, 6, 7], [3, 4], [8, 9]]


OPS = st.lists(st.tuples(st.sampled_from("abcd"), st.sampled_from(["r", "w", "c", "b"]),
                         st.integers(1, 12), st.booleans()), max_size=60)


@settings(max_examples=300, deadline=None)
@given(OPS, st.integers(1, 5), st.integers(1, 16))
def test_every_connection_keeps_its_order_and_nothing_is_lost(
        ops: list[tuple[str, str, int, bool]], limit: int, max_blocks: int) -> None:
    """Random pushes with takes between them: each connection's requests come out in
    the order pushed, once each; batches hold at most `limit` requests, at most
    `max_blocks` blocks of writes unless one write alone, and one lane each."""
    q: BatchQueue[str] = BatchQueue(max_blocks=max_blocks, block_tokens=BT)
    pushed: dict[str, list[int]] = {}
    out: dict[str, list[int]] = {}
    make = {"r": lambda i, n: match(i), "w": insert, "c": lambda i, n: Clear(i, ns=""),
            "b": lambda i, n: Snapshot(i)}

    def take() -> None:
        lanes = ({id(x) for x in q.reads}, {id(x) for x in q.main})
        batch = q.take(limit)
        assert batch and len(batch) <= limit
        assert any({id(x) for x in batch} <= lane for lane in lanes)  # one lane
        blocks = sum(write_blocks(r, BT, max_blocks) for _, r, _, _ in batch)
        assert len(batch) == 1 or blocks <= max_blocks
        assert ids(batch) == sorted(ids(batch))  # either lane: in arrival order
        for conn, req, _, _ in batch:
            out.setdefault(conn, []).append(req.id)

    for i, (conn, kind, blocks, then_take) in enumerate(ops):
        push(q, conn, make[kind](i, blocks))
        pushed.setdefault(conn, []).append(i)
        if then_take:
            take()
    while q:
        take()
    assert out == pushed and q.nbytes == 0
