"""The bridge's counters (`BridgeStats`) and their Prometheus export.

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
