"""A brute-force model of a vLLM engine's prefix cache, a bridge run in a thread, and
the helpers the bridge's end-to-end tests share.

`FakeEngine` hashes 16-token blocks as vLLM does in spirit (sha256 chained over the
parent digest, the block's tokens and its extra keys: LoRA name on every block, the
cache salt on block 0; with `lookahead`, EAGLE-style successor-aware hashing: a
block's hash also covers the token after it, so a block is stored only once that
token exists), keeps an LRU set of cached block hashes with a capacity, and turns
each request into the events vLLM would publish: `BlockRemoved` for the blocks it
evicts, then `BlockStored` for the blocks it computes (from the first block not
cached on, after the cached prefix as parent). With ``schema="current"`` the events
are vLLM's msgspec structs (`tools.bench.vllm_schema`: typed per-block extra keys,
session ids, lookahead tokens; `payload` encodes them with the engine's
data-parallel rank), else the hand-made dicts of `tools.bench.vllm_publisher`.
`expected()` is the truth: how many leading blocks of a sequence the engine has
cached; `hashes()` is also what a router computes.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sarpd.bridge.vllm import BridgeConfig, VllmBridge
from sarpd.client import SyncClient
from tests.daemon_helpers import SarpdProc
from tools.bench import vllm_schema as vs
from tools.bench.vllm_publisher import Publisher, cleared, encode_batch, removed, stored

MASK64 = (1 << 64) - 1
BLOCK = 16
WORKER = 3
GPU_META = WORKER << 48  # tier 0 = GPU


def as_u64(h: bytes) -> int:
    """The documented id mapping of a digest (vLLM's own int form)."""
    return int.from_bytes(h, "big") & MASK64


@dataclass(frozen=True)
class Req:
    tokens: tuple[int, ...]
    lora: str | None = None
    salt: str | None = None
    session: str | None = None  # vLLM's session_id: names the request, hashes nothing

    def ns(self, base: str = "") -> str:
        parts = [p for p in (base, self.lora and f"lora={self.lora}") if p]
        if self.salt:
            parts.append(f"salt={self.salt}")
        return "/".join(parts)


@dataclass
class FakeEngine:
    capacity: int
    int_hashes: bool = False
    seed: bytes = b"PYTHONHASHSEED=0"
    schema: str = "dict"  # "dict": hand-made events; "current": vLLM's msgspec structs
    lookahead: bool = False  # successor-aware hashes (module doc)
    rank: int | None = None  # data-parallel rank stamped on current-schema batches
    cache: OrderedDict[bytes, None] = field(default_factory=OrderedDict)
    evictions: int = 0

    def hashes(self, req: Req) -> list[bytes]:
        """The chain of block hashes, as the engine and a router compute it."""
        parent = hashlib.sha256(self.seed).digest()
        out = []
        for i in range(self._blocks(req)):
            extra = self._extra(req, i)
            block = req.tokens[i * BLOCK : (i + 1) * BLOCK + self.lookahead]
            parent = hashlib.sha256(parent + repr((block, extra)).encode()).digest()
            out.append(parent)
        return out

    def _blocks(self, req: Req) -> int:
        """Whole blocks that can be hashed (with lookahead: whose successor exists)."""
        return (len(req.tokens) - self.lookahead) // BLOCK

    @staticmethod
    def _extra(req: Req, i: int) -> list[str] | None:
        keys = [req.lora] if req.lora else []
        if i == 0 and req.salt:
            keys.append(req.salt)
        return keys or None

    def ext(self, h: bytes) -> bytes | int:
        return as_u64(h) if self.int_hashes else h

    def request(self, req: Req) -> list[Any]:
        """Serve one request: the events it causes, in order."""
        hs = self.hashes(req)
        hit = 0
        while hit < len(hs) and hs[hit] in self.cache:
            hit += 1
        events: list[Any] = []
        need = sum(1 for h in hs[hit:] if h not in self.cache)
        protected = set(hs)
        victims = []
        for h in list(self.cache):
            if len(self.cache) - len(victims) + need <= self.capacity:
                break
            if h not in protected:
                victims.append(h)
        for h in victims:
            del self.cache[h]
        self.evictions += len(victims)
        if victims:
            events.append(self._removed([self.ext(h) for h in victims]))
        if hit < len(hs):
            events.append(self._stored(req, hs, hit))
        for h in hs:
            self.cache[h] = None
            self.cache.move_to_end(h)
        return events

    def _removed(self, hashes: list[bytes | int]) -> Any:
        return vs.block_removed(hashes) if self.schema == "current" else removed(hashes)

    def _stored(self, req: Req, hs: list[bytes], hit: int) -> Any:
        args = ([self.ext(h) for h in hs[hit:]], self.ext(hs[hit - 1]) if hit else None,
                req.tokens[hit * BLOCK : len(hs) * BLOCK])  # fmt: skip
        if self.schema != "current":
            extra = [self._extra(req, i) for i in range(hit, len(hs))]
            return stored(*args, lora_name=req.lora, extra_keys=extra if any(extra) else None,
                          group_idx=0)  # fmt: skip
        typed = [self._typed_extra(req, i) for i in range(hit, len(hs))]
        ahead = None
        if self.lookahead:  # the token after each block, which its hash covers
            ahead = [req.tokens[(i + 1) * BLOCK] for i in range(hit, len(hs))]
        return vs.block_stored(
            *args, lora_name=req.lora, extra_keys=typed if any(typed) else None, group_idx=0,
            session_id=req.session, lookahead_token_ids=ahead,
        )  # fmt: skip

    @staticmethod
    def _typed_extra(req: Req, i: int) -> tuple[vs.ExtraKey, ...] | None:
        keys: list[vs.ExtraKey] = [vs.LoRAKey(req.lora)] if req.lora else []
        if i == 0 and req.salt:
            keys.append(vs.CacheSaltKey(req.salt))
        return tuple(keys) or None

    def payload(self, events: Sequence[Any], array_like: bool = True) -> bytes:
        """One EventBatch as this engine's vLLM version encodes it."""
        if self.schema == "current":
            return vs.encode_events(events, rank=self.rank)
        return encode_batch(events, array_like=array_like)

    def reset(self) -> list[Any]:
        self.cache.clear()
        return [vs.AllBlocksCleared()] if self.schema == "current" else [cleared()]

    def expected(self, req: Req) -> int:
        n = 0
        for h in self.hashes(req):
            if h not in self.cache:
                break
            n += 1
        return n


class Workload:
    """Conversations over a few shared system prompts, some under a LoRA adapter or
    a cache salt; each turn extends the previous one (continuations). Each
    conversation is a session (`Req.session`)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.prompts = [
            tuple(self.rng.randrange(50_000) for _ in range(16 * self.rng.randint(2, 5)))
            for _ in range(4)
        ]
        self.convs: list[Req] = []
        self.seen: list[Req] = []

    def next(self) -> Req:
        rng = self.rng
        if not self.convs or rng.random() < 0.3:
            lora = "sql" if rng.random() < 0.25 else None
            salt = "tenant7" if rng.random() < 0.2 else None
            base = Req(rng.choice(self.prompts), lora, salt, f"s{len(self.convs)}")
            self.convs.append(base)
        i = rng.randrange(len(self.convs))
        conv = self.convs[i]
        turn = tuple(rng.randrange(50_000) for _ in range(rng.randint(8, 60)))
        req = Req(conv.tokens + turn, conv.lora, conv.salt, conv.session)
        self.convs[i] = req
        self.seen.append(req)
        return req


def publish_requests(
    pub: Publisher, engine: FakeEngine, wl: Workload, n: int, *, array_like: bool = True,
    lose_every: int = 0,
) -> None:  # fmt: skip
    for k in range(n):
        events = engine.request(wl.next())
        if wl.rng.random() < 0.3:  # two requests in one scheduler step
            events += engine.request(wl.next())
        lost = bool(lose_every) and k % lose_every == lose_every - 1 and k != n - 1
        pub.publish(engine.payload(events, array_like), lost=lost)


def check_index(sarpd: SarpdProc, engine: FakeEngine, reqs: list[Req], base: str = "",
                meta: int = GPU_META) -> int:  # fmt: skip
    """Every sequence matches exactly as far as the engine has it cached, hashed as a
    router does (`FakeEngine.hashes`); returns how many blocks that was in total."""
    total = 0
    with SyncClient(sarpd.socket) as c:
        for req in reqs:
            want = engine.expected(req)
            ids = [as_u64(h) for h in engine.hashes(req)]
            got = c.match(hashes=ids, ns=req.ns(base))
            assert got["blocks"] == want, (req.ns(base), len(ids), got["blocks"], want)
            assert got["meta"] == [meta] * want
            total += want
    return total


def bridge_cfg(pub: Publisher, sarpd: SarpdProc, state: Path, **kw: Any) -> BridgeConfig:
    fields: dict[str, Any] = {
        "endpoint": pub.endpoint,
        "replay": pub.replay_endpoint,
        "socket": str(sarpd.socket),
        "worker": WORKER,
        "state": state,
    }
    return BridgeConfig(**{**fields, **kw})


def start_bridge(cfg: BridgeConfig, pub: Publisher) -> BridgeThread:
    bt = BridgeThread(cfg).start()
    assert pub.subscribed.wait(10), "the bridge never subscribed"
    time.sleep(0.05)  # the subscription reaches the PUB socket's filter
    return bt


class BridgeThread:
    """A `VllmBridge` on its own event loop in a thread."""

    def __init__(self, cfg: BridgeConfig) -> None:
        self.cfg = cfg
        self.bridge: VllmBridge | None = None
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=self._main, daemon=True)

    def start(self, timeout: float = 30.0) -> BridgeThread:
        self._thread.start()
        if not self.ready.wait(timeout):
            raise TimeoutError(f"bridge not ready: {self.error!r}")
        return self

    def _main(self) -> None:
        async def go() -> None:
            self._loop = asyncio.get_running_loop()
            self.bridge = VllmBridge(self.cfg)
            await self.bridge.run(on_ready=self.ready.set)

        try:
            asyncio.run(go())
        except BaseException as exc:
            self.error = exc
            self.ready.set()

    def stop(self) -> None:
        if self._loop is not None and self.bridge is not None:
            self._loop.call_soon_threadsafe(self.bridge.stop)
        self._thread.join(30)
        assert not self._thread.is_alive(), "bridge did not stop"
        if self.error is not None:
            raise self.error

    def wait_seq(self, seq: int, timeout: float = 60.0) -> None:
        """Wait until batch `seq` is applied (acknowledged by sarpd)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.error is not None:
                raise self.error
            assert self.bridge is not None
            if self.bridge.stats.last_seq == seq and self.bridge.applied == seq:
                return
            time.sleep(0.01)
        assert self.bridge is not None
        raise TimeoutError(f"bridge at {self.bridge.stats.line()}, waiting for {seq}")
