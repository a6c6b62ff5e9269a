"""The stand-in for vLLM's ZmqEventPublisher (tools.bench.vllm_publisher): events
encoded as msgspec does (both encodings, defaults omitted; vLLM's current schema
through msgspec itself, tools.bench.vllm_schema), and the PUB + ROUTER replay
protocol as the bridge's docstring states it, in both framings."""

from __future__ import annotations

from collections.abc import Iterator

import msgpack
import pytest
import zmq
from click.testing import CliRunner

from sarpd.events.schema import BlockRemoved, BlockStored, ExtraKey, decode_batch
from tools.bench import vllm_schema as vs
from tools.bench.vllm_publisher import (
    END_SEQ,
    Publisher,
    cleared,
    demo_sequences,
    encode_batch,
    encode_event,
    removed,
    stored,
)
from tools.bench.vllm_publisher import main as demo_main


@pytest.fixture(params=["topic", "plain"])
def publisher(request: pytest.FixtureRequest) -> Iterator[Publisher]:
    pub = Publisher(topic="kv", replay=request.param)
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


def _replayed(dealer: zmq.Socket[bytes], start: int, n: int) -> list[list[bytes]]:
    dealer.send_multipart([b"", start.to_bytes(8, "big")])
    return [dealer.recv_multipart() for _ in range(n)]


def test_publish_lose_replay_and_restart(publisher: Publisher) -> None:
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv")
    sub.connect(publisher.endpoint)
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(publisher.replay_endpoint)
    # current vLLM: [b"", topic, seq, payload], end [b"", b"", -1, b""]; older: no topic
    head = [b"", b"kv"] if publisher.replay == "topic" else [b""]
    end = [b"", b"", END_SEQ, b""] if publisher.replay == "topic" else [b"", END_SEQ, b""]
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
        assert _replayed(dealer, 1, 3) == [[*head, (1).to_bytes(8, "big"), b"p1"],
                                           [*head, (2).to_bytes(8, "big"), b"p2"], end]
        assert publisher.replay_requests == [1]
        publisher.restart()
        publisher.publish(b"q0")
        publisher.flush()
        assert sub.recv_multipart() == [b"kv", (0).to_bytes(8, "big"), b"q0"]
        assert _replayed(dealer, 0, 2) == [[*head, (0).to_bytes(8, "big"), b"q0"], end]
        publisher.replay = "broken"  # neither framing, then a proper end
        assert _replayed(dealer, 0, 2) == [[b"", b"junk"], [b"", b"", END_SEQ, b""]]
        publisher.replay = "mute"
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        assert not dealer.poll(300)
        assert publisher.replay_requests == [1, 0, 0, 0]
    finally:
        sub.close(0)
        dealer.close(0)


def test_replay_mode_is_checked() -> None:
    with pytest.raises(ValueError, match="replay"):
        Publisher(replay="REQ")


