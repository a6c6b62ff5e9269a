"""The vLLM KV-events bridge: ZMQ SUB (+ replay) -> `Translator` -> sarpd (asyncio).

vLLM's `ZmqEventPublisher` sends each `EventBatch` as three frames (topic, 8-byte
big-endian sequence number, msgpack payload) on a PUB socket, and keeps its last
batches for a ROUTER replay socket: a DEALER sends ``[b"", start_seq (8 B BE)]`` and
receives, for every buffered batch from ``start_seq`` on, ``[b"", topic, seq,
payload]``, then ``[b"", b"", -1 (8 B BE, signed), b""]`` (current vLLM); older
versions leave the topic out: ``[b"", seq, payload]`` and ``[b"", -1, b""]``. Both
framings are accepted (`decode_replay`); a reply of neither is counted
(`replay_malformed`) and skipped.

Sequence rules (``last`` = the newest batch taken; the engine counts from 0):
- ``seq == last + 1``: apply. At start-up, with a replay socket, the bridge first
  asks for everything after its saved position (or from 0 on a fresh start).
- ``seq > last + 1``, or a first batch other than 0: a gap; replay from ``last + 1``
  (from 0) when a replay socket is given. What the replay cannot fill (the engine's
  buffer moved on, or it did not answer in `replay_timeout_s`) is counted as
  dropped, reason ``unreplayed`` (``no_replay`` without a replay socket): batches
  are never lost uncounted, also those an engine sent before its bridge started.
- ``seq <= last``: a duplicate of a batch just replayed, or else the engine
  restarted (its counter starts at 0 again): clear this worker's blocks, replay the
  new engine's buffer from 0, continue.

Requests go out pipelined on one sarpd connection (sarpd applies one connection's
requests in order), at most `max_inflight` at a time. `busy`, `unavailable` or a
lost connection stop the run at the first such request: the bridge backs off,
reconnects if needed and re-sends from that request on. Re-applying requests sarpd
already applied is harmless (inserting an indexed block or removing an absent one
changes nothing) with one exception, an insert whose parent a later request
removed; `_window_end` never puts such a pair in flight together. The position
advances only past batches whose every request was acknowledged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.asyncio
from msgspec.structs import replace as dc_replace

from sarpd.bridge.coalesce import Mark as _Mark
from sarpd.bridge.coalesce import Req as _Req
from sarpd.bridge.coalesce import coalesce, split_all, split_first
from sarpd.bridge.peers import PublisherWatch, SarpdWatch, connect
from sarpd.bridge.pipe import request_of
from sarpd.bridge.state import StateFile
from sarpd.bridge.stats import BridgeStats, serve_metrics
from sarpd.client import Client, SarpConnectionError
from sarpd.errors import (
    Busy,
    ConfigError,
    SarpError,
    TooLarge,
    Unavailable,
    UnknownOp,
    UnknownParent,
)
from sarpd.events.endpoints import check_endpoint
from sarpd.events.mapping import CANARY_NS, CanaryOp, ClearOp, InsertOp, Op, RemoveOp, Translator
from sarpd.events.schema import EventDecodeError, decode_batch, decode_replay, decode_seq
from sarpd.events.sequence import Stream

__all__ = ["RETRYABLE", "BridgeConfig", "Stopped", "VllmBridge", "serve"]

log = logging.getLogger("sarpd.bridge")
RETRYABLE = (Busy, Unavailable, SarpConnectionError, OSError)


@dataclass(frozen=True, slots=True)
class BridgeConfig:
    endpoint: str  # vLLM's PUB endpoint, e.g. tcp://10.0.0.5:5557
    socket: str  # sarpd's Unix socket
    worker: int = 0
    replay: str | None = None  # vLLM's ROUTER replay endpoint, e.g. tcp://10.0.0.5:5558
    topic: str = ""
    ns: str = ""  # namespace template: {worker}, {medium}
    group: int = 0  # the KV-cache group whose events are indexed
    block_size: int = 0  # the engine's KV-cache block size (partial stores); 0: learn it
    state: Path | None = None  # position file
    max_inflight: int = 4096  # requests in flight to sarpd
    max_batches: int = 512  # event batches taken per round
    replay_timeout_s: float = 5.0
    save_interval_s: float = 0.5
    max_backoff_s: float = 2.0  # pause after `busy`: 20 ms doubling to this
    connect_backoff_s: float = 0.1  # sarpd unreachable: retry after this, doubling
    max_connect_backoff_s: float = 5.0  # ... to this
    warn_every_s: float = 30.0  # a peer that stays down: a warning at most this often
    publisher_grace_s: float = 3.0  # no ZMQ connection to the publisher this long: warn
    silence_warn_s: float = 60.0  # connected, no message this long: say it once; 0: never
    report_interval_s: float = 5.0  # counters reported to sarpd (its stats/metrics); 0: never
    # holders (protocol 2): (worker, tier) holds a block, in a namespace shared by the
    # fleet; False: protocol 1 (the first insert wins; a namespace per worker for
    # exactness)
    holders: bool = True


class Stopped(Exception):
    """The bridge was asked to stop while waiting for sarpd."""


class VllmBridge:
    def __init__(self, cfg: BridgeConfig, stats: BridgeStats | None = None) -> None:
        self.cfg = cfg
        self.stats = stats or BridgeStats()
        self.state = StateFile(cfg.state, cfg.endpoint, cfg.worker, cfg.save_interval_s)
        pos, ns_of = self.state.load()
        self.translator = Translator(
            cfg.worker, cfg.ns, cfg.group, known=pos.namespaces, ns_of=ns_of,
            block_size=cfg.block_size, holders=cfg.holders,
        )  # fmt: skip
        self.stream = Stream(pos.last_seq)  # the newest batch taken, the last replay's
        self.applied: int | None = pos.last_seq  # newest batch acknowledged in full
        self._client: Client | None = None
        self._connected_once = False
        self._stop = asyncio.Event()
        self._ctx: zmq.asyncio.Context | None = None
        self._reported_at = float("-inf")
        self._report_every = cfg.report_interval_s  # 0 once sarpd refuses the op
        check_endpoint(cfg.endpoint, "--endpoint")
        if cfg.replay:
            check_endpoint(cfg.replay, "--replay")
        self.sarpd = SarpdWatch(cfg.socket, self.stats, cfg.warn_every_s)
        self.publisher = PublisherWatch(
            cfg.endpoint, cfg.topic, self.stats, grace_s=cfg.publisher_grace_s,
            repeat_s=cfg.warn_every_s, silence_s=cfg.silence_warn_s)

    def stop(self) -> None:
        self._stop.set()

    # ------------------------------------------------------------------ main loop

    async def run(self, on_ready: Callable[[], None] | None = None) -> None:
        """Run until `stop()`; then save the position and close everything."""
        self._ctx = zmq.asyncio.Context()
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, 1_000_000)
        sub.setsockopt(zmq.SUBSCRIBE, self.cfg.topic.encode())
        try:
            self.publisher.attach(sub)
            connect(sub, self.cfg.endpoint, "--endpoint")
            items: list[_Req | _Mark] = []
            if self.cfg.replay:
                await self._replay(self.stream.expected, items)
            await self._connected()
            await self._apply(items)
            if on_ready is not None:
                on_ready()
            while not self._stop.is_set():
                await self.publisher.poll()
                if not await sub.poll(100):
                    self.state.save(self.applied, self.translator.known)
                    await self._maybe_report()
                    if self._client is None:  # lost while idle: found by a report
                        await self._connected()
                    continue
                items = []
                self.publisher.heard()
                for frames in await self._drain(sub):
                    await self._accept(frames, items)
                await self._apply(items)
                self.state.save(self.applied, self.translator.known)
                await self._maybe_report()
        except Stopped:
            pass
        finally:
            self.state.save(self.applied, self.translator.known, force=True)
            if self.translator.trust_map:
                self.state.save_map(self.applied, self.translator.ns_of)
            self.publisher.close()
            sub.close(linger=0)
            if self._client is not None:
                await self._client.close()
            self._ctx.term()

    async def _drain(self, sub: zmq.asyncio.Socket) -> list[list[bytes]]:
        out: list[list[bytes]] = []
        while len(out) < self.cfg.max_batches:
            try:
                out.append(await sub.recv_multipart(flags=zmq.NOBLOCK))
            except zmq.Again:
                break
        return out

    # ---------------------------------------------------------------- sequencing

    async def _accept(self, frames: list[bytes], items: list[_Req | _Mark]) -> None:
        try:
            if len(frames) != 3:
                raise EventDecodeError(f"message: {len(frames)} frames, expected 3")
            seq = decode_seq(frames[1])
        except EventDecodeError as exc:
            log.warning("dropped a message: %s", exc)
            self.stats.drop("malformed")
            return
        stream, last = self.stream, self.stream.last
        verdict = stream.verdict(seq)  # sarpd.events.sequence: the rule
        if verdict == "duplicate":
            self.stats.duplicates += 1
            return
        if verdict == "restart":
            log.warning("sequence went back from %s to %d: engine restarted", last, seq)
            self.stats.restarts += 1
            items.extend(self._event_reqs("cleared", self.translator.clear_all()))
            stream.restarted()
            if self.cfg.replay:
                await self._replay(0, items)
        elif verdict == "gap":
            self.stats.gaps += 1
            log.info("sequence gap: %d after %s", seq, "the start" if last is None else last)
            if self.cfg.replay:
                await self._replay(stream.expected, items)
        if stream.seen(seq):  # the replay brought it
            self.stats.duplicates += 1
            return
        self._take(seq, frames[2], items)

    def _take(self, seq: int, payload: bytes, items: list[_Req | _Mark]) -> None:
        expected = self.stream.expected
        lost = self.stream.taken(seq)
        if lost:  # the engine counts from 0: before seq, nothing was taken
            reason = "unreplayed" if self.cfg.replay else "no_replay"
            log.warning("lost batches %d..%d (%s)", expected, seq - 1, reason)
            self.stats.drop(reason, lost)
        try:
            batch = decode_batch(payload)
        except EventDecodeError as exc:
            log.warning("dropped batch %d: %s", seq, exc)
            self.stats.drop("undecodable")
            items.append(_Mark(seq, time.time()))
            return
        for tr in self.translator.translate(batch):
            self.stats.lookahead += tr.lookahead
            if tr.reason:
                self.stats.ignore(tr.reason)
            elif not tr.ops:
                self.stats.events[tr.kind] += 1
            if tr.alternatives:
                items.append(_Req(tr.kind, tr.ops[0], alternatives=tr.alternatives))
            else:
                items.extend(self._event_reqs(tr.kind, tr.ops))
        items.append(_Mark(seq, batch.ts))

    @staticmethod
    def _event_reqs(kind: str, ops: tuple[Op, ...]) -> list[_Req | _Mark]:
        return [_Req(kind if i == 0 else None, op) for i, op in enumerate(ops)]

    async def _replay(self, start: int, items: list[_Req | _Mark]) -> None:
        """Ask the engine's replay socket for every batch from `start` on (either
        framing, module doc); a reply of neither framing is counted and skipped."""
        assert self._ctx is not None and self.cfg.replay
        self.stats.replays += 1
        dealer = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        connect(dealer, self.cfg.replay, "--replay")
        timeout_ms = int(self.cfg.replay_timeout_s * 1000)
        first: int | None = None
        try:
            await dealer.send_multipart([b"", start.to_bytes(8, "big")])
            while True:
                if not await dealer.poll(timeout_ms):
                    self.stats.replay_failures += 1
                    log.warning("replay endpoint %s: no answer in %.1f s to a replay from "
                                "%d (is it the engine's replay_endpoint?); what it does not "
                                "return counts as dropped", self.cfg.replay, timeout_ms / 1e3,
                                start)  # fmt: skip
                    break
                frames = await dealer.recv_multipart()
                self.publisher.heard()
                try:
                    reply = decode_replay(frames)
                except EventDecodeError as exc:
                    self.stats.replay_malformed += 1
                    log.warning("replay: skipped a reply: %s", exc)
                    continue
                if reply.end:
                    break
                if self.stream.seen(reply.seq):
                    continue
                first = reply.seq if first is None else first
                self._take(reply.seq, reply.payload, items)
        finally:
            dealer.close(linger=0)
        self.stream.replay_done(first)

    # ------------------------------------------------------------------ applying

    async def _apply(self, items: list[_Req | _Mark]) -> None:
        """Send every request in order (chained stores coalesced, `coalesce`); re-send
        from the first retryable failure."""
        items = coalesce(items)
        i, backoff = 0, 0.02
        while i < len(items):
            end = self._window_end(items, i)
            self._resolve_guesses(items, i, end)
            chunk = items[i:end]
            client = await self._connected()
            futs = [
                asyncio.ensure_future(self._send(client, it.op)) if isinstance(it.op, CanaryOp)
                else client.submit(*request_of(it.op))
                for it in chunk
                if isinstance(it, _Req)
            ]  # fmt: skip
            with contextlib.suppress(*RETRYABLE):  # gone: every future carries its error
                await client.flush()
            results = await client.outcomes(futs)
            failed = self._settle(chunk, results)
            if failed is None:
                i += len(chunk)
                backoff = 0.02
                continue
            k, reroute = failed
            self.stats.retries += sum(isinstance(it, _Req) for it in chunk[k + 1 :])
            i += k
            if reroute is not None:  # instead: the same insert in another namespace, the
                items[i : i + 1] = reroute  # rest of a coalesced one, or its stores
                continue
            self.stats.retries += 1
            error = next(r for r in results if isinstance(r, RETRYABLE))
            self._note_busy(error)
            if isinstance(error, Busy):
                level = logging.WARNING if backoff >= self.cfg.max_backoff_s else logging.INFO
                log.log(level, "sarpd: %s; retrying in %.2f s", error, backoff)
            else:
                self.sarpd.failed(f"{error} (sarpd at {self.cfg.socket})",
                                 self.cfg.max_connect_backoff_s)
                await self._disconnect()
            await self._sleep(backoff)
            backoff = min(backoff * 2, self.cfg.max_backoff_s)

    def _window_end(self, items: list[_Req | _Mark], i: int) -> int:
        """End of the window of requests in flight from `i`: at most max_inflight, and
        never past a request that changes the presence of a block that an insert
        earlier in the window names as parent. After a failure the window is re-sent
        from the failed request on, over a state where its later requests may have
        been applied: this keeps each re-sent insert's parent as it was the first
        time (a re-applied suffix otherwise turns a store into `unknown_parent`)."""
        end = min(len(items), i + self.cfg.max_inflight)
        parents: set[int] = set()
        for j in range(i, end):
            it = items[j]
            if isinstance(it, _Mark):
                continue
            op = it.op
            if parents and (
                isinstance(op, ClearOp)
                or (isinstance(op, RemoveOp) and not parents.isdisjoint(op.ids))
                or (isinstance(op, InsertOp) and not parents.isdisjoint(op.hashes))
            ):
                return j
            if isinstance(op, InsertOp) and op.parent is not None:
                parents.add(op.parent)
                at = 0  # a coalesced insert: its stores' parents inside it too
                for n in it.parts[:-1]:
                    at += n
                    parents.add(op.hashes[at - 1])
        return end

    def _resolve_guesses(self, items: list[_Req | _Mark], i: int, end: int) -> None:
        """Inserts whose namespace was guessed (see `_reroute`) take the namespace
        learned since for their parent, if any, instead of failing first."""
        ns_of = self.translator.ns_of
        for j in range(i, end):
            it = items[j]
            if isinstance(it, _Req) and it.alternatives and isinstance(it.op, InsertOp):
                ns = ns_of.get(it.op.parent or 0)
                if ns is not None and ns != it.op.ns:
                    items[j] = _Req(it.kind, dc_replace(it.op, ns=ns), it.tried, ())

    def _settle(
        self, chunk: list[_Req | _Mark], results: list[Any]
    ) -> tuple[int, list[_Req] | None] | None:
        """Count results in order up to the first that must be re-sent: its index in
        `chunk`, with the request to send instead (None: the same, after a pause)."""
        it_results = iter(results)
        for k, it in enumerate(chunk):
            if isinstance(it, _Mark):
                self.applied = it.seq
                self.stats.last_seq = it.seq
                self.stats.lag_s = max(0.0, time.time() - it.ts)
                self.stats.batches += 1
                continue
            r = next(it_results)
            if isinstance(r, RETRYABLE):
                return k, None
            if isinstance(r, UnknownParent) and isinstance(it.op, InsertOp):
                if len(it.parts) > 1:  # the first store's parent: drop it, re-send the rest
                    _, rest = split_first(it)
                    self._count(dc_replace(it, parts=()), r)
                    return k, [rest]
                alt = self._reroute(it, it.op)
                if alt is not None:
                    return k, [alt]
            if isinstance(r, TooLarge) and len(it.parts) > 1:  # past a limit of sarpd's
                return k, split_all(it)  # that its stores may not be: send them one by one
            self._count(it, r)
            if isinstance(it.op, InsertOp) and it.tried and not isinstance(r, SarpError):
                self.translator.learn(it.op.ns, it.op.hashes)
        return None

    @staticmethod
    def _reroute(it: _Req, op: InsertOp) -> _Req | None:
        """After a restart of the bridge the parent of a continuation may live in a
        namespace the translator no longer remembers (a cache salt): try the others."""
        if not it.alternatives:
            return None
        ns, *rest = it.alternatives
        return _Req(it.kind, dc_replace(op, ns=ns), (*it.tried, op.ns), tuple(rest))

    def _count(self, it: _Req, r: Any) -> None:
        if isinstance(r, UnknownParent):
            self.stats.unknown_parent += 1
            op = it.op
            assert isinstance(op, InsertOp)
            log.debug("unknown parent %x in ns %r (tried %s)", op.parent or 0, op.ns, it.tried)
            return
        if isinstance(r, SarpError):
            self.stats.rejected += 1
            log.warning("sarpd refused %s: %s (%s)", type(it.op).__name__, r.message, r.code)
            return
        if isinstance(r, BaseException):
            raise r
        if isinstance(it.op, CanaryOp):
            self._check_agreement(it.op, r)
            return
        if it.kind is not None:
            self.stats.events[it.kind] += it.events
        if isinstance(it.op, InsertOp):
            self.stats.blocks_new += int(r.get("new_blocks", 0))
        else:
            self.stats.blocks_removed += int(r.get("removed", 0))

    def _check_agreement(self, op: CanaryOp, r: dict[str, Any]) -> None:
        held = r.get("holders") or []
        self.stats.hash_checks += 1
        if len(held) > 1:
            self.stats.hash_disagreements += 1
            others = [f"{m:#x}" for m, _ in held if m != op.engine_hash][:1]
            log.warning(
                "engines disagree on block hashes in namespace %r: the same first-block "
                "tokens hash to %#x here and %s on another worker; every engine sharing a "
                "namespace must hash alike (vLLM: the same prefix_caching_hash_algo and "
                "PYTHONHASHSEED), or its blocks are never found by the others",
                op.ns.removeprefix(CANARY_NS).lstrip("/"), op.engine_hash,
                others[0] if others else "?")

    @staticmethod
    async def _send(client: Client, op: CanaryOp) -> dict[str, Any]:
        """The hash-agreement check: one holder per engine hash of these tokens."""
        await client.insert(tokens=list(op.tokens), meta=op.engine_hash, ns=op.ns)
        return await client.match(tokens=list(op.tokens), ns=op.ns, holders=2)

    async def _connected(self) -> Client:
        """The connection to sarpd; while there is none, try again with backoff
        (`connect_backoff_s` doubling to `max_connect_backoff_s`), said loud and
        counted (`SarpdWatch`)."""
        backoff, cap = self.cfg.connect_backoff_s, self.cfg.max_connect_backoff_s
        while self._client is None:
            try:
                client = await Client.connect(self.cfg.socket, timeout=5.0)
            except SarpConnectionError as exc:
                self.sarpd.failed(str(exc), cap)
            else:
                try:
                    await client.ping()
                    if self.cfg.holders:
                        await self._speak_holders(client)
                    self._client = client
                    self.stats.reconnects += self._connected_once
                    self._connected_once = True
                    self.sarpd.connected()
                    self._reported_at = float("-inf")  # the counters, at once
                    break
                except ConfigError:
                    raise  # not a sarpd that is busy or starting: an operator's mistake
                except (*RETRYABLE, SarpError) as exc:
                    self._note_busy(exc)
                    self.sarpd.failed(f"sarpd at {self.cfg.socket} not ready: {exc}", cap)
                    await client.close()
            await self.publisher.poll()  # the other peer may be down too: say so
            await self._sleep(backoff)
            backoff = min(backoff * 2, cap)
        return self._client

    async def _speak_holders(self, client: Client) -> None:
        """Every connection asks for protocol 2; a sarpd without holders is refused
        (its first-insert-wins would attribute every shared block to one worker)."""
        hello = await client.hello(protocol=2)
        if not hello.get("holders"):
            await client.close()
            raise ConfigError(
                f"sarpd at {self.cfg.socket} answers protocol {hello.get('protocol', 1)} "
                "without holders: upgrade it, or run the bridge with --no-holders (and a "
                "namespace per worker, --ns '.../w{worker}')")

    def _note_busy(self, exc: BaseException) -> None:
        if isinstance(exc, Busy) or isinstance(exc.__cause__, Busy):
            self.stats.busy += 1

    async def _disconnect(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def _sleep(self, seconds: float) -> None:
        """Sleep, or raise Stopped as soon as stop() is called."""
        try:
            await asyncio.wait_for(self._stop.wait(), seconds)
        except TimeoutError:
            return
        raise Stopped

    async def _maybe_report(self) -> None:
        """Every report_interval_s, report the counters to sarpd (`report` op), so they
        show in its `stats` and metrics; a sarpd that does not know the op (or any
        failure) only costs this report."""
        every = self._report_every
        now = time.monotonic()
        if every <= 0 or self._client is None or now - self._reported_at < every:
            return
        self._reported_at = now
        try:
            await asyncio.wait_for(
                self._client.report(f"bridge-vllm-w{self.cfg.worker}", self.stats.flat()), 2.0)
        except UnknownOp:
            log.info("sarpd does not take `report`: counters stay in this process")
            self._report_every = 0.0
        except (SarpConnectionError, OSError) as exc:  # sarpd gone while the bridge idles
            self.sarpd.failed(f"{exc} (sarpd at {self.cfg.socket})",
                              self.cfg.max_connect_backoff_s)
            await self._disconnect()
        except (*RETRYABLE, SarpError, TimeoutError) as exc:
            log.debug("report to sarpd failed: %s", exc)


async def serve(
    cfg: BridgeConfig,
    report: Callable[[BridgeStats], None],
    interval_s: float = 10.0,
    metrics_port: int | None = None,
) -> BridgeStats:
    """Run a bridge until SIGTERM/SIGINT, calling `report` every `interval_s` and at
    the end; with `metrics_port`, also export the counters for Prometheus."""
    bridge = VllmBridge(cfg)
    if metrics_port is not None:
        serve_metrics(bridge.stats, metrics_port, cfg.worker)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, bridge.stop)

    async def reporter() -> None:
        while True:
            await asyncio.sleep(interval_s)
            bridge.sarpd.update()
            report(bridge.stats)

    task = asyncio.create_task(reporter())
    try:
        await bridge.run()
    finally:
        task.cancel()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
    report(bridge.stats)
    return bridge.stats
