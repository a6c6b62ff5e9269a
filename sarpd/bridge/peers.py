"""The bridge's two peers, the engine's publisher and sarpd: endpoint syntax, and
whether each is reachable, said loud and counted.

- `connect`: an endpoint the bridge connects to is checked first
  (`sarpd.events.endpoints.check_endpoint`), so that a typo is an error that names
  the option and the value, not a ZMQ traceback or a silent retry loop.
- `Outage`: when to warn about a peer that stays down (sans-I/O): at the first
  failure (after a grace period, for the publisher), then at most every `repeat_s`
  while it stays down; its recovery is said once.
- `SarpdWatch`: sarpd's reachability (connect attempts, lost connections) as log
  lines and the counters `sarpd_unreachable` (outages), `sarpd_connect_failures`,
  `sarpd_down_s`.
- `PublisherWatch`: a ZMQ SUB ``connect`` never fails, it retries in the background;
  the SUB socket's monitor tells whether a ZMQ peer is connected (a handshake) or
  not (refused, unresolvable, disconnected, not ZMQ). Counted as
  `publisher_unreachable` (outages past the grace), `publisher_down_s`,
  `publisher_reconnects`; and `publisher_silent_s`, the seconds since the last
  message (PUB or replay): connected but silent past `silence_s` is said once per
  silence (an idle engine publishes nothing; a wrong ``--topic`` looks the same).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from sarpd.bridge.stats import BridgeStats
from sarpd.errors import ConfigError
from sarpd.events.endpoints import check_endpoint

log = logging.getLogger("sarpd.bridge")
_UP = zmq.EVENT_HANDSHAKE_SUCCEEDED
_DOWN = (
    zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)  # fmt: skip


def connect(sock: zmq.Socket[Any], endpoint: str, option: str) -> None:
    """`sock.connect`, its refusal a ConfigError naming the option."""
    check_endpoint(endpoint, option)
    try:
        sock.connect(endpoint)
    except zmq.ZMQError as exc:
        raise ConfigError(f"{option} {endpoint[:80]!r}: ZMQ refuses it ({exc.strerror})") from exc


@dataclass(slots=True)
class Outage:
    """When to speak about one peer's outage (module doc)."""

    repeat_s: float = 30.0
    grace_s: float = 0.0  # down this long before the first warning
    since: float | None = None  # start of the current outage
    warned_at: float | None = None  # last warning about it
    count: int = 0  # outages that lasted past the grace
    failures: int = 0  # failed attempts, all outages

    def begin(self, now: float) -> None:
        if self.since is None:
            self.since = now

    def fail(self, now: float) -> bool:
        """One failed attempt; True: warn now."""
        self.failures += 1
        self.begin(now)
        return self.due(now)

    def due(self, now: float) -> bool:
        """True when a warning is due: the first past the grace, then every repeat_s."""
        if self.since is None or now - self.since < self.grace_s:
            return False
        if self.warned_at is None:
            self.count += 1
        elif now - self.warned_at < self.repeat_s:
            return False
        self.warned_at = now
        return True

    def recover(self, now: float) -> tuple[float, bool] | None:
        """The peer answers again: (seconds it was down, whether that was warned), or
        None when it was not down."""
        if self.since is None:
            return None
        out = (now - self.since, self.warned_at is not None)
        self.since = self.warned_at = None
        return out

    def down_s(self, now: float) -> float:
        return 0.0 if self.since is None else now - self.since


