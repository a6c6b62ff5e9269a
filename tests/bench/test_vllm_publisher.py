"""The stand-in for vLLM's ZmqEventPublisher (tools.bench.vllm_publisher): events
encoded as msgspec does (both encodings, defaults omitted), and the PUB + ROUTER
replay protocol as the bridge's docstring states it."""

from __future__ import annotations

from collections.abc import Iterator

import msgpack
import pytest
import zmq

from sarpd.bridge.events import BlockRemoved, BlockStored, decode_batch
from tools.bench.vllm_publisher import (
    END_SEQ,
    Publisher,
    cleared,
    encode_batch,
    encode_event,
    removed,
    stored,
)


@pytest.fixture
def publisher() -> Iterator[Publisher]:
    pub = Publisher(topic="kv")
    yield pub
    pub.close()


def test_array_encoding_drops_trailing_defaults_only() -> None:
    ev = stored([1, 2], None, list(range(32)))
    arr = encode_event(ev, array_like=True)
    # the first 7 fields (to lora_name) have no default in vLLM: always sent
    assert arr == ["BlockStored", [1, 2], None, list(range(32)), 16, None, "GPU", None]
    assert encode_event(removed([3], medium=None), array_like=True) == ["BlockRemoved", [3], None]
    assert encode_event(cleared(), array_like=True) == ["AllBlocksCleared"]
    extra = encode_event(stored([1], 9, [], group_idx=2, future=1), array_like=True)
    assert extra[-4:] == [2, None, None, 1]  # extra fields after all of vLLM's


def test_map_encoding_omits_none_defaults() -> None:
    m = encode_event(stored([1], None, [0] * 16, lora_name="sql"), array_like=False)
    assert m["type"] == "BlockStored" and m["lora_name"] == "sql"
    assert "parent_block_hash" in m and "extra_keys" not in m  # required vs defaulted


@pytest.mark.parametrize("array_like", [True, False])
def test_batches_decode_as_the_bridge_reads_them(array_like: bool) -> None:
    payload = encode_batch([stored([5, 6], 4, [0] * 32), removed([5])],
                           array_like=array_like, ts=3.5, rank=1)
    batch = decode_batch(payload)
    assert batch.ts == 3.5 and batch.data_parallel_rank == 1
    assert batch.events == (BlockStored((5, 6), 4, 16, "GPU", num_tokens=32),
                            BlockRemoved((5,), "GPU"))
    assert msgpack.unpackb(encode_batch([], ts=1.0)) == [1.0, []]


def test_publish_lose_replay_and_restart(publisher: Publisher) -> None:
    ctx = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    sub.connect(publisher.endpoint)
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(publisher.replay_endpoint)
    try:
        assert publisher.subscribed.wait(10)
        publisher.publish(b"p0")
        publisher.publish(b"p1", lost=True)  # buffered, not sent
        publisher.publish(b"p2")
        publisher.flush()
        assert publisher.next_seq == 3
        got = [sub.recv_multipart() for _ in range(2)]
        assert got == [[b"kv", (0).to_bytes(8, "big"), b"p0"],
                       [b"kv", (2).to_bytes(8, "big"), b"p2"]]
        dealer.send_multipart([b"", (1).to_bytes(8, "big")])
        replayed = [dealer.recv_multipart() for _ in range(3)]
        assert replayed == [[b"", (1).to_bytes(8, "big"), b"p1"],
                            [b"", (2).to_bytes(8, "big"), b"p2"], [b"", END_SEQ, b""]]
        assert publisher.replay_requests == [1]
        publisher.restart()
        publisher.publish(b"q0")
        publisher.flush()
        assert sub.recv_multipart() == [b"kv", (0).to_bytes(8, "big"), b"q0"]
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        assert dealer.recv_multipart()[2] == b"q0"  # the old buffer is gone
        assert dealer.recv_multipart()[1] == END_SEQ
    finally:
        sub.close(0)
        dealer.close(0)