def test_current_schema_encodes_as_vllm() -> None:
    """msgspec's own encoding of the current schema: the batch an array, its events
    tagged maps, defaults left out (event_version 1 too), typed extra keys."""
    st = vs.block_stored(
        [1, b"\x02" * 32], None, list(range(32)), lora_name="sql",
        extra_keys=[(vs.LoRAKey("sql"), vs.CacheSaltKey("t7")), (vs.LoRAKey("sql"),)],
        group_idx=0, locality=vs.LOCAL, ownership="fs0", session_id="s1",
        lookahead_token_ids=[16, 32],
    )  # fmt: skip
    rm = vs.block_removed([1], medium=vs.MEDIUM_STORAGE, locality=vs.REMOTE)
    raw = msgpack.unpackb(vs.encode_events([st, rm, vs.AllBlocksCleared()], ts=2.0, rank=3))
    assert raw[0] == 2.0 and raw[2] == 3 and len(raw) == 3
    ev, rem, clr = raw[1]
    assert ev["type"] == "BlockStored" and "event_version" not in ev
    assert ev["extra_keys"][0] == [{"type": "lora", "name": "sql"},
                                   {"type": "cache_salt", "salt": "t7"}]
    assert ev["block_hashes"] == [1, b"\x02" * 32] and ev["lora_id"] is None
    assert rem == {"type": "BlockRemoved", "block_hashes": [1], "medium": "STORAGE",
                   "locality": "REMOTE"}
    assert clr == {"type": "AllBlocksCleared"}
    # msgspec omits no defaults of an array_like struct: the rank slot is always there
    assert msgpack.unpackb(vs.encode_events([], ts=1.0, rank=None)) == [1.0, [], None]
    batch = decode_batch(vs.encode_events([st, rm], ts=2.0, rank=3))
    assert batch.data_parallel_rank == 3
    got = batch.events[0]
    assert isinstance(got, BlockStored)
    assert got.first_extra_keys == (ExtraKey("lora", "sql"), ExtraKey("cache_salt", "t7"))
    assert (got.locality, got.ownership, got.session_id, got.lookahead) == (
        "LOCAL", "fs0", "s1", 2)
    assert batch.events[1] == BlockRemoved((1,), "STORAGE", None, "REMOTE")


def test_demo_sequences_share_a_prefix_stored_once() -> None:
    """The first sequence stores every block from the root; the others only their
    own, after the shared prefix's last block; bytes hashes fold to the same ids."""
    seqs = list(demo_sequences(4, blocks=5, shared=2, seed=3))
    assert all(len(s.hashes) == 5 for s in seqs)
    assert len({s.hashes[:2] for s in seqs}) == 1 and len({s.hashes[2:] for s in seqs}) == 4
    first, *rest = seqs
    assert first.event is not None and first.event.parent_block_hash is None
    assert first.event.block_hashes == list(first.hashes) and first.line(0)["stored"] == list(
        first.hashes)  # fmt: skip
    for s in rest:
        assert s.event is not None and s.event.parent_block_hash == s.hashes[1]
        assert s.event.block_hashes == list(s.hashes[2:])
        assert len(s.event.token_ids) == 3 * 16 and s.event.block_size == 16
        assert s.line(7) == {"sequence": s.index, "batch": 7, "hashes": list(s.hashes),
                             "stored": list(s.hashes[2:])}  # fmt: skip
    as_bytes = list(demo_sequences(4, blocks=5, shared=2, seed=3, hash_type="bytes"))
    assert [s.hashes for s in as_bytes] == [s.hashes for s in seqs]
    ev = as_bytes[1].event
    assert ev is not None and all(isinstance(h, bytes) and len(h) == 32 for h in ev.block_hashes)
    # what the bridge decodes, and folds to the printed ids
    batch = decode_batch(vs.encode_events([ev]))
    got = batch.events[0]
    assert isinstance(got, BlockStored) and got.num_tokens == 48
    assert next(demo_sequences(4, blocks=5, shared=2, seed=4)).hashes != first.hashes


def test_demo_cli_help_and_bad_arguments() -> None:
    runner = CliRunner()
    res = runner.invoke(demo_main, ["--help"])
    assert res.exit_code == 0
    for opt in ("--endpoint", "--replay-endpoint", "--sequences", "--blocks",
                "--shared-blocks", "--block-size", "--interval", "--seed"):
        assert opt in res.output
    res = runner.invoke(demo_main, ["--blocks", "4", "--shared-blocks", "4"])
    assert res.exit_code == 2 and "'--shared-blocks': 4 is not below --blocks (4)" in res.output
    busy = Publisher()  # its PUB endpoint is taken
    try:
        res = runner.invoke(demo_main, ["--endpoint", busy.endpoint, "--no-wait"])
    finally:
        busy.close()
    want = f"--endpoint: {busy.endpoint!r}: cannot bind (Address already in use)\n"
    assert res.exit_code == 2 and want in res.output
    assert "Traceback" not in res.output
