"""The bridge's counters and its position file.

Position file (JSON, replaced atomically: write ``<path>.tmp``, fsync, rename, fsync
the directory)::

    {"format": 1, "endpoint": "tcp://...", "worker": 3,
     "last_seq": 41207,              # newest batch whose every request sarpd acknowledged
     "namespaces": ["", "lora=sql"]} # every namespace this worker's blocks went to

Invariant: ``last_seq`` never passes a batch that sarpd has not acknowledged in full,
so a restarted bridge asks the engine to replay from ``last_seq + 1`` and loses
nothing. The file is rewritten after every round of requests (atomic rename) and
fsync'd at most every `save_interval_s`, so after a crash of the bridge process it
is exact, and after a crash of the machine it may lag by that interval: those
events are applied again, which is harmless except that a store whose parent was
evicted within that interval is then refused as `unknown_parent` (a block missing
from the index, never one that is not in the engine).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from sarpd.errors import BadRequest

STATE_FORMAT = 1


@dataclass(slots=True)
class BridgeStats:
    """Counters (monotonic) and gauges of one bridge."""

    events: dict[str, int] = field(
        default_factory=lambda: {"stored": 0, "removed": 0, "cleared": 0, "ignored": 0}
    )
    batches: int = 0
    blocks_new: int = 0  # blocks sarpd had not indexed before
    blocks_removed: int = 0
    unknown_parent: int = 0  # stores whose parent sarpd does not hold (dropped)
    rejected: int = 0  # requests sarpd refused for another reason (logged)
    dropped: int = 0  # batches lost: gaps the replay could not fill, undecodable payloads
    gaps: int = 0
    replays: int = 0
    replay_failures: int = 0
    restarts: int = 0  # engine restarts (sequence went backwards)
    duplicates: int = 0
    busy: int = 0  # answers `busy` from sarpd (backed off)
    retries: int = 0  # requests re-sent after busy / unavailable / a lost connection
    reconnects: int = 0  # connections to sarpd after the first one
    last_seq: int = -1
    lag_s: float = 0.0  # now - engine timestamp of the newest applied batch

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def flat(self) -> dict[str, float]:
        """Every counter and gauge as one flat name -> number map (`events_<type>`),
        the form of sarpd's `report` op."""
        out: dict[str, float] = {f"events_{k}": v for k, v in self.events.items()}
        for k, v in asdict(self).items():
            if k != "events":
                out[k] = v
        return out

    def line(self) -> str:
        e = self.events
        return (
            f"seq {self.last_seq}: events stored {e['stored']} removed {e['removed']} "
            f"cleared {e['cleared']} ignored {e['ignored']}; blocks +{self.blocks_new} "
            f"-{self.blocks_removed}; unknown_parent {self.unknown_parent}, dropped "
            f"{self.dropped}, gaps {self.gaps}, replays {self.replays}, restarts "
            f"{self.restarts}, busy {self.busy}, retries {self.retries}, lag {self.lag_s:.3f} s"
        )


@dataclass(frozen=True, slots=True)
class Position:
    last_seq: int | None
    namespaces: tuple[str, ...]


