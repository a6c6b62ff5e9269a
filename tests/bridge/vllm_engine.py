"""A brute-force model of a vLLM engine's prefix cache, and a bridge run in a thread.

`FakeEngine` hashes 16-token blocks as vLLM does in spirit (sha256 chained over the
parent digest, the block's tokens and its extra keys: LoRA name on every block, the
cache salt on block 0), keeps an LRU set of cached block hashes with a capacity,
and turns each request into the events vLLM would publish: `BlockRemoved` for the
blocks it evicts, then `BlockStored` for the blocks it computes (from the first
block not cached on, after the cached prefix as parent). `expected()` is the truth:
how many leading blocks of a sequence the engine has cached.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from sarpd.bridge.vllm import BridgeConfig, VllmBridge
from tools.bench.vllm_publisher import cleared, removed, stored

MASK64 = (1 << 64) - 1
BLOCK = 16


def as_u64(h: bytes) -> int:
    """The documented id mapping of a digest (vLLM's own int form)."""
    return int.from_bytes(h, "big") & MASK64


@dataclass(frozen=True)
class Req:
    tokens: tuple[int, ...]
    lora: str | None = None
    salt: str | None = None

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
    cache: OrderedDict[bytes, None] = field(default_factory=OrderedDict)
    evictions: int = 0

    def hashes(self, req: Req) -> list[bytes]:
        parent = hashlib.sha256(self.seed).digest()
        out = []
        for i in range(len(req.tokens) // BLOCK):
            extra = self._extra(req, i)
            block = req.tokens[i * BLOCK : (i + 1) * BLOCK]
            parent = hashlib.sha256(parent + repr((block, extra)).encode()).digest()
            out.append(parent)
        return out

    @staticmethod
    def _extra(req: Req, i: int) -> list[str] | None:
        keys = [req.lora] if req.lora else []
        if i == 0 and req.salt:
            keys.append(req.salt)
        return keys or None

    def ext(self, h: bytes) -> bytes | int:
        return as_u64(h) if self.int_hashes else h

    def request(self, req: Req) -> list[dict[str, Any]]:
        """Serve one request: the events it causes, in order."""
        hs = self.hashes(req)
        hit = 0
        while hit < len(hs) and hs[hit] in self.cache:
            hit += 1
        events: list[dict[str, Any]] = []
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
            events.append(removed([self.ext(h) for h in victims]))
        if hit < len(hs):
            extra = [self._extra(req, i) for i in range(hit, len(hs))]
            events.append(
                stored(
                    [self.ext(h) for h in hs[hit:]],
                    self.ext(hs[hit - 1]) if hit else None,
                    req.tokens[hit * BLOCK : len(hs) * BLOCK],
                    lora_name=req.lora,
                    extra_keys=extra if any(extra) else None,
                    group_idx=0,
                )
            )
        for h in hs:
            self.cache[h] = None
            self.cache.move_to_end(h)
        return events

    def reset(self) -> list[dict[str, Any]]:
        self.cache.clear()
        return [cleared()]

    def expected(self, req: Req) -> int:
        n = 0
        for h in self.hashes(req):
            if h not in self.cache:
                break
            n += 1
        return n


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
