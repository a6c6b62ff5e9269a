"""Counters that sarpd's own clients report about themselves (the `report` op).

A feeder such as `sarpctl bridge vllm` runs in its own process; it reports its
counters (events applied by type, dropped, gaps, replays, lag, ...) to the sarpd it
feeds, so that they appear in sarpd's `stats` and Prometheus metrics next to the
index's own. Sans-I/O: validation of a report's fields and a bounded store; the
server calls `record` from its worker thread, the metrics exporter reads `snapshot`
from its own thread (one lock).
"""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sarpd.errors import BadRequest, TooLarge
from sarpd.model import Request

MAX_SOURCES = 256  # distinct reporting sources kept (a new one past it: too_large)
MAX_COUNTERS = 64  # counters per report
MAX_SOURCE_BYTES = 128
_NAME = re.compile(r"[a-z][a-z0-9_]{0,63}\Z")  # also a valid Prometheus label value


@dataclass(frozen=True, slots=True, eq=False)
class Report(Request):
    """Extension op ``report``: a client's own counters, replacing its previous ones."""

    source: str
    counters: Mapping[str, float]


def parse_report(rid: int, d: Mapping[str, Any]) -> Report:
    """Validate the fields of a ``report`` request (errors name the field and limit)."""
    source = d.get("source")
    if type(source) is not str or not source:
        raise BadRequest("source: expected a non-empty str")
    if len(source.encode()) > MAX_SOURCE_BYTES:
        raise TooLarge(f"source: {len(source.encode())} bytes exceeds {MAX_SOURCE_BYTES}")
    counters = d.get("counters")
    if not isinstance(counters, Mapping):
        raise BadRequest("counters: expected a map of name -> number")
    if len(counters) > MAX_COUNTERS:
        raise TooLarge(f"counters: {len(counters)} entries exceeds {MAX_COUNTERS}")
    out: dict[str, float] = {}
    for name, value in counters.items():
        if type(name) is not str or not _NAME.match(name):
            raise BadRequest(f"counters: name {name!r:.80} is not [a-z][a-z0-9_]{{0,63}}")
        if not ((type(value) is int and -(2**63) <= value < 2**64)
                or (type(value) is float and math.isfinite(value))):
            raise BadRequest(f"counters.{name}: expected a finite number (an int within "
                             f"64 bits or a float), got {value!r:.80}")
        out[name] = float(value)
    return Report(rid, source, out)


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
