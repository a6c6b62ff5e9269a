"""A stand-in for vLLM's `ZmqEventPublisher`: a demo feed, and for tests and the
bridge benchmark.

Run from a checkout, it is a demo feed that needs no GPU and no vLLM (docs/BRIDGE.md,
"Trying it without vLLM")::

    python -m tools.bench.vllm_publisher --sequences 5 --blocks 6 --shared-blocks 2

binds vLLM's PUB and replay ROUTER sockets, waits for a subscriber, publishes each
sequence as one `EventBatch` in vLLM's current schema (`tools.bench.vllm_schema`,
encoded by msgspec: a `BlockStored` of the blocks the "engine" had not cached yet,
after the cached prefix as parent) and prints one JSON line per sequence with the
block ids a client queries (``hashes``: every block of the sequence, as the 64-bit
ids sarpd indexes), then serves replays until interrupted. `demo_sequences` makes
the sequences (sans-I/O).

`encode_batch` hand-encodes events in the shapes vLLM versions have used (msgspec
structs as msgpack, see `sarpd.events.schema`: all ``array_like``, or maps; fields
missing at the end; unknown extra fields); `tools.bench.vllm_schema` encodes
vLLM's current schema with msgspec itself. `Publisher` serves payloads the way
vLLM does: a publishing thread sends ``(topic, seq as 8 bytes big-endian,
payload)`` on a PUB socket (an XPUB here, wire-compatible, so that callers can wait
for a subscriber: `subscribed` is set on each subscription; clear it before a new
subscriber) and keeps the last `buffer_steps` payloads for replay requests on a
ROUTER socket: ``[identity, b"", start_seq]`` in; out, per buffered batch and then
the end marker (seq -1, 8 bytes signed), as `replay` says:

- ``"topic"`` (current vLLM, the default): ``[identity, b"", topic, seq, payload]``
  and ``[identity, b"", b"", -1, b""]`` (a DEALER receives 4 frames);
- ``"plain"`` (older vLLM): ``[identity, b"", seq, payload]`` and
  ``[identity, b"", -1, b""]`` (3 frames);
- ``"mute"``: requests are taken and never answered (a replay that times out);
- ``"broken"``: each buffered batch as ``[identity, b"", b"junk"]`` (neither
  framing), then the end marker in the topic framing.

The `Publisher` binds 127.0.0.1 on random ports unless told otherwise. Test hooks:
`publish(..., lost=True)` buffers a batch without sending it (a gap the subscriber
must replay); `restart()` starts the sequence again at 0 with an empty
buffer, as a restarted engine does; `replay` may be changed at any time.
"""

from __future__ import annotations

import hashlib
import json
import queue
import random
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any

import click
import msgpack
import zmq

from tools.bench import vllm_schema as vs

END_SEQ = (-1).to_bytes(8, "big", signed=True)
REPLAY_MODES = ("topic", "plain", "mute", "broken")

# vLLM's field order (array_like encoding); the tag comes first.
STORED_ORDER = (
    "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
    "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
)  # fmt: skip
REMOVED_ORDER = ("block_hashes", "medium", "group_idx")
ORDERS = {"BlockStored": STORED_ORDER, "BlockRemoved": REMOVED_ORDER, "AllBlocksCleared": ()}
# how many leading fields have no default (always encoded)
REQUIRED = {"BlockStored": 7, "BlockRemoved": 2, "AllBlocksCleared": 0}