def load_position(path: Path | None, endpoint: str, worker: int) -> Position:
    """The saved position, or an empty one (no file, or another endpoint/worker)."""
    if path is None or not path.exists():
        return Position(None, ())
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BadRequest(f"state file {path}: unreadable ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("format") != STATE_FORMAT:
        raise BadRequest(f"state file {path}: format {doc.get('format')!r}, expected 1")
    if doc.get("endpoint") != endpoint or doc.get("worker") != worker:
        return Position(None, ())
    last = doc.get("last_seq")
    ns = doc.get("namespaces") or []
    if (last is not None and type(last) is not int) or not all(isinstance(n, str) for n in ns):
        raise BadRequest(f"state file {path}: last_seq or namespaces malformed")
    return Position(last, tuple(ns))


def save_position(
    path: Path,
    endpoint: str,
    worker: int,
    last_seq: int | None,
    namespaces: Iterable[str],
    durable: bool = True,
) -> None:
    """Replace the position file atomically; `durable`: also fsync (a machine crash
    keeps it), else only a crash of the process is covered."""
    doc = {
        "format": STATE_FORMAT,
        "endpoint": endpoint,
        "worker": worker,
        "last_seq": last_seq,
        "namespaces": sorted(namespaces),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f)
        f.flush()
        if durable:
            os.fsync(f.fileno())
    os.replace(tmp, path)
    if not durable:
        return
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def nsmap_path(state: Path) -> Path:
    return state.with_name(state.name + ".nsmap")


def save_nsmap(state: Path, last_seq: int | None, ns_of: dict[int, str]) -> None:
    """At a clean stop: the translator's hash -> namespace map, valid for exactly
    this position (msgpack ``{"format", "last_seq", "ns": [names], "map": [[hash,
    index into ns], ...]}``), so a restart need not guess (`sarpd.bridge.mapping`)."""
    names = sorted(set(ns_of.values()))
    index = {n: i for i, n in enumerate(names)}
    doc = {"format": STATE_FORMAT, "last_seq": last_seq, "ns": names,
           "map": [[h, index[n]] for h, n in ns_of.items()]}  # fmt: skip
    tmp = nsmap_path(state).with_name(nsmap_path(state).name + ".tmp")
    tmp.write_bytes(msgpack.packb(doc))
    os.replace(tmp, nsmap_path(state))


def load_nsmap(state: Path | None, last_seq: int | None) -> dict[int, str] | None:
    """The map saved at a clean stop at `last_seq`; None if there is none for it."""
    if state is None or last_seq is None or not nsmap_path(state).exists():
        return None
    try:
        doc = msgpack.unpackb(nsmap_path(state).read_bytes(), strict_map_key=False)
        if doc.get("format") != STATE_FORMAT or doc.get("last_seq") != last_seq:
            return None
        names = doc["ns"]
        return {int(h): str(names[i]) for h, i in doc["map"]}
    except (OSError, ValueError, KeyError, IndexError, TypeError, msgpack.UnpackException):
        return None  # a damaged map is only a lost optimisation: guess instead


def serve_metrics(stats: BridgeStats, port: int, worker: int) -> None:
    """Export `stats` on http://0.0.0.0:port/metrics (prometheus_client, own thread)."""
    from prometheus_client import start_http_server
    from prometheus_client.core import REGISTRY, CounterMetricFamily, GaugeMetricFamily
    from prometheus_client.registry import Collector

    labels = {"worker": str(worker)}

    class _Collector(Collector):
        def collect(self) -> Iterable[Any]:
            ev = CounterMetricFamily(
                "sarp_bridge_events", "vLLM events applied, by type", labels=["worker", "type"]
            )
            for kind, n in stats.events.items():
                ev.add_metric([labels["worker"], kind], n)
            yield ev
            for name in (
                "batches", "blocks_new", "blocks_removed", "unknown_parent", "rejected",
                "dropped", "gaps", "replays", "replay_failures", "restarts", "duplicates",
                "busy", "retries", "reconnects",
            ):  # fmt: skip
                c = CounterMetricFamily(f"sarp_bridge_{name}", name.replace("_", " "),
                                        labels=["worker"])  # fmt: skip
                c.add_metric([labels["worker"]], getattr(stats, name))
                yield c
            for name, help_ in (("last_seq", "newest applied sequence number"),
                                ("lag_s", "seconds behind the engine")):  # fmt: skip
                g = GaugeMetricFamily(f"sarp_bridge_{name}", help_, labels=["worker"])
                g.add_metric([labels["worker"]], getattr(stats, name))
                yield g

    REGISTRY.register(_Collector())
    start_http_server(port)
