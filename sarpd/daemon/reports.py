"""Counters that sarpd's own clients report about themselves (the `report` op).

A feeder such as `sarpctl bridge vllm` runs in its own process; it reports its
counters (events applied by type, dropped, gaps, replays, lag, ...) to the sarpd it
feeds, so that they appear in sarpd's `stats` and Prometheus metrics next to the
index's own. The request (`sarpd.model.Report`) is validated by
`sarpd.protocol.requests`; this is the bounded store of the newest report per source:
the service calls `record` from its worker thread, the metrics exporter reads
`snapshot` from its own thread (one lock).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from sarpd.errors import TooLarge
from sarpd.model import Report

MAX_SOURCES = 256  # distinct reporting sources kept (a new one past it: too_large)


class Reports:
    """The newest report of each source, bounded to MAX_SOURCES."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._latest: dict[str, tuple[dict[str, float], float]] = {}

    def record(self, r: Report) -> None:
        with self._lock:
            if r.source not in self._latest and len(self._latest) >= MAX_SOURCES:
                raise TooLarge(f"source: {len(self._latest)} reporting sources already "
                               f"(the limit is {MAX_SOURCES})")
            self._latest[r.source] = (dict(r.counters), self._clock())

    def snapshot(self) -> dict[str, dict[str, float]]:
        """source -> its counters plus `age_s` (seconds since it reported)."""
        now = self._clock()
        with self._lock:
            return {src: {**c, "age_s": round(now - at, 3)}
                    for src, (c, at) in sorted(self._latest.items())}