def stored(
    block_hashes: Sequence[bytes | int],
    parent: bytes | int | None,
    token_ids: Sequence[int],
    block_size: int = 16,
    *,
    medium: str | None = "GPU",
    lora_name: str | None = None,
    extra_keys: list[Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A BlockStored event as a dict of vLLM field names (plus any `extra` fields)."""
    return {
        "type": "BlockStored",
        "block_hashes": list(block_hashes),
        "parent_block_hash": parent,
        "token_ids": list(token_ids),
        "block_size": block_size,
        "lora_id": None,
        "medium": medium,
        "lora_name": lora_name,
        "extra_keys": extra_keys,
        **extra,
    }


def removed(block_hashes: Sequence[bytes | int], medium: str | None = "GPU") -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": list(block_hashes), "medium": medium}


def cleared() -> dict[str, Any]:
    return {"type": "AllBlocksCleared"}


def encode_event(event: dict[str, Any], array_like: bool) -> Any:
    """One event as msgspec encodes it with ``omit_defaults``: fields with a default
    (None) are left out when None, fields without one are always sent. As an array:
    ``[tag, *fields]`` in vLLM's order, trailing defaults dropped, unknown extra
    fields after them; as a map: the fields and ``type``."""
    tag = event["type"]
    order = ORDERS.get(tag, ())
    n_required = REQUIRED.get(tag, 0)
    required = set(order[:n_required])
    if not array_like:
        return {k: v for k, v in event.items() if v is not None or k in required}
    values = [event.get(k) for k in order]
    extra = [v for k, v in event.items() if k not in order and k != "type"]
    if not extra:
        while len(values) > n_required and values[-1] is None:
            values.pop()
    return [tag, *values, *extra]


def encode_batch(
    events: Sequence[dict[str, Any]], *, array_like: bool = True, ts: float | None = None,
    rank: int | None = None,
) -> bytes:  # fmt: skip
    """An EventBatch payload."""
    ts = time.time() if ts is None else ts
    evs = [encode_event(e, array_like) for e in events]
    if array_like:
        body: Any = [ts, evs] if rank is None else [ts, evs, rank]
    else:
        body = {"ts": ts, "events": evs}
        if rank is not None:
            body["data_parallel_rank"] = rank
    return bytes(msgpack.packb(body, use_bin_type=True))


@dataclass(frozen=True, slots=True)
class _Out:
    payload: bytes
    lost: bool


class BindError(ValueError):
    """A socket could not bind: `option` names the endpoint's option."""

    def __init__(self, option: str, endpoint: str, reason: str) -> None:
        super().__init__(f"{option} {endpoint!r}: cannot bind ({reason})")
        self.option = option


class Publisher:
    """PUB + ROUTER replay (127.0.0.1, random ports by default), a thread that serves
    both."""

    def __init__(self, topic: str = "", buffer_steps: int = 10_000, replay: str = "topic",
                 endpoint: str = "tcp://127.0.0.1:*",
                 replay_endpoint: str = "tcp://127.0.0.1:*") -> None:  # fmt: skip
        if replay not in REPLAY_MODES:
            raise ValueError(f"replay: {replay!r} is not one of {REPLAY_MODES}")
        self.topic = topic.encode()
        self.replay = replay
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.XPUB)
        self._pub.setsockopt(zmq.SNDHWM, 0)
        self._pub.setsockopt(zmq.XPUB_VERBOSE, 1)  # report every subscriber, not just the first
        self._pub.setsockopt(zmq.LINGER, 0)
        self._router = self._ctx.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 0)
        for sock, ep, option in ((self._pub, endpoint, "--endpoint"),
                                 (self._router, replay_endpoint, "--replay-endpoint")):
            try:
                sock.bind(ep)
            except zmq.ZMQError as exc:
                self._ctx.destroy(linger=0)
                raise BindError(option, ep, zmq.strerror(exc.errno or 0)) from exc
        self.endpoint = self._pub.getsockopt_string(zmq.LAST_ENDPOINT)
        self.replay_endpoint = self._router.getsockopt_string(zmq.LAST_ENDPOINT)
        self._queue: queue.Queue[_Out | str | None] = queue.Queue()
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._seq = 0
        self.replay_requests: list[int] = []
        self.subscribed = threading.Event()
        self._idle = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="vllm-publisher", daemon=True)
        self._thread.start()

    @property
    def next_seq(self) -> int:
        """Sequence number of the next batch (valid once `flush()` returned)."""
        return self._seq

    def publish(self, payload: bytes, lost: bool = False) -> None:
        self._queue.put(_Out(payload, lost))

    def restart(self) -> None:
        """As a restarted engine: sequence from 0 again, empty replay buffer."""
        self._queue.put("restart")

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until everything queued so far was sent."""
        self._idle.clear()
        self._queue.put("flush")
        if not self._idle.wait(timeout):
            raise TimeoutError("publisher did not flush")

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(10)
        self._pub.close(0)
        self._router.close(0)
        self._ctx.term()

    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self._pub, zmq.POLLIN)
        poller.register(self._router, zmq.POLLIN)
        while True:
            for sock, _ in poller.poll(0):
                if sock is self._pub:
                    msg = self._pub.recv()
                    if msg[:1] == b"\x01":
                        self.subscribed.set()
                else:
                    self._serve_replay()
            try:
                item = self._queue.get(timeout=0.005)
            except queue.Empty:
                continue
            if item is None:
                return
            if item == "restart":
                self._seq = 0
                self._buffer.clear()
            elif item == "flush":
                self._idle.set()
            elif isinstance(item, _Out):
                seq = self._seq
                self._seq += 1
                self._buffer.append((seq, item.payload))
                if not item.lost:
                    self._pub.send_multipart((self.topic, seq.to_bytes(8, "big"), item.payload))

    def _serve_replay(self) -> None:
        frames = self._router.recv_multipart()
        if len(frames) != 3:
            return
        ident, _, start_b = frames
        start = int.from_bytes(start_b, "big")
        self.replay_requests.append(start)
        mode = self.replay
        if mode == "mute":
            return
        for seq, payload in self._buffer:
            if seq < start:
                continue
            seq_b = seq.to_bytes(8, "big")
            if mode == "topic":
                self._router.send_multipart((ident, b"", self.topic, seq_b, payload))
            elif mode == "plain":
                self._router.send_multipart((ident, b"", seq_b, payload))
            else:
                self._router.send_multipart((ident, b"", b"junk"))
        if mode == "plain":
            self._router.send_multipart((ident, b"", END_SEQ, b""))
        else:
            self._router.send_multipart((ident, b"", b"", END_SEQ, b""))


# ---------------------------------------------------------------------- the demo feed

MASK64 = (1 << 64) - 1


@dataclass(frozen=True, slots=True)
class DemoSequence:
    """One demo sequence: its block ids (as sarpd indexes them) and the event that
    stored those the engine had not cached yet (None: it had them all)."""

    index: int
    hashes: tuple[int, ...]
    event: vs.BlockStored | None

    def line(self, batch: int | None) -> dict[str, Any]:
        stored = len(self.event.block_hashes) if self.event is not None else 0
        return {"sequence": self.index, "batch": batch, "hashes": list(self.hashes),
                "stored": list(self.hashes[len(self.hashes) - stored:])}  # fmt: skip


def demo_sequences(count: int, blocks: int, shared: int, block_size: int = 16, seed: int = 0,
                   hash_type: str = "int") -> Iterator[DemoSequence]:  # fmt: skip
    """`count` sequences of `blocks` blocks of `block_size` random tokens, the first
    `shared` blocks the same in all (a shared system prompt). Block hashes chain
    sha256 over the parent's digest and the block's tokens, as vLLM's do in spirit;
    an int hash (`hash_type` "int", vLLM's default) is the digest's last 8 bytes, the
    id the bridge folds a bytes hash to, so ``hashes`` are sarpd's ids either way."""
    rng = random.Random(seed)
    prefix = [rng.randrange(32_000) for _ in range(shared * block_size)]
    cached: set[bytes] = set()
    for i in range(count):
        tokens = prefix + [rng.randrange(32_000) for _ in range((blocks - shared) * block_size)]
        digests, parent = [], hashlib.sha256(seed.to_bytes(8, "big", signed=True)).digest()
        for b in range(blocks):
            chunk = tokens[b * block_size : (b + 1) * block_size]
            parent = hashlib.sha256(parent + repr(chunk).encode()).digest()
            digests.append(parent)
        ids = tuple(int.from_bytes(d, "big") & MASK64 for d in digests)
        wire: list[bytes | int] = list(ids) if hash_type == "int" else list(digests)
        k = next((b for b, d in enumerate(digests) if d not in cached), blocks)
        cached.update(digests)
        event = None
        if k < blocks:
            event = vs.block_stored(wire[k:], wire[k - 1] if k else None,
                                    tokens[k * block_size :], block_size)  # fmt: skip
        yield DemoSequence(i, ids, event)


class _Stop(Exception):
    pass


def _stop(_sig: int, _frame: FrameType | None) -> None:
    raise _Stop


def _shared_below_blocks(ctx: click.Context, _p: click.Parameter, value: int) -> int:
    if value >= ctx.params.get("blocks", value + 1):
        raise click.BadParameter(f"{value} is not below --blocks ({ctx.params['blocks']}): "
                                 "each sequence needs a block of its own")
    return value


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--endpoint", default="tcp://127.0.0.1:5557", show_default=True,
              help="PUB socket to bind (vLLM's kv_events_config.endpoint); the bridge's "
              "--endpoint connects to it (tcp://*:5557 to listen on every interface).")
