"""A stand-in for vLLM's `ZmqEventPublisher`, for tests and the bridge benchmark.

`encode_batch` hand-encodes events in the shapes vLLM versions have used (msgspec
structs as msgpack, see `sarpd.bridge.events`: all ``array_like``, or maps; fields
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

Test hooks: `publish(..., lost=True)` buffers a batch without sending it (a gap the
subscriber must replay); `restart()` starts the sequence again at 0 with an empty
buffer, as a restarted engine does; `replay` may be changed at any time.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgpack
import zmq

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


class Publisher:
    """PUB + ROUTER replay on 127.0.0.1 (random ports), a thread that serves both."""

    def __init__(self, topic: str = "", buffer_steps: int = 10_000,
                 replay: str = "topic") -> None:  # fmt: skip
        if replay not in REPLAY_MODES:
            raise ValueError(f"replay: {replay!r} is not one of {REPLAY_MODES}")
        self.topic = topic.encode()
        self.replay = replay
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.XPUB)
        self._pub.setsockopt(zmq.SNDHWM, 0)
        self._pub.setsockopt(zmq.XPUB_VERBOSE, 1)  # report every subscriber, not just the first
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.bind("tcp://127.0.0.1:*")
        self._router = self._ctx.socket(zmq.ROUTER)
        self._router.setsockopt(zmq.LINGER, 0)
        self._router.bind("tcp://127.0.0.1:*")
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
