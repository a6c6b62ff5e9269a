"""The bridge's counters (`BridgeStats`) and their Prometheus export.

Two counters have a breakdown by reason: ``events["ignored"]`` in `ignored_by`
(``group``, ``tier``, ``remote``, ``partial``, ``block_size``, ``unanchored``,
``empty``, ``unknown_event``: `sarpd.events.mapping`) and `dropped` in `dropped_by`:

- ``unreplayed``: batches missing from the sequence (a gap, or batches the engine
  sent before the bridge first started) that the replay socket did not return: its
  buffer had moved on, or it did not answer (`replay_failures`);
- ``no_replay``: the same without a replay socket;
- ``undecodable``: a payload that is not an EventBatch;
- ``malformed``: a PUB message of another frame count or sequence frame.

Replay replies that are neither framing are counted in `replay_malformed`; the
batches they carried count as ``unreplayed`` once the sequence shows them missing.
The reachability of sarpd and of the publisher (``sarpd_*``, ``publisher_*``) is kept
by `sarpd.bridge.peers`; the status line ends in ``SARPD UNREACHABLE for N s`` /
``PUBLISHER UNREACHABLE for N s`` while one is down.

The position file and the namespace map are in `sarpd.bridge.state`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any


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
    dropped: int = 0  # batches lost, by reason in dropped_by (module doc)
    gaps: int = 0
    replays: int = 0
    replay_failures: int = 0  # replays not answered in time (their batches: dropped)
    replay_malformed: int = 0  # replay replies of neither framing (skipped)
    restarts: int = 0  # engine restarts (sequence went backwards)
    duplicates: int = 0
    busy: int = 0  # answers `busy` from sarpd (backed off)
    retries: int = 0  # requests re-sent after busy / unavailable / a lost connection
    reconnects: int = 0  # connections to sarpd after the first one
    sarpd_unreachable: int = 0  # outages of sarpd (a connection failed; warned)
    sarpd_connect_failures: int = 0  # failed attempts to connect to sarpd
    publisher_unreachable: int = 0  # outages of the publisher past the grace (warned)
    publisher_reconnects: int = 0  # ZMQ connections to the publisher after the first
    lookahead: int = 0  # stores whose hashes cover tokens past their blocks (seen)
    hash_checks: int = 0  # first blocks checked against other engines' hashes
    hash_disagreements: int = 0  # ... that another engine hashed differently (logged)
    last_seq: int = -1
    lag_s: float = 0.0  # now - engine timestamp of the newest applied batch
    sarpd_down_s: float = 0.0  # seconds sarpd has been unreachable (0: connected)
    publisher_down_s: float = 0.0  # seconds without a ZMQ connection to the publisher
    publisher_silent_s: float = 0.0  # seconds since the publisher's last message
    ignored_by: dict[str, int] = field(default_factory=dict)  # events["ignored"] by reason
    dropped_by: dict[str, int] = field(default_factory=dict)  # dropped by reason

    def ignore(self, reason: str) -> None:
        self.events["ignored"] += 1
        self.ignored_by[reason] = self.ignored_by.get(reason, 0) + 1

    def drop(self, reason: str, batches: int = 1) -> None:
        self.dropped += batches
        self.dropped_by[reason] = self.dropped_by.get(reason, 0) + batches

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def flat(self) -> dict[str, float]:
        """Every counter and gauge as one flat name -> number map (`events_<type>`),
        the form of sarpd's `report` op."""
        out: dict[str, float] = {f"events_{k}": v for k, v in self.events.items()}
        out.update({f"ignored_{k}": v for k, v in self.ignored_by.items()})
        out.update({f"dropped_{k}": v for k, v in self.dropped_by.items()})
        for k, v in asdict(self).items():
            if k not in ("events", "ignored_by", "dropped_by"):
                out[k] = v
        return out

    def line(self) -> str:
        e = self.events
        return (
            f"seq {self.last_seq}: events stored {e['stored']} removed {e['removed']} "
            f"cleared {e['cleared']} ignored {e['ignored']}; blocks +{self.blocks_new} "
            f"-{self.blocks_removed}; unknown_parent {self.unknown_parent}, dropped "
            f"{self.dropped}, gaps {self.gaps}, replays {self.replays}, restarts "
            f"{self.restarts}, busy {self.busy}, retries {self.retries}, lag {self.lag_s:.3f} s, "
            f"hash disagreements {self.hash_disagreements} of {self.hash_checks}"
            f"{_reasons('ignored', self.ignored_by)}{_reasons('dropped', self.dropped_by)}"
            f"{self._down()}"
        )

    def _down(self) -> str:
        """The peers that are down now, loud: the line is otherwise all zeros then."""
        out = ""
        if self.sarpd_down_s:
            out += f"; SARPD UNREACHABLE for {self.sarpd_down_s:.0f} s"
        if self.publisher_down_s:
            out += f"; PUBLISHER UNREACHABLE for {self.publisher_down_s:.0f} s"
        return out


COUNTERS = (
    "batches", "blocks_new", "blocks_removed", "unknown_parent", "rejected", "dropped",
    "gaps", "replays", "replay_failures", "replay_malformed", "restarts", "duplicates",
    "busy", "retries", "reconnects", "sarpd_unreachable", "sarpd_connect_failures",
    "publisher_unreachable", "publisher_reconnects", "lookahead", "hash_checks",
    "hash_disagreements",
)  # fmt: skip
GAUGES = {
    "last_seq": "newest applied sequence number",
    "lag_s": "seconds behind the engine",
    "sarpd_down_s": "seconds sarpd has been unreachable (0: connected)",
    "publisher_down_s": "seconds without a ZMQ connection to the publisher (0: connected)",
    "publisher_silent_s": "seconds since the publisher's last message",
}


def _reasons(name: str, by: dict[str, int]) -> str:
    return f"; {name} " + ", ".join(f"{k} {v}" for k, v in sorted(by.items())) if by else ""


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
            for name, by, help_ in (
                ("ignored", stats.ignored_by, "events ignored, by reason"),
                ("dropped_reason", stats.dropped_by, "batches lost, by reason"),
            ):
                fam = CounterMetricFamily(f"sarp_bridge_{name}", help_,
                                          labels=["worker", "reason"])  # fmt: skip
                for reason, n in sorted(by.items()):
                    fam.add_metric([labels["worker"], reason], n)
                yield fam
            for name in COUNTERS:
                c = CounterMetricFamily(f"sarp_bridge_{name}", name.replace("_", " "),
                                        labels=["worker"])  # fmt: skip
                c.add_metric([labels["worker"]], getattr(stats, name))
                yield c
            for name, help_ in GAUGES.items():
                g = GaugeMetricFamily(f"sarp_bridge_{name}", help_, labels=["worker"])
                g.add_metric([labels["worker"]], getattr(stats, name))
                yield g

    REGISTRY.register(_Collector())
    start_http_server(port)