@click.option("--replay-endpoint", default="tcp://127.0.0.1:5558", show_default=True,
              help="ROUTER replay socket to bind (vLLM's replay_endpoint); the bridge's "
              "--replay.")
@click.option("--topic", default="", show_default=True, help="ZMQ topic of every message.")
@click.option("--sequences", type=click.IntRange(1), default=10, show_default=True,
              help="How many sequences (prompts) to publish, one EventBatch each.")
@click.option("--blocks", type=click.IntRange(1), default=8, show_default=True, is_eager=True,
              help="Blocks per sequence.")
@click.option("--shared-blocks", type=click.IntRange(0), default=4, show_default=True,
              callback=_shared_below_blocks,
              help="Leading blocks every sequence shares (a system prompt): published "
              "once, by the first sequence; the others store only their own blocks, "
              "with the shared prefix's last block as parent.")
@click.option("--block-size", type=click.IntRange(1), default=16, show_default=True,
              help="Tokens per block (vLLM's --block-size).")
@click.option("--interval", type=click.FloatRange(0), default=0.5, show_default=True,
              help="Seconds between two sequences.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of the random tokens (the same seed, the same hashes).")
@click.option("--hash-type", type=click.Choice(["int", "bytes"]), default="int",
              show_default=True, help="Block hashes on the wire: 64-bit ints (vLLM's "
              "default) or 32-byte sha256 digests (the bridge folds them to the same ids).")
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Wait for a subscriber before publishing (without it, a bridge started "
              "later catches up through the replay socket).")