class SarpdWatch:
    """sarpd's reachability: warnings and counters (module doc)."""

    def __init__(self, socket: str, stats: BridgeStats, repeat_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.socket = socket
        self.stats = stats
        self.outage = Outage(repeat_s)
        self._clock = clock

    def failed(self, reason: str, retry_s: float) -> None:
        now = self._clock()
        o = self.outage
        first = o.since is None
        if o.fail(now):
            if first:
                log.warning("sarpd unreachable: %s; retrying (at least every %.0f s); "
                            "events wait in the publisher's queue and replay buffer",
                            reason, retry_s)
            else:
                log.warning("sarpd still unreachable after %.0f s (%d attempts): %s",
                            o.down_s(now), o.failures, reason)
        else:
            log.info("sarpd: %s; retrying", reason)
        self.update(now)

    def connected(self) -> None:
        now = self._clock()
        back = self.outage.recover(now)
        if back is not None:  # said at the level its outage was said
            down, warned = back
            log.log(logging.WARNING if warned else logging.INFO,
                    "sarpd at %s connected, after %.1f s unreachable", self.socket, down)
        self.update(now)

    def update(self, now: float | None = None) -> None:
        """The counters and the gauge of the outage (now)."""
        now = self._clock() if now is None else now
        o, st = self.outage, self.stats
        st.sarpd_unreachable, st.sarpd_connect_failures = o.count, o.failures
        st.sarpd_down_s = round(o.down_s(now), 3)


class PublisherWatch:
    """The publisher's reachability (the SUB socket's monitor) and silence."""

    def __init__(self, endpoint: str, topic: str, stats: BridgeStats, *, grace_s: float,
                 repeat_s: float, silence_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:  # fmt: skip
        self.endpoint, self.topic, self.stats = endpoint, topic, stats
        self.outage = Outage(repeat_s, grace_s)
        self.silence_s = silence_s
        self._clock = clock
        self._heard_at = clock()
        self._silence_said = False
        self._handshakes = 0
        self._mon: zmq.asyncio.Socket | None = None
        self._sub: zmq.asyncio.Socket | None = None
        self.outage.begin(self._heard_at)  # not connected until a handshake says so

    def attach(self, sub: zmq.asyncio.Socket) -> None:
        """Watch `sub` (before its connect: no event is missed)."""
        self._sub = sub
        self._mon = sub.get_monitor_socket(_UP | _DOWN)

    def heard(self) -> None:
        """A message from the engine (PUB or replay)."""
        self._heard_at = self._clock()
        if self._silence_said:
            log.warning("publisher at %s: messages again", self.endpoint)
            self._silence_said = False

    async def poll(self) -> None:
        """Take the monitor's events, warn when due, update the gauges."""
        while self._mon is not None:
            try:
                frames = await self._mon.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                break
            self._event(int(parse_monitor_message(frames)["event"]))
        now = self._clock()
        o = self.outage
        if o.due(now):
            log.warning(
                "publisher at %s unreachable for %.0f s: no ZMQ connection (is the engine "
                "running with KV events on, and is --endpoint its host and port?); the "
                "subscriber keeps retrying", self.endpoint, o.down_s(now))
        silent = now - self._heard_at
        if (self.silence_s > 0 and silent >= self.silence_s and o.since is None
                and not self._silence_said):  # fmt: skip
            self._silence_said = True
            log.warning("publisher at %s: connected, but no message for %.0f s (an idle "
                        "engine, or it publishes on another topic than %r?)",
                        self.endpoint, silent, self.topic)
        st = self.stats
        st.publisher_unreachable = o.count
        st.publisher_down_s = round(o.down_s(now), 3)
        st.publisher_silent_s = round(silent, 3)

    def _event(self, event: int) -> None:
        now = self._clock()
        if event & _UP:
            self._handshakes += 1
            self.stats.publisher_reconnects = max(0, self._handshakes - 1)
            back = self.outage.recover(now)
            if back is not None and back[1]:
                log.warning("publisher at %s connected after %.1f s", self.endpoint, back[0])
            else:
                log.info("publisher at %s connected", self.endpoint)
        elif event & _DOWN and self.outage.since is None:
            log.info("publisher at %s: connection lost, retrying", self.endpoint)
            self.outage.begin(now)

    def close(self) -> None:
        if self._mon is not None and self._sub is not None:
            self._sub.disable_monitor()
            self._mon.close(linger=0)
        self._mon = None