@click.option("--linger", type=click.FloatRange(0), default=None,
              help="Seconds to keep serving replays after the last sequence, then exit "
              "[default: until interrupted].")
def main(endpoint: str, replay_endpoint: str, topic: str, sequences: int, blocks: int,
         shared_blocks: int, block_size: int, interval: float, seed: int, hash_type: str,
         wait: bool, linger: float | None) -> None:  # fmt: skip
    """A demo vLLM KV-event feed: no GPU, no vLLM.

    Publishes --sequences sequences of --blocks blocks each in vLLM's current KV-event
    schema (msgspec EventBatch [ts, events, rank], tagged BlockStored maps) on a PUB
    socket, with vLLM's replay ROUTER socket, and prints one JSON line per sequence:
    `batch` (its sequence number on the wire), `hashes` (the ids of all its blocks,
    as sarpd indexes them: what `sarpctl match --hashes` takes) and `stored` (those
    this batch stored; the shared prefix is stored once). Feed it to sarpd with
    `sarpctl bridge vllm --endpoint tcp://127.0.0.1:5557 --replay
    tcp://127.0.0.1:5558` (docs/BRIDGE.md, "Trying it without vLLM").
    """
    try:
        pub = Publisher(topic=topic, endpoint=endpoint, replay_endpoint=replay_endpoint)
    except BindError as exc:
        raise click.BadParameter(str(exc).removeprefix(f"{exc.option} "),
                                 param_hint=exc.option) from exc
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        _feed(pub, demo_sequences(sequences, blocks, shared_blocks, block_size, seed,
                                  hash_type), wait, interval, linger)  # fmt: skip
    except (_Stop, KeyboardInterrupt):
        pass
    finally:
        pub.close()


def _say(msg: str) -> None:
    click.echo(f"vllm_publisher: {msg}", err=True)


def _feed(pub: Publisher, seqs: Iterator[DemoSequence], wait: bool, interval: float,
          linger: float | None) -> None:  # fmt: skip
    _say(f"PUB {pub.endpoint}, replay ROUTER {pub.replay_endpoint}")
    if wait:
        _say("waiting for a subscriber (sarpctl bridge vllm --endpoint ... --replay ...)")
        while not pub.subscribed.wait(0.2):
            pass
    n = 0
    for n, s in enumerate(seqs, 1):
        if n > 1:
            time.sleep(interval)
        batch = None
        if s.event is not None:
            pub.publish(vs.encode_events([s.event]))
            pub.flush()
            batch = pub.next_seq - 1
        click.echo(json.dumps(s.line(batch)))
        sys.stdout.flush()
    _say(f"published {n} sequences; serving replays "
         + ("until interrupted (Ctrl-C)" if linger is None else f"for {linger:g} s"))
    deadline = float("inf") if linger is None else time.monotonic() + linger
    while time.monotonic() < deadline:
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))


if __name__ == "__main__":
    main()
